// Copyright TileMaxSim authors. Searcher::Refresh on the CPU (tests/engine/refresh.h): one
// store and several, vectors in memory and on disk.
#include "tests/engine/refresh.h"

namespace tms {
namespace {

TEST(RefreshCpu, SearchesAsASearcherOpenedNow) {
    testing::ExpectRefreshSearchesAsOpened(Device::kCpu, VectorTier::kHost, 1);
}

TEST(RefreshCpu, SearchesAsASearcherOpenedNowShardedOnDisk) {
    testing::ExpectRefreshSearchesAsOpened(Device::kCpu, VectorTier::kDisk, 2);
}

}  // namespace
}  // namespace tms

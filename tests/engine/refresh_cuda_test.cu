// Copyright TileMaxSim authors. Searcher::Refresh on the GPU (tests/engine/refresh.h): the added
// documents placed beside the head shard on its GPU, in every vector tier.
#include "tests/engine/refresh.h"
#include "tests/kernels/cuda_test_util.h"

namespace tms {
namespace {

TEST(RefreshCuda, SearchesAsASearcherOpenedNow) {
    SKIP_WITHOUT_GPU();
    testing::ExpectRefreshSearchesAsOpened(Device::kGpu, VectorTier::kGpu, 1);
}

TEST(RefreshCuda, SearchesAsASearcherOpenedNowHostAndDiskTiers) {
    SKIP_WITHOUT_GPU();
    testing::ExpectRefreshSearchesAsOpened(Device::kGpu, VectorTier::kHost, 2);
    testing::ExpectRefreshSearchesAsOpened(Device::kGpu, VectorTier::kDisk, 1);
}

}  // namespace
}  // namespace tms

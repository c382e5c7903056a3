// Copyright TileMaxSim authors. Concurrent callers of a CPU Searcher.
#include "tests/engine/concurrent_search.h"

namespace tms {
namespace {

TEST(ConcurrentSearchCpu, SixteenThreadsMatchSerialCalls) { testing::ExpectConcurrentSearchesMatchSerial(Device::kCpu, 16); }

TEST(ConcurrentSearchCpu, ThreeShardsMatchSerialCalls) { testing::ExpectConcurrentSearchesMatchSerial(Device::kCpu, 8, 3); }

}  // namespace
}  // namespace tms

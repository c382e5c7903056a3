// Copyright TileMaxSim authors. Concurrent callers of a CPU Searcher.
#include "tests/engine/concurrent_search.h"

namespace tms {
namespace {

TEST(ConcurrentSearchCpu, SixteenThreadsMatchSerialCalls) {
    testing::ExpectConcurrentSearchesMatchSerial(Device::kCpu, 16);
}

TEST(ConcurrentSearchCpu, ThreeShardsMatchSerialCalls) {
    testing::ExpectConcurrentSearchesMatchSerial(Device::kCpu, 8, 3);
}

// Gathered: the calls of a shape and options share batches (those arriving while one runs, or
// also waiting up to 2 ms for each other), and every one still gets exactly its own results.
TEST(ConcurrentSearchCpu, GatheredCallsMatchSerialCalls) {
    testing::ExpectConcurrentSearchesMatchSerial(Device::kCpu, 16, 1, true);
    testing::ExpectConcurrentSearchesMatchSerial(Device::kCpu, 16, 1, true, 2000);
}

}  // namespace
}  // namespace tms

// Copyright TileMaxSim authors. Concurrent callers of a CPU Searcher.
#include "tests/engine/concurrent_search.h"

namespace tms {
namespace {

TEST(ConcurrentSearchCpu, SixteenThreadsMatchSerialCalls) { testing::ExpectConcurrentSearchesMatchSerial(Device::kCpu, 16); }

}  // namespace
}  // namespace tms

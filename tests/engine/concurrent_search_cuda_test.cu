// Copyright TileMaxSim authors. Concurrent callers of a GPU Searcher (the scorers' per-call
// state and scratch buffers are shared: without the searcher's lock this aborted with an
// illegal memory access).
#include "tests/engine/concurrent_search.h"
#include "tests/kernels/cuda_test_util.h"

namespace tms {
namespace {

TEST(ConcurrentSearchCuda, SixteenThreadsMatchSerialCalls) {
    SKIP_WITHOUT_GPU();
    testing::ExpectConcurrentSearchesMatchSerial(Device::kGpu, 16);
}

TEST(ConcurrentSearchCuda, FourThreadsMatchSerialCalls) {
    SKIP_WITHOUT_GPU();
    testing::ExpectConcurrentSearchesMatchSerial(Device::kGpu, 4);
}

TEST(ConcurrentSearchCuda, ThreeShardsOnOneGpuMatchSerialCalls) {
    SKIP_WITHOUT_GPU();
    testing::ExpectConcurrentSearchesMatchSerial(Device::kGpu, 16, 3);
}

}  // namespace
}  // namespace tms

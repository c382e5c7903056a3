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

// Gathered batches on the GPU: every caller gets exactly its own results. Here ncandidates
// exceeds the index's documents, so no pruning boundary can move with the centroid GEMM's
// rounding by batch shape; only a probe tied to its last bit could.
TEST(ConcurrentSearchCuda, GatheredCallsMatchSerialCalls) {
    SKIP_WITHOUT_GPU();
    testing::ExpectConcurrentSearchesMatchSerial(Device::kGpu, 16, 1, true);
    testing::ExpectConcurrentSearchesMatchSerial(Device::kGpu, 16, 3, true, 500);
}

}  // namespace
}  // namespace tms

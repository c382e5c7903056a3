// Copyright TileMaxSim authors. BM25 and hybrid search on the GPU, against the CPU searcher's
// (tests/engine/text_search.h).
#include "tests/engine/text_search.h"
#include "tests/kernels/cuda_test_util.h"

namespace tms {
namespace {

TEST(TextSearchCuda, ModesAgreeWithTheCpu) {
    SKIP_WITHOUT_GPU();
    testing::ExpectTextSearchAgrees(Device::kGpu);
}

}  // namespace
}  // namespace tms

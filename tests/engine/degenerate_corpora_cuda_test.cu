// Copyright TileMaxSim authors. Degenerate corpora built and searched on the GPU
// (tests/engine/degenerate_corpora.h).
#include "tests/engine/degenerate_corpora.h"
#include "tests/kernels/cuda_test_util.h"

namespace tms {
namespace {

TEST(SearchCuda, DegenerateCorporaAnswerEveryQuery) {
    SKIP_WITHOUT_GPU();
    testing::ExpectDegenerateCorporaAnswered(Device::kGpu);
}

}  // namespace
}  // namespace tms

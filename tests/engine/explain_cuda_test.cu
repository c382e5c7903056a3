// Copyright TileMaxSim authors. Searcher::Explain on the GPU (tests/engine/explain.h): vectors on the
// device are explained from the decoded codes, on the host or disk from the vectors.
#include "tests/engine/explain.h"
#include "tests/kernels/cuda_test_util.h"

namespace tms {
namespace {

TEST(ExplainCuda, SumsToTheScores) {
    SKIP_WITHOUT_GPU();
    testing::ExpectExplanationsSumToScores(Device::kGpu, VectorTier::kHost);
    testing::ExpectExplanationsSumToScores(Device::kGpu, VectorTier::kNone);
}

}  // namespace
}  // namespace tms

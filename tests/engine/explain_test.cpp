// Copyright TileMaxSim authors. Searcher::Explain on the CPU (tests/engine/explain.h).
#include "tests/engine/explain.h"

namespace tms {
namespace {

TEST(ExplainCpu, SumsToTheScores) {
    testing::ExpectExplanationsSumToScores(Device::kCpu, VectorTier::kHost);
    testing::ExpectExplanationsSumToScores(Device::kCpu, VectorTier::kDisk);
    testing::ExpectExplanationsSumToScores(Device::kCpu, VectorTier::kNone);
}

}  // namespace
}  // namespace tms

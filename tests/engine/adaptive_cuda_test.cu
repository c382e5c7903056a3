// Copyright TileMaxSim authors. The adaptive default search on the GPU (tests/engine/adaptive.h).
#include "tests/engine/adaptive.h"
#include "tests/kernels/cuda_test_util.h"

namespace tms {
namespace {

TEST(AdaptiveCuda, UnsettledQueriesGoDeeper) {
    SKIP_WITHOUT_GPU();
    testing::ExpectUnsettledQueriesGoDeeper(Device::kGpu);
}

}  // namespace
}  // namespace tms

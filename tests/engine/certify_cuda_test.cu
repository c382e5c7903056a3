// Copyright TileMaxSim authors. Per-query certification on the GPU (tests/engine/certify.h).
#include "tests/engine/certify.h"
#include "tests/kernels/cuda_test_util.h"

namespace tms {
namespace {

TEST(CertifyCuda, CertifiedQueriesHaveTheExhaustiveTopK) {
    SKIP_WITHOUT_GPU();
    testing::ExpectCertifiedQueriesExact(Device::kGpu);
}

}  // namespace
}  // namespace tms

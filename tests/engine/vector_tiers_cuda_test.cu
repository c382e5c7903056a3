// Copyright TileMaxSim authors. Vector tiers on the GPU: vectors in host memory or on disk, each
// search's rows copied to the device, give the results of vectors resident on the device
// (tests/engine/vector_tiers.h).
#include "tests/engine/vector_tiers.h"
#include "tests/kernels/cuda_test_util.h"

namespace tms {
namespace {

TEST(VectorTiersCuda, HostAndDiskGiveTheDevicesResults) {
    SKIP_WITHOUT_GPU();
    testing::ExpectTiersAgree(Device::kGpu, VectorTier::kGpu, {VectorTier::kHost, VectorTier::kDisk});
}

}  // namespace
}  // namespace tms

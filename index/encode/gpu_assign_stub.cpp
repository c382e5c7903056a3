// Copyright TileMaxSim authors. CPU-only builds: no GPU assignment.
#include "index/encode/gpu_assign.h"

namespace tms::index {

struct GpuAssigner::Impl {};
GpuAssigner::GpuAssigner() = default;
GpuAssigner::~GpuAssigner() = default;

Status GpuAssigner::Create(int, std::unique_ptr<GpuAssigner>*) {
    return Status::NotSupported("this build has no CUDA (rebuild with -DTMS_ENABLE_CUDA=ON)");
}
Status GpuAssigner::SetCentroids(const float*, int, int) { return Status::NotSupported("this build has no CUDA"); }
Status GpuAssigner::Assign(const float*, int64_t, uint32_t*, float*) {
    return Status::NotSupported("this build has no CUDA");
}
bool GpuAssigner::PinHost(const void*, size_t) { return false; }

struct GpuEncoder::Impl {};
GpuEncoder::GpuEncoder() = default;
GpuEncoder::~GpuEncoder() = default;
Status GpuEncoder::Create(const IndexModel&, int, std::unique_ptr<GpuEncoder>*) {
    return Status::NotSupported("this build has no CUDA (rebuild with -DTMS_ENABLE_CUDA=ON)");
}
Status GpuEncoder::Encode(const EmbeddingView&, int64_t, int64_t, uint32_t*, uint8_t*) {
    return Status::NotSupported("this build has no CUDA");
}

}  // namespace tms::index

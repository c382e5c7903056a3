// Copyright TileMaxSim authors. CPU-only builds: the GPU scorer reports that CUDA is absent.
#include "engine/gpu_scorer.h"

namespace tms::engine {

struct GpuExactScorer::Impl {};

Status GpuDeviceCount(int* n) {
    *n = 0;
    return Status::OK();
}

GpuExactScorer::~GpuExactScorer() = default;

Status GpuExactScorer::Create(std::shared_ptr<kernels::GpuContext>, const uint16_t*, int64_t, int, const int64_t*, int64_t,
                              std::unique_ptr<GpuExactScorer>*) {
    return Status::NotSupported("this build has no CUDA (rebuild with -DTMS_ENABLE_CUDA=ON)");
}

Status GpuExactScorer::ScoreTopK(const void*, DType, int, int, const int32_t*, const int64_t*, const int32_t*, int,
                                 std::vector<int32_t>*, std::vector<float>*) {
    return Status::NotSupported("this build has no CUDA");
}

Status GpuExactScorer::Score(const void*, DType, int, int, const int32_t*, const int64_t*, const int32_t*,
                             std::vector<float>*) {
    return Status::NotSupported("this build has no CUDA");
}

}  // namespace tms::engine

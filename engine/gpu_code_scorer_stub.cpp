// Copyright TileMaxSim authors. CPU-only builds: the GPU compressed scorer reports that CUDA is absent.
#include "engine/gpu_code_scorer.h"

namespace tms::engine {

struct GpuCodeScorer::Impl {};

GpuCodeScorer::~GpuCodeScorer() = default;

Status GpuCodeScorer::Create(std::shared_ptr<kernels::GpuContext>, const uint32_t*, const uint8_t*, int64_t, int, const float*, const float*, int, int,
                             const int64_t*, int64_t, std::unique_ptr<GpuCodeScorer>*) {
    return Status::NotSupported("this build has no CUDA (rebuild with -DTMS_ENABLE_CUDA=ON)");
}

Status GpuCodeScorer::Score(const float*, int, int, const int32_t*, const float*, const int64_t*, const int32_t*, bool,
                            std::vector<float>*) {
    return Status::NotSupported("this build has no CUDA");
}

Status GpuCodeScorer::Probe(const float*, int, int, int, std::vector<int32_t>*) {
    return Status::NotSupported("this build has no CUDA");
}

Status GpuCodeScorer::SetIvf(const int64_t*, const int32_t*) { return Status::NotSupported("this build has no CUDA"); }

Status GpuCodeScorer::Candidates(const void*, DType, int, int, const int32_t*, int, int, std::vector<int64_t>*,
                                 std::vector<int32_t>*) {
    return Status::NotSupported("this build has no CUDA");
}

Status GpuCodeScorer::ScoreCandidates(std::vector<float>*) { return Status::NotSupported("this build has no CUDA"); }

Status GpuCodeScorer::ScoreCandidatesTop(int, std::vector<int64_t>*, std::vector<int32_t>*, std::vector<float>*) {
    return Status::NotSupported("this build has no CUDA");
}

Status GpuCodeScorer::ScoreLast(const char*) { return Status::NotSupported("this build has no CUDA"); }

}  // namespace tms::engine

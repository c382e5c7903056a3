// Copyright TileMaxSim authors.
#include "kernels/cuda/upload.h"

#include <algorithm>

#include "kernels/cpu/parallel_copy.h"
#include "kernels/cuda/cuda_check.h"

namespace tms::kernels {

StagedUploader::~StagedUploader() {
    for (int i = 0; i < 2; ++i) {
        if (done_[i]) {
            cudaEventSynchronize(done_[i]);
            cudaEventDestroy(done_[i]);
        }
        if (pinned_[i]) cudaFreeHost(pinned_[i]);
    }
}

Status StagedUploader::Reserve() {
    for (int i = 0; i < 2; ++i) {
        if (!pinned_[i]) TMS_CUDA_RETURN_IF_ERROR(cudaMallocHost(&pinned_[i], stage_));
        if (!done_[i]) TMS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming));
    }
    return Status::OK();
}

Status StagedUploader::Upload(void* d_dst, const void* h_src, size_t bytes) {
    if (bytes == 0) return Status::OK();
    if (bytes < min_staged_) {
        TMS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_dst, h_src, bytes, cudaMemcpyHostToDevice, stream_));
        TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // the caller may free h_src
        return Status::OK();
    }
    TMS_RETURN_IF_ERROR(Reserve());
    int k = 0;
    for (size_t o = 0; o < bytes; o += stage_, k ^= 1) {
        const size_t n = std::min(stage_, bytes - o);
        TMS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(done_[k]));  // its previous DMA has drained
        if (team_copy_) {
            TeamMemcpy(pinned_[k], static_cast<const char*>(h_src) + o, n);
        } else {
            ParallelMemcpy(pinned_[k], static_cast<const char*>(h_src) + o, n);
        }
        TMS_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(static_cast<char*>(d_dst) + o, pinned_[k], n, cudaMemcpyHostToDevice, stream_));
        TMS_CUDA_RETURN_IF_ERROR(cudaEventRecord(done_[k], stream_));
    }
    return Status::OK();
}

Status MakeQueryUploader(cudaStream_t stream, std::unique_ptr<StagedUploader>* out) {
    auto up = std::make_unique<StagedUploader>(stream, size_t(1) << 20, size_t(1) << 20, /*team_copy=*/true);
    TMS_RETURN_IF_ERROR(up->Reserve());
    *out = std::move(up);
    return Status::OK();
}

}  // namespace tms::kernels

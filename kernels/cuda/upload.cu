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

Status StagedUploader::Upload(void* d_dst, const void* h_src, size_t bytes) {
    if (bytes == 0) return Status::OK();
    if (bytes < 2 * kStage) {
        TMS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_dst, h_src, bytes, cudaMemcpyHostToDevice, stream_));
        TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // the caller may free h_src
        return Status::OK();
    }
    for (int i = 0; i < 2; ++i) {
        if (!pinned_[i]) TMS_CUDA_RETURN_IF_ERROR(cudaMallocHost(&pinned_[i], kStage));
        if (!done_[i]) TMS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming));
    }
    int k = 0;
    for (size_t o = 0; o < bytes; o += kStage, k ^= 1) {
        const size_t n = std::min(kStage, bytes - o);
        TMS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(done_[k]));  // its previous DMA has drained
        ParallelMemcpy(pinned_[k], static_cast<const char*>(h_src) + o, n);
        TMS_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(static_cast<char*>(d_dst) + o, pinned_[k], n, cudaMemcpyHostToDevice, stream_));
        TMS_CUDA_RETURN_IF_ERROR(cudaEventRecord(done_[k], stream_));
    }
    return Status::OK();
}

}  // namespace tms::kernels

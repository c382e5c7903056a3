// Copyright TileMaxSim authors.
#include "kernels/cuda/gpu_context.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/maxsim_cuda.h"
#include "kernels/cuda/upload.h"

namespace tms::kernels {

Status GpuContext::Create(int device, std::shared_ptr<GpuContext>* out) {
    int n = 0;
    TMS_RETURN_IF_ERROR(cuda_device_count(&n));
    if (device < 0 || device >= n) {
        return Status::NotSupported("GPU " + std::to_string(device) + " is not present (" + std::to_string(n) +
                                    " visible)");
    }
    std::shared_ptr<GpuContext> c(new GpuContext());
    c->device_ = device;
    DeviceGuard g(device);
    if (!g.ok()) return Status::Internal("cannot select GPU " + std::to_string(device));
    TMS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&c->stream_, cudaStreamNonBlocking));
    TMS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&c->copy_stream_, cudaStreamNonBlocking));
    TMS_CUBLAS_RETURN_IF_ERROR(cublasCreate(&c->blas_));
    TMS_CUBLAS_RETURN_IF_ERROR(cublasSetStream(c->blas_, c->stream_));
    TMS_RETURN_IF_ERROR(MakeQueryUploader(c->stream_, &c->inputs_));
    *out = std::move(c);
    return Status::OK();
}

GpuContext::~GpuContext() {
    DeviceGuard g(device_);
    if (stream_) cudaStreamSynchronize(stream_);
    if (copy_stream_) cudaStreamSynchronize(copy_stream_);
    scratch_.clear();  // device buffers: freed with the device current
    inputs_.reset();
    if (blas_) cublasDestroy(blas_);
    if (stream_) cudaStreamDestroy(stream_);
    if (copy_stream_) cudaStreamDestroy(copy_stream_);
}

}  // namespace tms::kernels

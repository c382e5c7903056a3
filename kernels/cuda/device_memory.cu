// Copyright TileMaxSim authors.
#include "kernels/cuda/device_memory.h"

#include <cuda_runtime.h>

#include <string>

namespace tms::kernels {

Status cuda_memory_info(int device, int64_t* free_bytes, int64_t* total_bytes) {
    int prev = 0;
    if (cudaGetDevice(&prev) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
        (void)cudaGetLastError();
        return Status::NotSupported("GPU " + std::to_string(device) + ": cannot be selected");
    }
    size_t f = 0, t = 0;
    const cudaError_t e = cudaMemGetInfo(&f, &t);
    (void)cudaSetDevice(prev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return Status::Internal("GPU " + std::to_string(device) + ": cannot read its free memory");
    }
    *free_bytes = int64_t(f);
    if (total_bytes) *total_bytes = int64_t(t);
    return Status::OK();
}

}  // namespace tms::kernels

// Copyright TileMaxSim authors. Programmatic dependent launch (sm_90): a kernel launched with
// launch_pdl may start its CTAs while the previous kernel of the stream finishes; it calls
// grid_dependency_wait() before its first global-memory access (that kernel's writes are then
// visible) and trigger_dependents() to let the next such launch start early. Both are no-ops
// in a grid launched without the attribute, and on older GPUs.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/cuda_check.h"
#include "tilemaxsim/status.h"

namespace tms::kernels::pdl {

/// Blocks until the grids this one depends on have completed and their writes are visible.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// Lets the next grid of the stream (launched with launch_pdl) start its CTAs.
__device__ __forceinline__ void trigger_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// Launches kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream
/// serialization (the launch and CTA start overlap the end of the stream's previous kernel).
template <typename... Params, typename... Args>
Status launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    TMS_CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
    TMS_CUDA_CHECK_LAUNCH();
    return Status::OK();
}

}  // namespace tms::kernels::pdl

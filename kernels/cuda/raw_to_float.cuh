// Copyright TileMaxSim authors. Raw fp32 / fp16 / bf16 values -> fp32 on the device (device code;
// included by the index builder's GPU encoder and the GPU compressed scorer).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "tilemaxsim/types.h"

namespace tms::kernels {

/// out[i] = raw[i] as fp32 (dtype as tms::DType), grid-stride. When bad is not null, the index
/// of the first value that is not finite or beyond kMaxEmbeddingValue goes into *bad (atomicMin; the caller sets it to
/// ~0 first): the index build's input check, fused into its conversion.
__global__ inline void raw_to_float(const void* __restrict__ raw, int dtype, int64_t n, float* __restrict__ out,
                                    unsigned long long* __restrict__ bad) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v;
        if (dtype == static_cast<int>(DType::kF16)) {
            v = __half2float(static_cast<const __half*>(raw)[i]);
        } else if (dtype == static_cast<int>(DType::kBF16)) {
            v = __bfloat162float(static_cast<const __nv_bfloat16*>(raw)[i]);
        } else {
            v = static_cast<const float*>(raw)[i];
        }
        out[i] = v;
        if (bad != nullptr && !(fabsf(v) <= kMaxEmbeddingValue)) atomicMin(bad, static_cast<unsigned long long>(i));
    }
}

}  // namespace tms::kernels

// Copyright TileMaxSim authors. Encoding residuals on the GPU (index::GpuEncoder): PLAID residual
// buckets and PQ codes of tokens already assigned to their centroids, the same choices as the
// CPU encoder (index/encode/encoder.cpp), which the CUDA tests compare them with.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tilemaxsim/status.h"

namespace tms::kernels {

/// The widest PQ sub-vector pq_encode_cuda encodes (wider ones are encoded on the CPU).
inline constexpr int kMaxPqSubCuda = 64;

/// A residual codec's bucket boundaries (at most 15: 4 bits), passed to the kernel by value.
struct ResidualCutoffs {
    float v[16];
    int n;
};

/// codes [n, dim * nbits / 8]: the bucket of each residual value x - cents[lab] (the number of
/// cutoffs <= it), packed low bits first; enqueued on `stream`.
Status residual_encode_cuda(const float* x, const uint32_t* lab, const float* cents, int64_t n, int dim, int nbits,
                            const ResidualCutoffs& cut, uint8_t* codes, cudaStream_t stream);
/// Once per encoder before pq_encode_cuda: the shared memory its widest form needs for
/// sub-vectors of `dsub` dimensions.
Status pq_encode_setup_cuda(int dsub);
/// codes [n, M]: per sub-quantizer the nearest of its 256 codes (book [M, 256, dsub], squared
/// norms [M, 256]) to the residual x - cents[lab], ties to the lower code; enqueued on `stream`.
Status pq_encode_cuda(const float* x, const uint32_t* lab, const float* cents, int64_t n, int dim, int M, int dsub,
                      const float* book, const float* norms, uint8_t* codes, cudaStream_t stream);

}  // namespace tms::kernels

// Copyright TileMaxSim authors. Nearest centroid (kernels/nearest.h) on the device: one fused
// kernel per batch of rows. A CTA holds 256 rows as fp16 in shared memory (each row scaled by a
// power of two so that fp16 holds it: the argmax does not change), streams the centroids through
// a double-buffered shared-memory stage 128 at a time, multiplies on tensor cores (mma.sync
// m16n8k16, fp32 accumulators) and keeps each row's running maximum in registers, so that no
// score is written: the cost is the GEMM's FLOPs, not the [n, K] score matrix's bytes. The
// best score is recomputed in fp32 for the chosen centroid.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/nearest.h"

namespace tms::kernels {

/// The fused kernel takes rows of up to this many dimensions (wider ones: a GEMM and a row
/// argmax, index::GpuAssigner's fallback).
inline constexpr int kNearestMaxDim = 128;
/// Centroid rows of the fp16 form: a multiple of the 128-centroid stage.
inline int64_t nearest_padded_centroids(int n_centroids) { return (int64_t(n_centroids) + 127) / 128 * 128; }
/// Its columns: dim rounded up to a multiple of 32.
inline int nearest_padded_dim(int dim) { return (dim + 31) / 32 * 32; }
/// A power of two that brings every |value| of the centroids to at most 1 (1 when all are 0 or
/// some is not finite), the scale nearest_prepare_cuda applies.
float nearest_centroid_scale(const float* h_centroids, int64_t count);
/// d_c16 [nearest_padded_centroids(K), nearest_padded_dim(dim)] fp16 (uint16_t storage) =
/// d_centroids [K, dim] * scale, zero padded.
Status nearest_prepare_cuda(const float* d_centroids, int n_centroids, int dim, float scale, uint16_t* d_c16,
                            cudaStream_t stream);
/// p's pointers on the device (p.centroids: the fp32 centroids, read for p.best only);
/// d_c16: nearest_prepare_cuda's. NotSupported for dim > kNearestMaxDim.
Status nearest_cuda(const NearestParams& p, const uint16_t* d_c16, cudaStream_t stream);

/// The nearest centroid of each row of a score tile s [rows, K] (one warp a row, ties to the
/// lower id; a row of NaN scores gets 0, reported by the caller) into labels, its score into
/// best when it is not null: the argmax after a cuBLAS GEMM, for rows wider than kNearestMaxDim.
Status row_argmax_cuda(const float* s, int rows, int K, uint32_t* labels, float* best, cudaStream_t stream);

}  // namespace tms::kernels

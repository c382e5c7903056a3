// Copyright TileMaxSim authors. Nearest-centroid assignment on the GPU for index builds
// (host-only header; the CUDA build implements it in gpu_assign.cu, CPU builds in the stub).
#pragma once

#include <cstdint>
#include <memory>

#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms::index {

struct IndexModel;

/// argmax_k <x_i, c_k> for batches of rows (ties: lower id): kernels::nearest_cuda, one fused
/// tensor-core kernel that keeps each row's maximum in registers, for rows of up to 128
/// dimensions; wider rows take a cuBLAS GEMM (TF32 tensor cores, fp32 accumulate) into a device
/// score tile and a warp per row that picks the best (what FAISS's GPU flat inner-product index
/// does). Both round their operands to 11 significant bits (kernels::nearest_tolerance).
/// Thread-safety: one call at a time.
class GpuAssigner {
public:
    /// NotSupported in CPU-only builds or without a device.
    static Status Create(int device, std::unique_ptr<GpuAssigner>* out);
    ~GpuAssigner();
    /// Upload (replace) the centroids [n_centroids, dim], row-major fp32.
    Status SetCentroids(const float* h_centroids, int n_centroids, int dim);
    /// Rows x [n, dim] fp32 on the host -> labels [n] (and best scores [n] when not null).
    Status Assign(const float* h_x, int64_t n, uint32_t* h_labels, float* h_best);
    /// Page-locks host rows that several Assign calls will read (k-means' sample: its uploads
    /// then run at the link's rate), until the assigner is destroyed. Best effort: false when
    /// the system refuses (the calls then copy from pageable memory).
    bool PinHost(const void* p, size_t bytes);

    struct Impl;  // opaque (named by the encoder's helpers in gpu_assign.cu)

private:
    friend class GpuEncoder;
    GpuAssigner();
    std::unique_ptr<Impl> impl_;
};

/// The whole per-token encoding of an index build on the GPU: raw rows (f16, bf16 or f32, as
/// memory-mapped) are staged through pinned buffers (a parallel host copy), converted, assigned
/// to their nearest centroid (GpuAssigner's GEMM + argmax), and their residuals encoded on the
/// device (PQ: nearest of 256 codes per sub-vector, codebook in shared memory; residual: bucket
/// index per dimension, packed). Only centroid ids and codes come back: 4 + n_code_bytes bytes
/// a token. The host stages batch i + 1 while the GPU encodes batch i.
/// Results equal the CPU Encoder's up to float rounding of near ties (fp16 or TF32 assignment, FMA
/// order).
/// Thread-safety: one call at a time.
class GpuEncoder {
public:
    /// NotSupported without a device, or for a PQ sub-vector wider than 64 dimensions (the CPU
    /// encodes those). `model` must outlive the encoder.
    static Status Create(const IndexModel& model, int device, std::unique_ptr<GpuEncoder>* out);
    ~GpuEncoder();
    /// Rows [row0, row0 + n) of `tokens` -> cids [n], codes [n, n_code_bytes].
    Status Encode(const EmbeddingView& tokens, int64_t row0, int64_t n, uint32_t* cids, uint8_t* codes);

private:
    GpuEncoder();
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace tms::index

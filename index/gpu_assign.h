// Copyright TileMaxSim authors. Nearest-centroid assignment on the GPU for index builds
// (host-only header; the CUDA build implements it in gpu_assign.cu, CPU builds in the stub).
#pragma once

#include <cstdint>
#include <memory>

#include "tilemaxsim/status.h"

namespace tms::index {

/// argmax_k <x_i, c_k> for batches of rows: a cuBLAS GEMM (TF32 tensor cores, fp32 accumulate)
/// into a device score tile, then one warp per row picks the best centroid (ties: lower id).
/// This is what FAISS's GPU flat inner-product index does, without a FAISS GPU build.
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

private:
    GpuAssigner();
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace tms::index

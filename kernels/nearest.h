// Copyright TileMaxSim authors. Nearest centroid (maximum inner product) of each row: the
// assignment step of k-means and of index encoding, on memory the caller owns.
//   ref  (kernels/ref/nearest_ref.cpp)  fp64 dot products, THE SPEC
//   cpu  (kernels/cpu/nearest_cpu.cpp)  BLAS row blocks (single-threaded BLAS, OpenMP over blocks)
//   cuda (kernels/cuda/nearest_cuda.h)  one fused kernel: tensor-core dot products and the row
//        maximum in registers, no score matrix written
// The label of a row is the centroid of the largest inner product, the lower id among equal
// ones. The fp32 paths may pick another centroid only where the two scores lie within their
// rounding (nearest_tolerance); rows with NaN or Inf get some label in [0, n_centroids).
#pragma once

#include <cstdint>
#include <string>

#include "tilemaxsim/status.h"

namespace tms::kernels {

struct NearestParams {
    /// Rows [n, dim], fp32, row-major.
    const float* x = nullptr;
    int64_t n = 0;
    int dim = 0;
    /// Centroids [n_centroids, dim], fp32, row-major.
    const float* centroids = nullptr;
    int n_centroids = 0;
    /// Output [n]: each row's centroid.
    uint32_t* labels = nullptr;
    /// Output [n], optional: <x, centroids[label]> in fp32.
    float* best = nullptr;
};

/// Sizes positive (n may be 0), pointers present (shared by every path).
Status nearest_validate(const NearestParams& p);
Status nearest_ref(const NearestParams& p);
Status nearest_cpu(const NearestParams& p);

/// How far below the best score the chosen centroid's exact score may lie on a path that
/// rounds its inputs to 11 significant bits (the CUDA kernel's fp16 operands, as TF32 GEMMs
/// round theirs): twice 2^-10 of the product of the norms.
inline double nearest_tolerance(double x_norm, double c_norm_max) { return 2.0 * 0x1p-10 * x_norm * c_norm_max + 1e-6; }

/// out [n, K] = x [n, d] . c [K, d]^T (BLAS on row blocks spread over the OpenMP threads; the
/// scores nearest_cpu takes its maxima of).
void inner_products_cpu(const float* x, int64_t n, const float* c, int K, int d, float* out);

/// OpenBLAS maps a work buffer (128 MB in Debian's build) in each thread at its first product,
/// and retries forever when the process's address-space limit (ulimit -v) refuses it. Before
/// work that runs products on `threads` threads: ResourceExhausted, naming `what`, the room and
/// the need, when the limit leaves no room for their buffers plus `extra` bytes.
Status check_blas_room(int threads, int64_t extra, const std::string& what);

}  // namespace tms::kernels

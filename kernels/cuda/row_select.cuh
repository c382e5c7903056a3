// Copyright TileMaxSim authors. Best elements of a row of scores, one warp per row (device
// code): the k-means / encoding assignment (n = 1) and query-token probing (n = nprobe).
#pragma once

#include <cuda_runtime.h>

#include <cmath>

namespace tms::kernels {

/// The warp's lanes scan r[0, K) (coalesced) n times; pass p finds the best element after the
/// previous pick in the order (score descending, index ascending), so ties go to the lower index
/// and no element is picked twice. emit(p, index, score) runs on every lane after each pass;
/// index is K or more when the row has no element left (e.g. every score NaN).
template <class Emit>
__device__ __forceinline__ void warp_row_top_n(const float* __restrict__ r, int K, int n, int lane, Emit emit) {
    float ps = INFINITY;
    int pi = -1;
    for (int p = 0; p < n; ++p) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int k = lane; k < K; k += 32) {
            const float v = r[k];
            const bool after = v < ps || (v == ps && k > pi);
            if (after && (v > bv || (v == bv && k < bi))) {
                bv = v;
                bi = k;
            }
        }
        for (int off = 16; off > 0; off >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
        emit(p, bi, bv);
        ps = bv;
        pi = bi;
    }
}

}  // namespace tms::kernels

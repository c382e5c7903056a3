// Copyright TileMaxSim authors. Per-row selection of the n best entries by one warp (device code),
// shared by GPU probing (engine/gpu_code_scorer.cu) and GPU k-means assignment (index/gpu_assign.cu).
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cmath>

namespace tms::kernels {

namespace row_select_detail {

/// The selection order: score descending, then index ascending. NaN is never better than
/// anything, so it is never picked.
__device__ __forceinline__ bool better(float v, int k, float bv, int bk) { return v > bv || (v == bv && k < bk); }

/// The best (bv, bi) of the warp's lanes, on every lane.
__device__ __forceinline__ void warp_best(float& bv, int& bi) {
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
        if (better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
}

/// n passes over the row (any n): pass p finds the best element after the previous pick.
template <class Emit>
__device__ __forceinline__ void top_n_passes(const float* __restrict__ r, int K, int n, int lane, Emit emit) {
    float ps = INFINITY;
    int pi = -1;
    for (int p = 0; p < n; ++p) {
        float bv = -INFINITY;
        int bi = INT_MAX;
        for (int k = lane; k < K; k += 32) {
            const float v = r[k];
            const bool after = v < ps || (v == ps && k > pi);
            if (after && better(v, k, bv, bi)) {
                bv = v;
                bi = k;
            }
        }
        warp_best(bv, bi);
        emit(p, bi, bv);
        ps = bv;
        pi = bi;
    }
}

/// One pass (n <= N): each lane keeps its N best in registers (sorted, inserted only when
/// better than its N-th), then n rounds of a warp-wide best-of-heads; the winning lane pops.
/// A 16-byte aligned row is read 16 bytes a lane-load, four loads in flight (each lane's
/// elements are then 4i .. 4i + 3, i = lane mod 32: still read by one lane each). One element
/// a load, one load in flight, read 8,192 rows x 65,536 at ~1.1 TB/s on an H200.
template <int N, class Emit>
__device__ __forceinline__ void top_n_lists(const float* __restrict__ r, int K, int n, int lane, Emit emit) {
    float lv[N];
    int li[N];
#pragma unroll
    for (int j = 0; j < N; ++j) {
        lv[j] = -INFINITY;
        li[j] = INT_MAX;
    }
    const auto consider = [&](float v, int k) {
        if (!better(v, k, lv[N - 1], li[N - 1])) return;
#pragma unroll
        for (int j = N - 1; j >= 0; --j) {
            if (better(v, k, lv[j], li[j])) {
                if (j > 0 && better(v, k, lv[j - 1], li[j - 1])) {
                    lv[j] = lv[j - 1];
                    li[j] = li[j - 1];
                } else {
                    lv[j] = v;
                    li[j] = k;
                }
            }
        }
    };
    const auto consider4 = [&](const float4& x, int k) {  // elements k .. k + 3
        consider(x.x, k);
        consider(x.y, k + 1);
        consider(x.z, k + 2);
        consider(x.w, k + 3);
    };
    int k_tail = 0;  // elements from here on are read one a load
    if ((reinterpret_cast<uintptr_t>(r) & 15u) == 0) {
        const float4* r4 = reinterpret_cast<const float4*>(r);
        const int n4 = K / 4;
        int i = lane;
        for (; i + 96 < n4; i += 128) {
            float4 x[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) x[u] = __ldg(r4 + i + 32 * u);
#pragma unroll
            for (int u = 0; u < 4; ++u) consider4(x[u], 4 * (i + 32 * u));
        }
        for (; i < n4; i += 32) consider4(__ldg(r4 + i), 4 * i);
        k_tail = 4 * n4;
    }
    for (int k = k_tail + lane; k < K; k += 32) consider(r[k], k);
    for (int p = 0; p < n; ++p) {
        float bv = lv[0];
        int bi = li[0];
        warp_best(bv, bi);
        emit(p, bi, bv);
        if (li[0] ==
            bi) {  // each element is read by one lane: indices are distinct across lanes; the sentinel pops harmlessly
#pragma unroll
            for (int j = 0; j + 1 < N; ++j) {
                lv[j] = lv[j + 1];
                li[j] = li[j + 1];
            }
            lv[N - 1] = -INFINITY;
            li[N - 1] = INT_MAX;
        }
    }
}

}  // namespace row_select_detail

/// The warp's n best elements of r[0, K), in the order (score descending, index ascending):
/// ties go to the lower index, no element is picked twice, NaN is never picked. emit(p, index,
/// score) runs on every lane for p = 0 .. n-1; index is K or more (score -inf) when the row has
/// no element left. n <= 16 reads the row once (per-lane lists in registers); larger n makes
/// n passes. Call with all 32 lanes of the warp.
template <class Emit>
__device__ __forceinline__ void warp_row_top_n(const float* __restrict__ r, int K, int n, int lane, Emit emit) {
    if (n <= 1) {
        row_select_detail::top_n_lists<1>(r, K, n, lane, emit);
    } else if (n <= 8) {
        row_select_detail::top_n_lists<8>(r, K, n, lane, emit);
    } else if (n <= 16) {
        row_select_detail::top_n_lists<16>(r, K, n, lane, emit);
    } else {
        row_select_detail::top_n_passes(r, K, n, lane, emit);
    }
}

}  // namespace tms::kernels

// Copyright TileMaxSim authors. Per-query top-k inside the MaxSim kernels (device code), shared
// by the exact (maxsim_kernel.cuh) and compressed (code_maxsim_kernel.cuh) kernels and the merge
// rounds: (score, id) as one ordered 64-bit key, warp-cooperative insertion into a warp's sorted
// list in shared memory, and the block-wide merge of sorted lists.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace tms::kernels::topk_dev {

/// Total order of (score desc, id asc) as one 64-bit key, larger = better; 0 = empty slot.
__device__ __forceinline__ uint64_t make_key(float s, int32_t id) {
    if (isnan(s)) return 0;
    uint32_t u = __float_as_uint(s);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return (uint64_t(u) << 32) | uint32_t(0x7fffffff - id);
}
__device__ __forceinline__ float key_score(uint64_t key) {
    const uint32_t u = uint32_t(key >> 32);
    return __uint_as_float((u & 0x80000000u) ? (u & 0x7fffffffu) : ~u);
}
__device__ __forceinline__ int32_t key_id(uint64_t key) { return 0x7fffffff - int32_t(uint32_t(key)); }

/// Number of entries of a descending list that come before x (> x; also == x when or_equal).
__device__ __forceinline__ int count_before(const uint64_t* l, int n, uint64_t x, bool or_equal) {
    int lo = 0, hi = n;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        const uint64_t v = l[mid];
        if (v > x || (or_equal && v == x))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/// Merge n_lists descending lists (list b at lists + b*stride, counts[b] valid entries; or
/// every entry when counts == nullptr, skipping zero keys) into the k best, written to out
/// (keys) or decoded to out_ids/out_scores. Ranks are unique (ties: lower list first), so
/// each kept entry lands in one slot. Block-wide; ends with __syncthreads().
__device__ inline void block_merge_topk(const uint64_t* lists, int64_t stride, const int* counts, int n_lists, int k,
                                        uint64_t* out, int32_t* out_ids, float* out_scores) {
    for (int r = threadIdx.x; r < k; r += blockDim.x) {
        if (out)
            out[r] = 0;
        else {
            out_ids[r] = -1;
            out_scores[r] = -INFINITY;
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < n_lists * k; e += blockDim.x) {
        const int a = e / k, i = e - a * k;
        const int na = counts ? counts[a] : k;
        if (i >= na) continue;
        const uint64_t x = lists[a * stride + i];
        if (x == 0) continue;
        int rank = i;
        for (int b = 0; b < n_lists && rank < k; ++b) {
            if (b == a) continue;
            rank += count_before(lists + b * stride, counts ? counts[b] : k, x, b < a);
        }
        if (rank < k) {
            if (out)
                out[rank] = x;
            else {
                out_ids[rank] = key_id(x);
                out_scores[rank] = key_score(x);
            }
        }
    }
    __syncthreads();
}

/// Warp-cooperative insertion of key into a descending list (capacity k, n entries).
__device__ __forceinline__ void warp_insert(uint64_t* l, int& n, int k, uint64_t key, int lane) {
    if (n == k && key <= l[k - 1]) return;
    int p = 0;
    for (int base = 0; base < n; base += 32) {
        const int i = base + lane;
        const bool ge = i < n && l[i] >= key;
        const unsigned m = __ballot_sync(0xffffffffu, ge);
        p += __popc(m);
        if (m != 0xffffffffu) break;
    }
    const int last = min(n, k - 1) - 1;  // entries p..last move down one slot
    for (int base = last; base >= p; base -= 32) {
        const int i = base - lane;
        uint64_t v = 0;
        if (i >= p) v = l[i];
        __syncwarp();
        if (i >= p) l[i + 1] = v;
        __syncwarp();
    }
    __syncwarp();  // when nothing moved, the reads of l[p] above come before this write
    if (lane == 0) l[p] = key;
    __syncwarp();
    n = min(n + 1, k);
}

}  // namespace tms::kernels::topk_dev

// Copyright TileMaxSim authors.
// Compressed (PQ / PLAID residual) fused MaxSim kernels (device code; included by
// code_maxsim.cu). score(q, d) = sum_i max_t (cs[q, i, cid_t] + <q_i, r_t>), where the
// residual r_t is decoded from the codebook in shared memory.
//
// Mapping (CodeTraits<kSub>, kWarps = 8 warps, 256 threads per CTA), as the exact kernel:
//   grid.y  -> query q (grid-stride when n_queries > 65535)
//   grid.x  -> slice s of query q's item list (dense: documents; ragged: candidates).
//   warp w  -> items b0 + w + 8*u of each batch of 256 items; lane u holds item u's metadata.
//   warp step: 32 document tokens (4 n8 tiles) x all dims, 32 query rows (2 m16 tiles).
//     Accumulators start at the centroid scores: lane g*4+t owns accumulator columns
//     (tokens) 2t, 2t+1 of each n8 tile and rows g, g+8, g+16, g+24; the table stores a
//     token's 32 rows permuted so those four are one 8-byte load (slot g*4 + m*2 + h holds
//     row m*16 + h*8 + g). The centroid ids of the step's 32 tokens are one coalesced load
//     (one per lane) and shuffled.
//     Residual: lane g*4+t holds, as the B fragment of mma.m16n8k16, token g's dims
//     8t..8t+7 of each 32-dim chunk (k order permuted identically on the query side). Those
//     8 dims are decoded from the code bytes that cover them (1 byte when dsub >= 8, 2 when
//     dsub = 4, 4 when dsub = 2; read from global memory, L1-cached) by 16/8/4-byte reads of
//     the fp16 codebook in shared memory, straight into registers.
//     kSub = 0 (centroid-only) skips the residual: no MMAs, no query rows in shared memory.
//   Query tokens are processed 32 at a time (a "group"); longer queries revisit the batch.
// Shared memory per CTA: fp16 codebook n_code_bytes * 256 * dsub * 2 = dim * 512 bytes,
//   then 32 query rows of q_row_bytes(dim). dim = 128: 64 KB + 10 KB; dim = 256: 146 KB.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mma_tile.cuh"
#include "kernels/maxsim.h"

namespace tms::kernels::code_impl {

/// Kernel arguments (device pointers), passed by value.
struct CodeArgs {
    const float* queries;
    int n_queries;
    int q_stride;
    int dim;
    const int32_t* query_lens;
    const __half* table;  // [n_queries, n_groups, n_centroids, 32]
    int n_groups;
    int n_centroids;
    const uint32_t* token_centroids;
    const uint8_t* codes;
    int n_code_bytes;
    int dsub;
    const float* codebook;
    const int64_t* doc_offsets;
    int64_t n_docs;
    const int64_t* cand_offsets;
    const int32_t* cand_docs;
    float* scores;
    int q_row_bytes;    // shared-memory stride of one query row
    int cb_smem_bytes;  // fp16 codebook bytes in shared memory
};

template <int kSub_>
struct CodeTraits {
    static constexpr int kSub = kSub_;  // 0: centroid-only; 2, 4: dsub; 8: dsub a multiple of 8
    static constexpr int kWarps = 8;
    static constexpr int kThreads = 32 * kWarps;
    static constexpr int kMinBlocksPerSM = 2;
    static constexpr int kMTiles = 2;
    static constexpr int kRows = 16 * kMTiles;  // query rows per group
    static constexpr int kNTiles = 4;
    static constexpr int kStepTokens = 8 * kNTiles;
    static constexpr int kBatch = 32;
    static_assert(kSub == 0 || kSub == 2 || kSub == 4 || kSub == 8, "dsub class");
    static_assert(kStepTokens == 32, "one centroid id per lane per step");
    static_assert(kRows == 32, "table groups are 32 rows");
    static_assert(kWarps * kBatch == 256, "batch of 256 items per CTA");
};

/// Table slot of row r (0..31) of a group, and back.
__host__ __device__ constexpr int table_slot(int r) { return (r & 7) * 4 + ((r >> 4) & 1) * 2 + ((r >> 3) & 1); }
__host__ __device__ constexpr int table_row(int s) { return ((s >> 1) & 1) * 16 + (s & 1) * 8 + (s >> 2); }

using mma_tile::lds128;
using mma_tile::lds32;
using mma_tile::lds64;
using mma_tile::mma16816;

/// The 8 fp16 residual values (4 registers) of token row `crow`, dims d0..d0+7.
template <int kSub>
__device__ __forceinline__ uint4 decode8(const uint8_t* __restrict__ crow, int d0, int dsub, const unsigned char* cb) {
    if constexpr (kSub == 8) {
        const int b = d0 / dsub, off = d0 - b * dsub;
        const uint32_t code = __ldg(crow + b);
        return lds128(cb + ((size_t(b) * 256 + code) * dsub + off) * 2);
    } else if constexpr (kSub == 4) {
        const int b = d0 >> 2;
        const uint32_t c2 = __ldg(reinterpret_cast<const uint16_t*>(crow + b));
        const uint2 lo = lds64(cb + ((b * 256 + (c2 & 0xff)) * 4) * 2);
        const uint2 hi = lds64(cb + (((b + 1) * 256 + (c2 >> 8)) * 4) * 2);
        return make_uint4(lo.x, lo.y, hi.x, hi.y);
    } else {
        const int b = d0 >> 1;
        const uint32_t c4 = __ldg(reinterpret_cast<const uint32_t*>(crow + b));
        uint4 r;
        r.x = lds32(cb + ((b * 256 + (c4 & 0xff)) * 2) * 2);
        r.y = lds32(cb + (((b + 1) * 256 + ((c4 >> 8) & 0xff)) * 2) * 2);
        r.z = lds32(cb + (((b + 2) * 256 + ((c4 >> 16) & 0xff)) * 2) * 2);
        r.w = lds32(cb + (((b + 3) * 256 + (c4 >> 24)) * 2) * 2);
        return r;
    }
}

/// sum over the group's valid rows of max over the document's tokens; n_tok > 0.
template <class T>
__device__ __forceinline__ float warp_doc_code(const CodeArgs& a, int64_t tb, int n_tok, const __half* table_g,
                                               const unsigned char* cb, const unsigned char* q_s, int rows_valid,
                                               int lane) {
    constexpr int kM = T::kMTiles, kN = T::kNTiles;
    const int g = lane >> 2, t = lane & 3;
    float rmax[kM][2];
#pragma unroll
    for (int m = 0; m < kM; ++m) rmax[m][0] = rmax[m][1] = -INFINITY;
    const unsigned char* qrow = q_s + g * a.q_row_bytes + t * 16;
    const uint32_t* cids = a.token_centroids + tb;

    for (int s0 = 0; s0 < n_tok; s0 += T::kStepTokens) {
        const uint32_t my_cid = s0 + lane < n_tok ? __ldg(cids + s0 + lane) : 0u;
        float acc[kM][kN][4];
#pragma unroll
        for (int n = 0; n < kN; ++n) {
            const uint32_t c0 = __shfl_sync(0xffffffffu, my_cid, n * 8 + 2 * t);
            const uint32_t c1 = __shfl_sync(0xffffffffu, my_cid, n * 8 + 2 * t + 1);
            const uint2 v0 = __ldg(reinterpret_cast<const uint2*>(table_g + size_t(c0) * 32 + g * 4));
            const uint2 v1 = __ldg(reinterpret_cast<const uint2*>(table_g + size_t(c1) * 32 + g * 4));
            const float2 a00 = __half22float2(*reinterpret_cast<const __half2*>(&v0.x));  // m0: rows g, g+8
            const float2 a01 = __half22float2(*reinterpret_cast<const __half2*>(&v0.y));  // m1
            const float2 a10 = __half22float2(*reinterpret_cast<const __half2*>(&v1.x));
            const float2 a11 = __half22float2(*reinterpret_cast<const __half2*>(&v1.y));
            acc[0][n][0] = a00.x; acc[0][n][1] = a10.x; acc[0][n][2] = a00.y; acc[0][n][3] = a10.y;
            acc[1][n][0] = a01.x; acc[1][n][1] = a11.x; acc[1][n][2] = a01.y; acc[1][n][3] = a11.y;
        }
        if constexpr (T::kSub != 0) {
            const uint8_t* crow[kN];
#pragma unroll
            for (int n = 0; n < kN; ++n) {
                const int tok = s0 + n * 8 + g;
                crow[n] = a.codes + (tb + (tok < n_tok ? tok : 0)) * a.n_code_bytes;
            }
            for (int d = 0; d < a.dim; d += 32) {
                uint4 qa[kM], qb[kM];
#pragma unroll
                for (int m = 0; m < kM; ++m) {
                    qa[m] = lds128(qrow + (m * 16) * a.q_row_bytes + d * 2);
                    qb[m] = lds128(qrow + (m * 16 + 8) * a.q_row_bytes + d * 2);
                }
                uint4 bf[kN];
#pragma unroll
                for (int n = 0; n < kN; ++n) bf[n] = decode8<T::kSub>(crow[n], d + 8 * t, a.dsub, cb);
#pragma unroll
                for (int n = 0; n < kN; ++n)
#pragma unroll
                    for (int m = 0; m < kM; ++m) {
                        mma16816<false>(acc[m][n], qa[m].x, qb[m].x, qa[m].y, qb[m].y, bf[n].x, bf[n].y);
                        mma16816<false>(acc[m][n], qa[m].z, qb[m].z, qa[m].w, qb[m].w, bf[n].z, bf[n].w);
                    }
            }
        }
        mma_tile::fold_step_max<kM, kN>(rmax, acc, s0, n_tok, t, s0 + T::kStepTokens <= n_tok);
    }
    return mma_tile::sum_row_maxima<kM>(rmax, rows_valid, g);
}

/// Query rows [row0, row0 + 32) of query q as fp16 in shared memory (rows past ql are 0).
template <class T>
__device__ __forceinline__ void fill_query_group(const CodeArgs& a, int q, int ql, int row0, unsigned char* q_s) {
    const int n = T::kRows * a.dim;
    for (int idx = threadIdx.x; idx < n; idx += T::kThreads) {
        const int r = idx / a.dim, c = idx - r * a.dim;
        const int row = row0 + r;
        const float v = row < ql ? a.queries[(int64_t(q) * a.q_stride + row) * a.dim + c] : 0.f;
        *reinterpret_cast<__half*>(q_s + r * a.q_row_bytes + c * 2) = __float2half_rn(v);
    }
}

template <class T>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocksPerSM) code_maxsim_kernel(const CodeArgs a) {
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char* cb = smem;
    unsigned char* q_s = smem + a.cb_smem_bytes;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t s = blockIdx.x, n_slices = gridDim.x;
    const bool dense = a.cand_offsets == nullptr;

    if constexpr (T::kSub != 0) {
        // fp32 codebook -> fp16 shared memory, once per CTA (n_code_bytes * 256 * dsub = dim * 256 values).
        const int n4 = a.dim * 64;
        const float4* src = reinterpret_cast<const float4*>(a.codebook);
        for (int i = threadIdx.x; i < n4; i += T::kThreads) {
            const float4 v = __ldg(src + i);
            const __half2 lo = __floats2half2_rn(v.x, v.y), hi = __floats2half2_rn(v.z, v.w);
            uint2 w;
            w.x = *reinterpret_cast<const uint32_t*>(&lo);
            w.y = *reinterpret_cast<const uint32_t*>(&hi);
            *reinterpret_cast<uint2*>(cb + size_t(i) * 8) = w;
        }
    }

    for (int q = blockIdx.y; q < a.n_queries; q += gridDim.y) {
        int ql = a.query_lens ? a.query_lens[q] : a.q_stride;
        ql = max(0, min(ql, a.q_stride));
        const int64_t base = dense ? 0 : a.cand_offsets[q];
        const int64_t n = dense ? a.n_docs : a.cand_offsets[q + 1] - base;
        const int64_t lo = n * s / n_slices, hi = n * (s + 1) / n_slices;
        const int n_groups = (ql + T::kRows - 1) / T::kRows;
        if (n_groups == 1) {
            __syncthreads();
            if constexpr (T::kSub != 0) fill_query_group<T>(a, q, ql, 0, q_s);
            __syncthreads();
        }
        for (int64_t b0 = lo; b0 < hi; b0 += T::kWarps * T::kBatch) {
            const int64_t item = b0 + warp + T::kWarps * lane;
            const bool valid = item < hi;
            int64_t doc = -1, tb = 0, te = 0;
            if (valid) {
                doc = dense ? item : int64_t(a.cand_docs[base + item]);
                if (doc >= 0 && doc < a.n_docs) {
                    tb = a.doc_offsets[doc];
                    te = a.doc_offsets[doc + 1];
                }
            }
            const bool bad = valid && !(doc >= 0 && doc < a.n_docs);
            const int64_t left = (hi - b0 - warp + T::kWarps - 1) / T::kWarps;
            const int n_mine = left <= 0 ? 0 : (left >= T::kBatch ? T::kBatch : int(left));
            float part = 0.f;
            for (int grp = 0; grp < n_groups; ++grp) {
                if (n_groups > 1) {
                    __syncthreads();
                    if constexpr (T::kSub != 0) fill_query_group<T>(a, q, ql, grp * T::kRows, q_s);
                    __syncthreads();
                }
                const int rows_valid = min(T::kRows, ql - grp * T::kRows);
                const __half* table_g = a.table + (int64_t(q) * a.n_groups + grp) * int64_t(a.n_centroids) * 32;
                for (int u = 0; u < n_mine; ++u) {
                    const int64_t ub = __shfl_sync(0xffffffffu, tb, u);
                    const int64_t ue = __shfl_sync(0xffffffffu, te, u);
                    float sc = 0.f;
                    if (ue > ub) sc = warp_doc_code<T>(a, ub, int(ue - ub), table_g, cb, q_s, rows_valid, lane);
                    if (lane == u) part += sc;
                }
            }
            if (bad) part = __int_as_float(0x7fc00000);
            if (valid) a.scores[dense ? int64_t(q) * a.n_docs + item : base + item] = part;
        }
    }
}

/// Table writer: one CTA of 32 x 8 threads transposes 32 centroids x 32 rows of one
/// (query, group) through shared memory: reads along centroids, writes along slots.
__global__ void __launch_bounds__(256) centroid_table_kernel(const float* cs, const int32_t* query_lens,
                                                             int n_queries, int q_stride, int n_centroids,
                                                             int n_groups, __half* table) {
    __shared__ float tile[32][33];
    const int64_t n_ktiles = (n_centroids + 31) / 32;
    const int64_t n_tiles = int64_t(n_queries) * n_groups * n_ktiles;
    for (int64_t tile_id = blockIdx.x; tile_id < n_tiles; tile_id += gridDim.x) {
        const int64_t kt = tile_id % n_ktiles;
        const int64_t qg = tile_id / n_ktiles;
        const int grp = int(qg % n_groups), q = int(qg / n_groups);
        int ql = query_lens ? query_lens[q] : q_stride;
        ql = max(0, min(ql, q_stride));
        const int k0 = int(kt * 32);
        __syncthreads();
        for (int r = threadIdx.y; r < 32; r += 8) {
            const int row = grp * 32 + r, k = k0 + threadIdx.x;
            tile[r][threadIdx.x] =
                (row < ql && k < n_centroids) ? cs[(int64_t(q) * q_stride + row) * n_centroids + k] : 0.f;
        }
        __syncthreads();
        for (int kk = threadIdx.y; kk < 32; kk += 8) {
            const int k = k0 + kk;
            if (k < n_centroids) {
                const int slot = threadIdx.x;
                table[(qg * n_centroids + k) * 32 + slot] = __float2half_rn(tile[table_row(slot)][kk]);
            }
        }
    }
}

}  // namespace tms::kernels::code_impl

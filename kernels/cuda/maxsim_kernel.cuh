// Copyright TileMaxSim authors.
// TileMaxSim exact MaxSim kernels (device code; included by the generated instances and by
// the launcher). score(q, d) = sum_i max_j <q_i, d_j>, one pass over the document tokens.
//
// Mapping (MaxSimTraits<TD, kSplitQ, kMTiles>, kWarps = 8 warps, 256 threads per CTA):
//   grid.y  -> query q (grid-stride when n_queries > 65535)
//   grid.x  -> slice s of query q's item list (dense: documents 0..n_docs-1; ragged:
//              candidates cand_offsets[q]..cand_offsets[q+1]); slice s owns items
//              [n*s/S, n*(s+1)/S).
//   warp w  -> items b0 + w + 8*u of each batch of 256 items (u = 0..31); lane u holds the
//              metadata (doc id, token range) of item u, loaded for all 32 items at once.
//   warp step: 8*kNTiles document tokens x one 128-byte dimension tile (64 dims of fp16/bf16,
//              32 of fp32). Each lane reads 16-byte vectors straight from HBM into the
//              B-fragment registers of mma.m16n8k16 (lane g*4+t loads token g, dims 8t..8t+7
//              of every 32-dim chunk; the k order inside a chunk is permuted identically on
//              the query side, so no shared-memory staging of documents). Query rows come
//              from shared memory (A fragments, ld.shared.v4, conflict-free row padding).
//              Accumulators: kMTiles x kNTiles x 4 fp32 = 32 registers; the running max per
//              query row stays in registers across steps; the doc score is reduced with warp
//              shuffles at the end of the document.
//   Query tokens are processed kRows = 16*kMTiles at a time (a "group"); queries longer than
//   one group reload the group in shared memory and revisit the batch (partial sums in the
//   lane that owns the item).
//   Precision: fp16/bf16 docs with the same query dtype use one MMA per tile; any query that
//   the doc type cannot hold exactly is split q = hi + lo (two MMAs), fp32 docs are split too
//   (bf16 hi/lo, three MMAs: hi*hi + lo*hi + hi*lo), keeping results at fp32 accuracy.
// Shared memory per CTA: kRows * row_stride * kQTerms query bytes, row_stride = dim*2 (+64
//   when dim*2 % 128 == 0, so the two rows a quarter-warp reads fall in different banks),
//   plus, in top-k mode, kWarps sorted lists of k 64-bit keys and their counts.
//   dim=128, Nq<=32, fp16: 10 KB; dim=1024, split, top-k 1024: 199 KB (<= 227 KB opt-in).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mma_tile.cuh"
#include "kernels/maxsim.h"

namespace tms::kernels::cuda_impl {

/// Kernel arguments (device pointers), passed by value.
struct MaxSimArgs {
    const void* queries;
    int q_dtype;  // DType as int
    int n_queries;
    int q_stride;
    int dim;
    const int32_t* query_lens;
    const void* doc_tokens;
    const int64_t* doc_offsets;
    int64_t n_docs;
    const int64_t* cand_offsets;
    const int32_t* cand_docs;
    float* scores;          // scores mode (topk_partial == nullptr)
    uint64_t* topk_partial; // top-k mode: [n_queries, n_slices, k] sorted keys
    int k;
    int q_row_bytes;        // shared-memory stride of one query row
};

template <typename TD, bool kSplitQ_, int kMTiles_>
struct MaxSimTraits {
    using Doc = TD;
    static constexpr bool kDocF32 = std::is_same_v<TD, float>;
    static constexpr bool kDocBF16 = std::is_same_v<TD, __nv_bfloat16>;
    /// Tensor-core input type: fp16 for fp16 docs, bf16 for bf16 and fp32 docs.
    static constexpr bool kComputeBF16 = kDocBF16 || kDocF32;
    static constexpr int kWarps = 8;
    static constexpr int kThreads = 32 * kWarps;
    static constexpr int kMinBlocksPerSM = 2;
    static constexpr int kMTiles = kMTiles_;
    static constexpr int kRows = 16 * kMTiles;      // query rows per group
    static constexpr int kNTiles = 8 / kMTiles;     // n8 tiles of doc tokens per step
    static constexpr int kStepTokens = 8 * kNTiles;
    static constexpr int kTileBytes = 128;          // bytes of one token per dimension tile
    static constexpr int kTileDims = kTileBytes / int(sizeof(TD));
    static constexpr int kChunks = kTileDims / 32;  // 32-dim chunks per tile (2 MMAs each)
    static constexpr int kVecs = int(sizeof(TD)) / 2;  // 16-byte loads per lane per chunk
    static constexpr int kQTerms = (kSplitQ_ || kDocF32) ? 2 : 1;
    static constexpr bool kSplitQ = kQTerms == 2;
    static constexpr int kBatch = 32;               // items per warp per batch (one per lane)

    static_assert(std::is_same_v<TD, __half> || kDocBF16 || kDocF32, "doc type");
    static_assert(kMTiles == 2 || kMTiles == 4, "query groups of 32 or 64 rows");
    static_assert(kMTiles * kNTiles == 8, "32 fp32 accumulators per lane");
    static_assert(kTileDims % 32 == 0 && kChunks >= 1, "tile is whole 32-dim chunks");
    static_assert(kVecs * 16 == 8 * int(sizeof(TD)), "a lane covers 8 dims per chunk");
    static_assert(kWarps * kBatch == 256, "batch of 256 items per CTA");
};

/// Bytes of shared memory one query row takes (conflict-free padding).
inline int q_row_bytes(int dim) { return dim * 2 + ((dim * 2) % 128 == 0 ? 64 : 0); }

// ---------------------------------------------------------------------------------------
// Small device helpers
// ---------------------------------------------------------------------------------------

__device__ __forceinline__ uint4 ldg_stream(const void* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

using mma_tile::lds128;
using mma_tile::mma16816;

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ float load_q(const void* q, int dtype, int64_t i) {
    switch (dtype) {
        case int(DType::kF32): return static_cast<const float*>(q)[i];
        case int(DType::kF16): return __half2float(static_cast<const __half*>(q)[i]);
        default: return __bfloat162float(static_cast<const __nv_bfloat16*>(q)[i]);
    }
}

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
        if (v > x || (or_equal && v == x)) lo = mid + 1; else hi = mid;
    }
    return lo;
}

/// Merge n_lists descending lists (list b at lists + b*stride, counts[b] valid entries; or
/// every entry when counts == nullptr, skipping zero keys) into the k best, written to out
/// (keys) or decoded to out_ids/out_scores. Ranks are unique (ties: lower list first), so
/// each kept entry lands in one slot. Block-wide; ends with __syncthreads().
__device__ inline void block_merge_topk(const uint64_t* lists, int64_t stride, const int* counts, int n_lists,
                                        int k, uint64_t* out, int32_t* out_ids, float* out_scores) {
    for (int r = threadIdx.x; r < k; r += blockDim.x) {
        if (out) out[r] = 0;
        else { out_ids[r] = -1; out_scores[r] = -INFINITY; }
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
            if (out) out[rank] = x;
            else { out_ids[rank] = key_id(x); out_scores[rank] = key_score(x); }
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
    if (lane == 0) l[p] = key;
    __syncwarp();
    n = min(n + 1, k);
}

// ---------------------------------------------------------------------------------------
// One warp, one document, one query group
// ---------------------------------------------------------------------------------------

/// sum over the group's valid rows of max over the document's tokens; n_tok > 0.
template <class T>
__device__ __forceinline__ float warp_doc_maxsim(const typename T::Doc* __restrict__ doc, int n_tok, int dim,
                                                 const unsigned char* q_hi, const unsigned char* q_lo,
                                                 int q_row_bytes, int rows_valid, int lane) {
    using TD = typename T::Doc;
    constexpr int kM = T::kMTiles, kN = T::kNTiles, kC = T::kChunks, kV = T::kVecs;
    const int g = lane >> 2, t = lane & 3;
    float rmax[kM][2];
#pragma unroll
    for (int m = 0; m < kM; ++m) rmax[m][0] = rmax[m][1] = -INFINITY;

    const unsigned char* qrow_hi = q_hi + g * q_row_bytes + t * 16;
    const unsigned char* qrow_lo = q_lo + g * q_row_bytes + t * 16;

    for (int s0 = 0; s0 < n_tok; s0 += T::kStepTokens) {
        float acc[kM][kN][4];
#pragma unroll
        for (int m = 0; m < kM; ++m)
#pragma unroll
            for (int n = 0; n < kN; ++n) acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.f;

        for (int d0 = 0; d0 < dim; d0 += T::kTileDims) {
            const int nch = min(kC, (dim - d0) >> 5);
            uint4 dr[kN][kC][kV];
#pragma unroll
            for (int n = 0; n < kN; ++n) {
                const int tok = s0 + n * 8 + g;
                const bool ok = tok < n_tok;
                const unsigned char* rp =
                    reinterpret_cast<const unsigned char*>(doc + int64_t(ok ? tok : 0) * dim + d0) + t * 8 * sizeof(TD);
#pragma unroll
                for (int c = 0; c < kC; ++c)
#pragma unroll
                    for (int v = 0; v < kV; ++v)
                        dr[n][c][v] = (ok && c < nch) ? ldg_stream(rp + c * 32 * sizeof(TD) + v * 16)
                                                      : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int c = 0; c < kC; ++c) {
                if (c >= nch) break;
                const int qoff = (d0 + c * 32) * 2;
                uint4 qa[kM][T::kQTerms], qb[kM][T::kQTerms];
#pragma unroll
                for (int m = 0; m < kM; ++m) {
                    qa[m][0] = lds128(qrow_hi + (m * 16) * q_row_bytes + qoff);
                    qb[m][0] = lds128(qrow_hi + (m * 16 + 8) * q_row_bytes + qoff);
                    if constexpr (T::kQTerms == 2) {
                        qa[m][1] = lds128(qrow_lo + (m * 16) * q_row_bytes + qoff);
                        qb[m][1] = lds128(qrow_lo + (m * 16 + 8) * q_row_bytes + qoff);
                    }
                }
#pragma unroll
                for (int n = 0; n < kN; ++n) {
                    uint32_t bh[4], bl[4];
                    if constexpr (T::kDocF32) {
                        // 8 fp32 values (2 vectors) -> bf16 hi and lo pairs, same k order as fp16.
                        const uint4 v0 = dr[n][c][0], v1 = dr[n][c][kV - 1];
                        const float xs[8] = {__uint_as_float(v0.x), __uint_as_float(v0.y), __uint_as_float(v0.z),
                                             __uint_as_float(v0.w), __uint_as_float(v1.x), __uint_as_float(v1.y),
                                             __uint_as_float(v1.z), __uint_as_float(v1.w)};
#pragma unroll
                        for (int j = 0; j < 4; ++j) {
                            const float h0 = __bfloat162float(__float2bfloat16_rn(xs[2 * j]));
                            const float h1 = __bfloat162float(__float2bfloat16_rn(xs[2 * j + 1]));
                            bh[j] = pack_bf16(h0, h1);
                            bl[j] = pack_bf16(xs[2 * j] - h0, xs[2 * j + 1] - h1);
                        }
                    } else {
                        bh[0] = dr[n][c][0].x; bh[1] = dr[n][c][0].y; bh[2] = dr[n][c][0].z; bh[3] = dr[n][c][0].w;
                    }
#pragma unroll
                    for (int m = 0; m < kM; ++m) {
                        constexpr bool bf = T::kComputeBF16;
                        mma16816<bf>(acc[m][n], qa[m][0].x, qb[m][0].x, qa[m][0].y, qb[m][0].y, bh[0], bh[1]);
                        mma16816<bf>(acc[m][n], qa[m][0].z, qb[m][0].z, qa[m][0].w, qb[m][0].w, bh[2], bh[3]);
                        if constexpr (T::kQTerms == 2) {
                            mma16816<bf>(acc[m][n], qa[m][1].x, qb[m][1].x, qa[m][1].y, qb[m][1].y, bh[0], bh[1]);
                            mma16816<bf>(acc[m][n], qa[m][1].z, qb[m][1].z, qa[m][1].w, qb[m][1].w, bh[2], bh[3]);
                        }
                        if constexpr (T::kDocF32) {
                            mma16816<bf>(acc[m][n], qa[m][0].x, qb[m][0].x, qa[m][0].y, qb[m][0].y, bl[0], bl[1]);
                            mma16816<bf>(acc[m][n], qa[m][0].z, qb[m][0].z, qa[m][0].w, qb[m][0].w, bl[2], bl[3]);
                        }
                    }
                }
            }
        }
        mma_tile::fold_step_max<kM, kN>(rmax, acc, s0, n_tok, t, s0 + T::kStepTokens <= n_tok);
    }
    return mma_tile::sum_row_maxima<kM>(rmax, rows_valid, g);
}

/// Converts query rows [row0, row0 + kRows) of query q into shared memory (hi, and lo terms).
template <class T>
__device__ __forceinline__ void fill_query_group(const MaxSimArgs& a, int q, int ql, int row0,
                                                 unsigned char* q_hi, unsigned char* q_lo) {
    using C = std::conditional_t<T::kComputeBF16, __nv_bfloat16, __half>;
    const int n = T::kRows * a.dim;
    for (int idx = threadIdx.x; idx < n; idx += T::kThreads) {
        const int r = idx / a.dim, c = idx - r * a.dim;
        const int row = row0 + r;
        const float v = row < ql ? load_q(a.queries, a.q_dtype, (int64_t(q) * a.q_stride + row) * a.dim + c) : 0.f;
        C h, l;
        if constexpr (T::kComputeBF16) {
            h = __float2bfloat16_rn(v);
            l = __float2bfloat16_rn(v - __bfloat162float(h));
        } else {
            h = __float2half_rn(v);
            l = __float2half_rn(v - __half2float(h));
        }
        *reinterpret_cast<C*>(q_hi + r * a.q_row_bytes + c * 2) = h;
        if constexpr (T::kQTerms == 2) *reinterpret_cast<C*>(q_lo + r * a.q_row_bytes + c * 2) = l;
    }
}

template <class T>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocksPerSM) maxsim_kernel(const MaxSimArgs a) {
    using TD = typename T::Doc;
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char* q_hi = smem;
    unsigned char* q_lo = smem + T::kRows * a.q_row_bytes;
    uint64_t* lists = reinterpret_cast<uint64_t*>(smem + T::kRows * a.q_row_bytes * T::kQTerms);
    int* counts = reinterpret_cast<int*>(lists + T::kWarps * a.k);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t s = blockIdx.x, n_slices = gridDim.x;
    const bool dense = a.cand_offsets == nullptr;
    const bool topk = a.topk_partial != nullptr;
    uint64_t* my_list = lists + warp * a.k;
    const TD* docs = static_cast<const TD*>(a.doc_tokens);

    for (int q = blockIdx.y; q < a.n_queries; q += gridDim.y) {
        int ql = a.query_lens ? a.query_lens[q] : a.q_stride;
        ql = max(0, min(ql, a.q_stride));
        const int64_t base = dense ? 0 : a.cand_offsets[q];
        const int64_t n = dense ? a.n_docs : a.cand_offsets[q + 1] - base;
        const int64_t lo = n * s / n_slices, hi = n * (s + 1) / n_slices;
        const int n_groups = (ql + T::kRows - 1) / T::kRows;
        int list_n = 0;
        if (n_groups == 1) {
            __syncthreads();
            fill_query_group<T>(a, q, ql, 0, q_hi, q_lo);
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
                    fill_query_group<T>(a, q, ql, grp * T::kRows, q_hi, q_lo);
                    __syncthreads();
                }
                const int rows_valid = min(T::kRows, ql - grp * T::kRows);
                for (int u = 0; u < n_mine; ++u) {
                    const int64_t ub = __shfl_sync(0xffffffffu, tb, u);
                    const int64_t ue = __shfl_sync(0xffffffffu, te, u);
                    float sc = 0.f;
                    if (ue > ub) {
                        sc = warp_doc_maxsim<T>(docs + ub * a.dim, int(ue - ub), a.dim, q_hi, q_lo, a.q_row_bytes,
                                                rows_valid, lane);
                    }
                    if (lane == u) part += sc;
                }
            }
            if (bad) part = __int_as_float(0x7fc00000);
            if (!topk) {
                if (valid) a.scores[dense ? int64_t(q) * a.n_docs + item : base + item] = part;
            } else {
                const uint64_t key = valid ? make_key(part, int32_t(doc)) : 0;
                for (int u = 0; u < n_mine; ++u) {
                    const uint64_t ku = __shfl_sync(0xffffffffu, key, u);
                    if (ku != 0) warp_insert(my_list, list_n, a.k, ku, lane);
                }
            }
        }
        if (topk) {
            if (lane == 0) counts[warp] = list_n;
            __syncthreads();
            block_merge_topk(lists, a.k, counts, T::kWarps, a.k, a.topk_partial + (int64_t(q) * n_slices + s) * a.k,
                             nullptr, nullptr);
        }
    }
}

/// Host-side entry points of one instantiation (defined here, instantiated in instances/).
template <class T>
struct MaxSimKernel {
    static Status Launch(const MaxSimArgs& a, dim3 grid, size_t smem_bytes, cudaStream_t stream) {
        TMS_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(maxsim_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                      int(smem_bytes)));
        maxsim_kernel<T><<<grid, T::kThreads, smem_bytes, stream>>>(a);
        TMS_CUDA_CHECK_LAUNCH();
        return Status::OK();
    }
    static Status Occupancy(size_t smem_bytes, int* blocks_per_sm) {
        TMS_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(maxsim_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                      int(smem_bytes)));
        TMS_CUDA_RETURN_IF_ERROR(
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, maxsim_kernel<T>, T::kThreads, smem_bytes));
        return Status::OK();
    }
};

// The instantiations that exist (kernels/cuda/instances/, generated by generate.py).
#define TMS_MAXSIM_FOR_EACH_INSTANCE(X) \
    X(__half, false, 2)                 \
    X(__half, false, 4)                 \
    X(__half, true, 2)                  \
    X(__half, true, 4)                  \
    X(__nv_bfloat16, false, 2)          \
    X(__nv_bfloat16, false, 4)          \
    X(__nv_bfloat16, true, 2)           \
    X(__nv_bfloat16, true, 4)           \
    X(float, true, 2)                   \
    X(float, true, 4)

#define TMS_MAXSIM_EXTERN(TD, SPLIT, MT) extern template struct MaxSimKernel<MaxSimTraits<TD, SPLIT, MT>>;

}  // namespace tms::kernels::cuda_impl

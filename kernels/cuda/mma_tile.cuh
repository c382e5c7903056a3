// Copyright TileMaxSim authors. What the exact and the compressed MaxSim kernels share (device
// code): shared-memory vector loads, the m16n8k16 MMA, and the MaxSim epilogue of a warp's
// accumulator tiles (running per-query-row maxima, then the sum over valid rows).
//
// Fragment layout (mma.m16n8k16, fp32 accumulators): lane g*4+t holds, of each n8 tile n and
// m16 tile m, columns (document tokens) 2t and 2t+1 of rows g (acc[m][n][0..1]) and g+8
// (acc[m][n][2..3]); rmax[m][0] / rmax[m][1] are the lane's maxima of rows m*16+g / m*16+8+g.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace tms::kernels::mma_tile {

__device__ __forceinline__ uint4 lds128(const unsigned char* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ uint2 lds64(const unsigned char* p) { return *reinterpret_cast<const uint2*>(p); }
__device__ __forceinline__ uint32_t lds32(const unsigned char* p) { return *reinterpret_cast<const uint32_t*>(p); }

/// Query rows in A-fragment order. The 16 bytes lane L passes to mma.m16n8k16 as a0..a3 for
/// m16 tile m, 32-dim chunk c and k half h lie at a_frag_offset(m, c, h, L): a0 / a2 hold
/// row m*16 + g, dims c*32 + 8t + 4h + {0,1} / {2,3}, a1 / a3 the same dims of row m*16 + g + 8
/// (g = L / 4, t = L % 4; the k order inside a chunk is permuted the same way on the B side,
/// where lane L holds token g, dims 8t..8t+7). One ld.shared.v4 per fragment, 32 lanes reading
/// 512 consecutive bytes: no bank conflicts, and the registers arrive in operand order.
/// A group of 16*kM rows x dim takes kM * dim * 32 bytes (dim / 32 chunks of 1 KB per tile).
__device__ __forceinline__ int a_frag_offset(int m, int c, int h, int lane, int n_chunks) {
    return ((m * n_chunks + c) * 2 + h) * 512 + lane * 16;
}

/// Inverse of a_frag_offset for filling: 4-byte word w of the layout holds the two values of
/// `row` (within the group) at dims `dim`, `dim` + 1.
__device__ __forceinline__ void a_frag_word(int w, int n_chunks, int& row, int& dim) {
    const int j = w & 3, lane = (w >> 2) & 31, block = w >> 7;
    const int h = block & 1, mc = block >> 1;
    const int c = mc % n_chunks, m = mc / n_chunks;
    row = m * 16 + (lane >> 2) + (j & 1) * 8;
    dim = c * 32 + 8 * (lane & 3) + 4 * h + (j >> 1) * 2;
}

/// a_frag_word's forward map: the word of the layout that holds `row` (within the group) at dims
/// `dim` (even) and `dim` + 1.
__device__ __forceinline__ int a_frag_word_index(int row, int dim, int n_chunks) {
    const int m = row >> 4, g = row & 7, jlo = (row >> 3) & 1;
    const int c = dim >> 5, t = (dim >> 3) & 3, h = (dim >> 2) & 1, jhi = (dim >> 1) & 1;
    return ((m * n_chunks + c) * 2 + h) * 128 + (g * 4 + t) * 4 + jhi * 2 + jlo;
}

/// The A-fragment layout for B fragments whose lane t holds dims 4t..4t+3 and 16+4t..16+4t+3
/// of each 32-dim chunk (fp32 documents in 256-byte units: pieces t and t + 4 of a 128-byte
/// row, so that the two tokens of a shared-memory phase fall in different banks): the same
/// 512-byte blocks and lanes as a_frag_word_index, with k half h = bit 4 of the dim inside the
/// chunk and t = its bits 2-3 (a0 / a2: row g, dims 16h + 4t + {0,1} / {2,3}).
__device__ __forceinline__ int a_frag_word_index_quads(int row, int dim, int n_chunks) {
    const int m = row >> 4, g = row & 7, jlo = (row >> 3) & 1;
    const int c = dim >> 5, t = (dim >> 2) & 3, h = (dim >> 4) & 1, jhi = (dim >> 1) & 1;
    return ((m * n_chunks + c) * 2 + h) * 128 + (g * 4 + t) * 4 + jhi * 2 + jlo;
}

/// The value of element e (0..7) of 8 consecutive query elements held raw in r[0] (16-bit:
/// all 8) or r[0], r[1] (fp32); dtype as tms::DType (0 fp32, 1 fp16, 2 bf16).
__device__ __forceinline__ float raw_elem(const uint4 (&r)[2], int e, int dtype) {
    if (dtype == 0) {
        const uint4& v = r[e >> 2];
        const uint32_t w = (e & 3) == 0 ? v.x : (e & 3) == 1 ? v.y : (e & 3) == 2 ? v.z : v.w;
        return __uint_as_float(w);
    }
    const uint32_t w2 = (e >> 1) == 0 ? r[0].x : (e >> 1) == 1 ? r[0].y : (e >> 1) == 2 ? r[0].z : r[0].w;
    const uint32_t bits = (e & 1) ? (w2 >> 16) : (w2 & 0xffffu);
    return dtype == 1 ? __half2float(__ushort_as_half(static_cast<unsigned short>(bits))) : __uint_as_float(bits << 16);
}

/// The A-fragment layout's word index (a_frag_word_index) as a function object: the default
/// layout of the fills below.
struct AFragIndex {
    int n_chunks;
    __device__ __forceinline__ int operator()(int row, int dim) const { return a_frag_word_index(row, dim, n_chunks); }
};

/// a_frag_word_index_quads as a function object.
struct AFragIndexQuads {
    int n_chunks;
    __device__ __forceinline__ int operator()(int row, int dim) const {
        return a_frag_word_index_quads(row, dim, n_chunks);
    }
};

/// put_raw8 into any layout: index(row, dim) is the word that holds `row` at dims dim, dim + 1.
template <class Index, class Put>
__device__ __forceinline__ void put_raw8_as(const Index& index, int r, int c, const uint4 (&raw)[2], int dtype,
                                            const Put& put) {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        put(index(r, c + 2 * p), raw_elem(raw, 2 * p, dtype), raw_elem(raw, 2 * p + 1, dtype));
    }
}

/// Stores 8 consecutive query values of group row r, dims c .. c+7 (c a multiple of 8), held
/// raw as for raw_elem, through put(word, v0, v1): the four A-fragment words they fill.
template <class Put>
__device__ __forceinline__ void put_raw8(int r, int c, const uint4 (&raw)[2], int dtype, int n_chunks, const Put& put) {
    put_raw8_as(AFragIndex{n_chunks}, r, c, raw, dtype, put);
}

/// Fills a group of query rows in the layout of index (AFragIndex: A-fragment order): row r <
/// rows of the group is src row r (dim values, dtype as raw_elem, rows dim elements apart), rows
/// at or past rows_valid are 0; put(word, v0, v1) stores the pair of values of one layout word. Each thread loads 8
/// values with one (fp32: two) 16-byte loads, kU such vectors in flight before it converts
/// any, so that a 32-row x 128-dim group arrives in one round trip (one word per scalar load
/// costs the block eight dependent ones). src must be 16-byte aligned.
template <int kThreads, int kU = 4, class Index, class Put>
__device__ __forceinline__ void fill_rows_as(const Index& index, const void* src, int dtype, int rows, int rows_valid,
                                             int dim, const Put& put) {
    const unsigned char* s = static_cast<const unsigned char*>(src);
    const int vpr = dim >> 3, n_vec = rows * vpr, esize = dtype == 0 ? 4 : 2;
    for (int v0 = threadIdx.x; v0 < n_vec; v0 += kU * kThreads) {
        uint4 raw[kU][2];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
            const int v = v0 + u * kThreads, r = v / vpr, c = (v - r * vpr) * 8;
            raw[u][0] = raw[u][1] = make_uint4(0, 0, 0, 0);
            if (v < n_vec && r < rows_valid) {
                const uint4* p = reinterpret_cast<const uint4*>(s + (int64_t(r) * dim + c) * esize);
                raw[u][0] = p[0];
                if (esize == 4) raw[u][1] = p[1];
            }
        }
#pragma unroll
        for (int u = 0; u < kU; ++u) {
            const int v = v0 + u * kThreads, r = v / vpr, c = (v - r * vpr) * 8;
            if (v >= n_vec) break;
            put_raw8_as(index, r, c, raw[u], dtype, put);
        }
    }
}

/// fill_rows_as into the A-fragment layout.
template <int kThreads, int kU = 4, class Put>
__device__ __forceinline__ void fill_a_frag_rows(const void* src, int dtype, int rows, int rows_valid, int dim,
                                                 const Put& put) {
    fill_rows_as<kThreads, kU>(AFragIndex{dim >> 5}, src, dtype, rows, rows_valid, dim, put);
}

/// The first lane of `mask` after lane u, or 32: the next non-empty item of a warp's walk
/// over the 32 items whose metadata its lanes hold.
__device__ __forceinline__ int next_lane(unsigned mask, int u) {
    const unsigned rest = u >= 31 ? 0u : (mask & (0xffffffffu << (u + 1)));
    return rest ? __ffs(rest) - 1 : 32;
}

/// d += A (16x16, row) * B (16x8, col), fp16 or bf16 inputs, fp32 accumulators.
template <bool kBF16>
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    if constexpr (kBF16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
}

/// Which tokens of an n8 tile a lane's two accumulator columns hold (fold_step_max): 2t and
/// 2t + 1 (B fragments read in token order), t and t + 4 (kTokHalves: in the order
/// g/2 + 4*(g%2)), or (t & 2) * 2 + (t & 1) and that + 2 (kTokPairRows: in the order
/// (g & 4) | (g & 1) * 2 | (g / 2) & 1).
enum : int { kTokInOrder = 0, kTokHalves = 1, kTokPairRows = 2 };

/// Folds one step's accumulators (document tokens s0 .. s0 + 8*kN) into the running row maxima;
/// columns at or past n_tok are ignored unless the step is `full`. kTokPerm: which tokens the
/// lane's two columns of each n8 tile hold (kTokInOrder, kTokHalves, kTokPairRows).
template <int kM, int kN, int kTokPerm = kTokInOrder>
__device__ __forceinline__ void fold_step_max(float (&rmax)[kM][2], const float (&acc)[kM][kN][4], int s0, int n_tok,
                                              int t, bool full) {
    if (full) {  // warp-uniform: no masks on a step of whole tiles
#pragma unroll
        for (int n = 0; n < kN; ++n)
#pragma unroll
            for (int m = 0; m < kM; ++m) {
                rmax[m][0] = fmaxf(rmax[m][0], fmaxf(acc[m][n][0], acc[m][n][1]));
                rmax[m][1] = fmaxf(rmax[m][1], fmaxf(acc[m][n][2], acc[m][n][3]));
            }
        return;
    }
#pragma unroll
    for (int n = 0; n < kN; ++n) {
        const int first = kTokPerm == kTokHalves ? t : kTokPerm == kTokPairRows ? ((t & 2) << 1) | (t & 1) : 2 * t;
        const int col = s0 + n * 8 + first;
        const int next = kTokPerm == kTokHalves ? 4 : kTokPerm == kTokPairRows ? 2 : 1;
        const bool ok0 = full || col < n_tok, ok1 = full || col + next < n_tok;
#pragma unroll
        for (int m = 0; m < kM; ++m) {
            const float c0 = ok0 ? acc[m][n][0] : -INFINITY, c1 = ok1 ? acc[m][n][1] : -INFINITY;
            const float c2 = ok0 ? acc[m][n][2] : -INFINITY, c3 = ok1 ? acc[m][n][3] : -INFINITY;
            rmax[m][0] = fmaxf(rmax[m][0], fmaxf(c0, c1));
            rmax[m][1] = fmaxf(rmax[m][1], fmaxf(c2, c3));
        }
    }
}

/// The document's score for this group of rows: each row's maximum over the lanes that share
/// it, summed over the rows below rows_valid; every lane returns the sum.
template <int kM>
__device__ __forceinline__ float sum_row_maxima(const float (&rmax)[kM][2], int rows_valid, int g) {
    float sum = 0.f;
#pragma unroll
    for (int m = 0; m < kM; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float v = rmax[m][h];
            v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
            v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
            if (m * 16 + h * 8 + g < rows_valid) sum += v;
        }
    sum += __shfl_xor_sync(0xffffffffu, sum, 4);
    sum += __shfl_xor_sync(0xffffffffu, sum, 8);
    sum += __shfl_xor_sync(0xffffffffu, sum, 16);
    return sum;
}

}  // namespace tms::kernels::mma_tile

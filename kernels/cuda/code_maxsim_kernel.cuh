// Copyright TileMaxSim authors.
// Compressed (PQ / PLAID residual) fused MaxSim kernels (device code; included by
// code_maxsim.cu). score(q, d) = sum_i max_t (cs[q, i, cid_t] + <q_i, r_t>), where the
// residual r_t is decoded from the codebook in shared memory.
//
// Mapping (CodeTraits<kSub, kBook>, kWarps = 8 warps, 256 threads per CTA), as the exact kernel:
//   grid.y  -> query q (grid-stride when n_queries > 65535)
//   grid.x  -> slice s of query q's item list (dense: documents; ragged: candidates).
//   warp w  -> items b0 + w + 8*u of each batch of 256 items; lane u holds item u's metadata.
//   warp step: 32 document tokens (4 n8 tiles) x all dims, 32 query rows (2 m16 tiles).
//     Each warp walks the steps of its items in order through two shared-memory stages:
//     cp.async copies the next step's 32 centroid ids and code rows (across document
//     boundaries) while the current step is scored.
//     Accumulators start at the centroid scores: lane g*4+t owns accumulator columns
//     (tokens) 2t, 2t+1 of each n8 tile and rows g, g+8, g+16, g+24; the table stores a
//     token's 32 rows permuted so those four are one 8-byte load (slot g*4 + m*2 + h holds
//     row m*16 + h*8 + g), gathered from L2 by the staged centroid ids.
//     Residual: lane g*4+t holds, as the B fragment of mma.m16n8k16, token g's dims
//     8t..8t+7 of each 32-dim chunk (k order permuted identically on the query side, whose
//     rows sit in A-fragment order: mma_tile::a_frag_offset). Those 8 dims are decoded from
//     the staged code bytes that cover them (1 byte when dsub >= 8, 2 when dsub = 4, 4 when
//     dsub = 2) by 16/8/4-byte reads of the fp16 codebook in shared memory, straight into
//     registers. The codebook's layout (kBook) keeps those reads free of bank conflicts where
//     it can: kBookShared (residual codecs: every code byte uses the same block, dsub = kSub)
//     keeps one block, replicated so that the lanes of a shared-memory phase never share a
//     bank; kBookPaired (dsub 2, 4 or 8, dim % 64 == 0: PQ) interleaves the blocks so that the
//     lanes of a phase, reading chunks and blocks in lane-dependent orders, hit distinct
//     slots; kBookPerByte (other shapes) keeps [n_code_bytes][256][dsub] as given.
//     kSub = 0 (centroid-only) skips the residual: no MMAs, no query rows in shared memory.
//   Warpgroup-MMA variant (CodeTraits::kWg: sm_90a, dim 128, scores mode): the same walk and
//     decode, but the documents are the M side of wgmma m64n32k16: each warp's step is two
//     16-token tiles whose decoded dims go straight into A-fragment registers (lane g*4+t: tokens
//     g and g+8 of the tile, dims 8t..8t+7 of each chunk; residual codecs: 32t..32t+31 over the
//     4 chunks, kLaneMajor), the query group is the B operand in
//     shared memory (wg_b_word), and lane g*4+t's accumulator columns are table slots 8t..8t+7.
//     The per-token scores are folded into the column maxima in fp16 (wg_fold).
//     The 4 warps of a warpgroup issue their wgmmas together, so they walk the same number of
//     steps (warp_items_code_wg, which also has the pipeline).
//   Query tokens are processed 32 at a time (a "group"); longer queries revisit the batch.
// Shared memory per CTA: the fp16 codebook (n_code_bytes * 256 * dsub * 2 = dim * 512 bytes,
//   per-byte or paired; kBookShared: 256 entries x 256 bytes), 32 query rows (dim * 64 bytes),
//   then each warp's two stages (stage_bytes); in top-k mode (CodeTraits::kTopK) each warp's
//   sorted list of k keys and the 8 list lengths; kWg: two sets of 8 step counts. dim = 128:
//   PQ-16 64 + 8 + 10 KB, 2-bit residual 64 + 8 + 18 KB, plus 64 KB of lists at k = 1024.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mma_tile.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/topk_device.cuh"
#include "kernels/cuda/wgmma.cuh"
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
    int codes_aligned16;  // codes 16-byte aligned and n_code_bytes % 16 == 0
    int dsub;
    uint32_t dsub_magic;  // ceil(2^32 / dsub)
    const float* codebook;
    const int64_t* doc_offsets;
    int64_t n_docs;
    const int64_t* cand_offsets;
    const int32_t* cand_docs;
    float* scores;           // scores mode (CodeTraits::kTopK false)
    uint64_t* topk_partial;  // top-k mode: [n_queries, n_slices, k] sorted keys (topk_device.cuh)
    int k;
    int cb_smem_bytes;              // fp16 codebook bytes in shared memory
    const unsigned char* cb_image;  // that fp16 codebook prepared (write_codebook), or null
    const float* token_scales;      // CodeMaxSimParams::token_scales (codes only), or null
};

/// How the kernel holds the codebook in shared memory (CodeTraits::kBook).
enum : int {
    /// [n_code_bytes][256][dsub] fp16, as given.
    kBookPerByte = 0,
    /// One block for every code byte (residual codecs), dsub == kSub: kept replicated so that
    /// the gathers are free of bank conflicts. Entry `code` takes 256 bytes (256 / (2 * dsub)
    /// replicas), so that a lane's offset is one byte permute (shared_entry).
    kBookShared = 1,
    /// dsub == kSub (2, 4 or 8: PQ with 2-, 4- or 8-dim sub-vectors), dim % 64 == 0: the
    /// fp16 entries (2 * dsub bytes) of P = 64 / dsub consecutive blocks share each 128-byte row
    /// (block b in slot b % P), and the lanes of one shared-memory phase (P of them) read P
    /// different blocks: lanes of odd token rows take the chunks of a pair in the other order,
    /// and (dsub < 8) the lane's 8 / dsub blocks of a chunk are read in an order rotated by
    /// (row / 2) % (8 / dsub). No bank conflicts for any codes; select instructions put the
    /// registers back in order. dsub 2 (PQ-64 at dim 128): each 4-byte gather was otherwise
    /// ~3.4 wavefronts a warp (banks follow the codes) against 1, for 24 selects a token row and
    /// chunk pair.
    kBookPaired = 2,
};

template <int kSub_, int kBook_ = kBookPerByte, bool kTopK_ = false, bool kQReg_ = false, bool kWg_ = false>
struct CodeTraits {
    static constexpr int kSub = kSub_;  // 0: centroid-only; 2, 4: dsub; 8: dsub a multiple of 8
    static constexpr int kBook = kBook_;
    /// Per-query top-k lists (CodeArgs::topk_partial) instead of scores: a separate
    /// instantiation, so that the scoring one keeps its registers.
    static constexpr bool kTopK = kTopK_;
    /// dim <= 128: the query group's A fragments (kQChunks chunks) are loaded into registers once
    /// per walk, and each step runs tile by tile (the 8 tokens of one n8 tile through every
    /// chunk), so that its accumulators take 8 registers instead of 32 and the step reads no
    /// query rows from shared memory (64 of its ~150-360 shared-load wavefronts). Instantiated
    /// for 2-dim sub-vectors in the per-byte layout only (dim 32 or 96; at dim 64 and 128 the
    /// paired layout is faster), scores mode; for the other classes it is not faster (the freed
    /// L1 pipe is taken over by MMA dependency stalls with 16 warps an SM).
    static constexpr bool kQReg = kQReg_;
    static constexpr int kQChunks = 4;
    /// Hopper warpgroup MMA (sm_90a, dim 128, scores mode): the documents are the M side. Each
    /// warp of a warpgroup walks its own items as before; the 4 warps issue wgmma m64n32k16
    /// together, each with 16 tokens decoded straight into A-fragment registers, the query group
    /// (B) read by the tensor cores from shared memory (wg_b_word). No query-fragment loads, one
    /// wgmma per 64 tokens x 16 dims instead of 16 mma.sync, 16 accumulators a lane. Warps of a
    /// warpgroup run the same number of steps per walk: one with fewer pads with empty ones
    /// (wgmma instructions are warpgroup-collective).
    static constexpr bool kWg = kWg_;
    static constexpr bool kShared = kBook == kBookShared;
    /// kWg with the shared block (2- and 4-bit residual): lane g*4+t holds a token's dims
    /// 32t + 8c .. 32t + 8c + 7 as its 8 dims of chunk c (not 32c + 8t ..), so that its code bytes
    /// of a chunk pair are one or two 32-bit words (wg_decode_pair); the B operand follows
    /// (wg_b_word).
    static constexpr bool kLaneMajor = kWg && kShared && kSub != 8;
    static constexpr bool kPaired = kBook == kBookPaired;
    static constexpr int kEntryBytes = 2 * kSub;                         // one fp16 entry
    static constexpr int kReplicas = kSub == 0 ? 0 : 128 / kEntryBytes;  // lanes of one LDS phase
    static constexpr int kWarps = 8;
    static constexpr int kThreads = 32 * kWarps;
    static constexpr int kMinBlocksPerSM = 2;
    static constexpr int kMTiles = 2;
    static constexpr int kRows = 16 * kMTiles;  // query rows per group
    static constexpr int kNTiles = 4;
    static constexpr int kStepTokens = 8 * kNTiles;
    static constexpr int kBatch = 32;
    static_assert(kSub == 0 || kSub == 2 || kSub == 4 || kSub == 8, "dsub class");
    static_assert(!kShared || kSub != 0, "a shared block needs codes");
    static_assert(!kPaired || kSub >= 2, "paired blocks of 2, 4 or 8 dims");
    static_assert(!kQReg || kSub != 0, "query fragments in registers need codes");
    static_assert(!kWg || (kSub != 0 && !kQReg && !kTopK), "warpgroup MMA: codes, scores mode");
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

/// kBookShared: 256 bytes an entry.
constexpr int kSharedEntryStride = 256;

/// kBookShared: the byte offset in the codebook of the lane's replica of the entry whose code is
/// byte k of w: the code in byte 1, rep_off (below 256) in byte 0, one PRMT.
template <int k>
__device__ __forceinline__ uint32_t shared_entry(uint32_t w, uint32_t rep_off) {
    return __byte_perm(w, rep_off, 0x5504u | (k << 4));
}

/// The 8 fp16 residual values (4 registers) of token row `crow` (shared memory), dims d0..d0+7,
/// which lie in code byte b (at offset off of its block; kSub = 8) or bytes b.. (kSub = 4, 2).
/// Per-codebook layout: [n_code_bytes][256][dsub] fp16. Shared layout (T::kShared): entry e of
/// replica r at e * 256 + r * kEntryBytes, lane reads replica lane % kReplicas, so the lanes of
/// one shared-memory phase always hit distinct banks.
template <class T>
__device__ __forceinline__ uint4 decode8(const unsigned char* crow, int b, int off, int dsub, const unsigned char* cb,
                                         int rep_off) {
    if constexpr (T::kSub == 8) {
        const uint32_t code = crow[b];
        if constexpr (T::kShared) return lds128(cb + shared_entry<0>(code, rep_off));
        return lds128(cb + ((size_t(b) * 256 + code) * dsub + off) * 2);
    } else if constexpr (T::kSub == 4) {
        const uint32_t c2 = *reinterpret_cast<const uint16_t*>(crow + b);
        uint2 lo, hi;
        if constexpr (T::kShared) {
            lo = lds64(cb + shared_entry<0>(c2, rep_off));
            hi = lds64(cb + shared_entry<1>(c2, rep_off));
        } else {
            lo = lds64(cb + ((b * 256 + (c2 & 0xff)) * 4) * 2);
            hi = lds64(cb + (((b + 1) * 256 + (c2 >> 8)) * 4) * 2);
        }
        return make_uint4(lo.x, lo.y, hi.x, hi.y);
    } else {
        const uint32_t c4 = lds32(crow + b);
        uint4 r;
        if constexpr (T::kShared) {
            r.x = lds32(cb + shared_entry<0>(c4, rep_off));
            r.y = lds32(cb + shared_entry<1>(c4, rep_off));
            r.z = lds32(cb + shared_entry<2>(c4, rep_off));
            r.w = lds32(cb + shared_entry<3>(c4, rep_off));
        } else {
            r.x = lds32(cb + ((b * 256 + (c4 & 0xff)) * 2) * 2);
            r.y = lds32(cb + (((b + 1) * 256 + ((c4 >> 8) & 0xff)) * 2) * 2);
            r.z = lds32(cb + (((b + 2) * 256 + ((c4 >> 16) & 0xff)) * 2) * 2);
            r.w = lds32(cb + (((b + 3) * 256 + (c4 >> 24)) * 2) * 2);
        }
        return r;
    }
}

/// Byte offset in shared memory of entry `code` of block b (kBookPaired, dsub = D): slot b % P
/// of row (b / P) * 256 + code, P = 64 / D blocks a row.
template <int D>
__device__ __forceinline__ int paired_offset(int b, uint32_t code) {
    constexpr int P = 64 / D, E = 2 * D;
    return (((b / P) * 256 + int(code)) << 7) + (b % P) * E;
}

/// kBookPaired: the lane's 8 fp16 dims of one chunk for the token whose code row is crow: the
/// 8 / D entries of blocks b0 .. b0 + 8/D - 1, read in an order rotated by r.
template <int D>
__device__ __forceinline__ uint4 paired_decode8(const unsigned char* cb, const unsigned char* crow, int b0, int r) {
    if constexpr (D == 8) {
        return lds128(cb + paired_offset<8>(b0, crow[b0]));
    } else if constexpr (D == 2) {
        // Blocks b0 .. b0 + 3 (b0 % 4 == 0: one row group, adjacent slots): read j takes block
        // b0 + ((j + r) & 3), so e[j] holds entry (j + r) & 3; two conditional rotations put them
        // back in order.
        const uint32_t c4 = lds32(crow + b0);
        const int base = paired_offset<2>(b0, 0u);
        uint32_t e[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int k = (j + r) & 3;
            e[j] = lds32(cb + base + int(__byte_perm(c4, 0u, 0x4440u | uint32_t(k))) * 128 + 4 * k);
        }
        if (r & 1) {  // each value one place up (e[0] <- e[3]): e[j] then holds entry (j + (r & 2)) & 3
            const uint32_t x = e[3];
            e[3] = e[2];
            e[2] = e[1];
            e[1] = e[0];
            e[0] = x;
        }
        if (r & 2) {
            uint32_t x = e[0];
            e[0] = e[2];
            e[2] = x;
            x = e[1];
            e[1] = e[3];
            e[3] = x;
        }
        return make_uint4(e[0], e[1], e[2], e[3]);
    } else {
        static_assert(D == 4, "dsub 2, 4 or 8");
        const uint32_t c2 = *reinterpret_cast<const uint16_t*>(crow + b0);
        const int j0 = r, j1 = r ^ 1;
        const uint2 t0 = lds64(cb + paired_offset<4>(b0 + j0, (c2 >> (8 * j0)) & 0xff));
        const uint2 t1 = lds64(cb + paired_offset<4>(b0 + j1, (c2 >> (8 * j1)) & 0xff));
        return r ? make_uint4(t1.x, t1.y, t0.x, t0.y) : make_uint4(t0.x, t0.y, t1.x, t1.y);
    }
}

/// The code byte b holding dims 32c + 8t .. of chunk c (lane g*4+t), and (kSub = 8) their offset
/// in its block: d0 / dsub by a multiply-high with a.dsub_magic = ceil(2^32 / dsub), exact for
/// d0 < 2^16. Decode classes other than kBookPaired.
template <class T>
__device__ __forceinline__ void chunk_code_byte(const CodeArgs& a, int c, int t, int& b, int& off) {
    const int d0 = c * 32 + 8 * t;
    b = T::kSub == 8 ? int(__umulhi(uint32_t(d0), a.dsub_magic)) : d0 / T::kSub;
    off = d0 - b * a.dsub;
}

/// kBookPaired: the first blocks of the lane's 8 dims of chunks c + odd (b0) and c + 1 - odd (b1),
/// read in that order: lanes of even token rows (odd = 0) read chunk c first, odd rows chunk
/// c + 1 first; with the rotation (row / 2) % (8 / D) of paired_decode8, one phase's lanes read
/// distinct slots.
template <int D>
__device__ __forceinline__ void paired_blocks(int c, int t, int odd, int& b0, int& b1) {
    b0 = (32 * (c + odd) + 8 * t) / D;
    b1 = (32 * (c + 1 - odd) + 8 * t) / D;
}

/// Bytes of one warp's stage: 32 centroid ids, then (with codes) the code rows of 32 tokens
/// from the 16-byte boundary at or below the first one (so the copies keep global alignment),
/// then the 32 tokens' scales (CodeArgs::token_scales, fp32; copied only when there are any).
__host__ __device__ constexpr int stage_bytes(int n_code_bytes) {
    return 128 + (n_code_bytes == 0 ? 0 : (32 * n_code_bytes + 16 + 15) / 16 * 16 + 128);
}

/// The token scales of a stage (its last 128 bytes; n_code_bytes > 0).
__device__ __forceinline__ const float* stage_scales(const unsigned char* st, int n_code_bytes) {
    return reinterpret_cast<const float*>(st + stage_bytes(n_code_bytes) - 128);
}

/// Where token tok0's code row starts in a stage that holds it first (stage_step copies from the
/// 16-byte boundary at or below it): bytes past st + 128.
__device__ __forceinline__ int stage_code_off(const CodeArgs& a, int64_t tok0) {
    return int(reinterpret_cast<uintptr_t>(a.codes + tok0 * a.n_code_bytes) & 15);
}

/// Issues (no wait) the copies of tokens [tok0, tok0 + nv) of one step into stage `st`:
/// centroid ids at st[0..4*nv), code rows at st + 128 + (first code byte's address & 15).
/// Whole 16-byte pieces go by cp.async 16, whole aligned words by cp.async 4, the rest (only
/// when n_code_bytes % 4 != 0) by plain loads and stores.
__device__ __forceinline__ void stage_step(const CodeArgs& a, int64_t tok0, int nv, unsigned char* st, int lane) {
    if (lane < nv) async_copy::cp4(st + lane * 4, a.token_centroids + tok0 + lane);
    if (a.n_code_bytes == 0) return;
    if (a.token_scales != nullptr && lane < nv) {
        async_copy::cp4(st + stage_bytes(a.n_code_bytes) - 128 + lane * 4, a.token_scales + tok0 + lane);
    }
    if (a.codes_aligned16) {  // every row starts on a 16-byte boundary: whole pieces only
        const int n_pieces = nv * a.n_code_bytes / 16;
        const unsigned char* src = a.codes + tok0 * a.n_code_bytes;
        for (int k = lane; k < n_pieces; k += 32) async_copy::cp16(st + 128 + k * 16, src + k * 16);
        return;
    }
    const uintptr_t lo = reinterpret_cast<uintptr_t>(a.codes + tok0 * a.n_code_bytes);
    const uintptr_t hi = lo + uintptr_t(nv) * a.n_code_bytes;
    const uintptr_t base = lo & ~uintptr_t(15);
    const int n_pieces = int((hi + 15 - base) >> 4);
    unsigned char* dst = st + 128;
    for (int k = lane; k < n_pieces; k += 32) {
        const uintptr_t p = base + uintptr_t(k) * 16;
        if (p >= lo && p + 16 <= hi) {
            async_copy::cp16(dst + k * 16, reinterpret_cast<const void*>(p));
            continue;
        }
        for (int w = 0; w < 16; w += 4) {
            const uintptr_t pw = p + w;
            if (pw >= lo && pw + 4 <= hi) {
                async_copy::cp4(dst + k * 16 + w, reinterpret_cast<const void*>(pw));
            } else {
                for (int j = 0; j < 4; ++j)
                    if (pw + j >= lo && pw + j < hi) dst[k * 16 + w + j] = *reinterpret_cast<const uint8_t*>(pw + j);
            }
        }
    }
}

/// The centroid scores of tokens j = 8n + 2t and j + 1 of a step's n8 tile n (lane g*4+t),
/// gathered from L2 by the staged centroid ids cid_s: each is the lane's 8-byte slice of its
/// token's 32 table slots (rows g, g+8 of m-tiles 0 and 1). Tokens at or past nv read centroid 0.
__device__ __forceinline__ void table_pair(const uint32_t* cid_s, int n, int nv, const __half* table_g, int g, int t,
                                           uint2& v0, uint2& v1) {
    const int j = n * 8 + 2 * t;
    const uint2 cc = *reinterpret_cast<const uint2*>(cid_s + j);
    const uint32_t c0 = j < nv ? cc.x : 0u, c1 = j + 1 < nv ? cc.y : 0u;
    v0 = __ldg(reinterpret_cast<const uint2*>(table_g + size_t(c0) * 32 + g * 4));
    v1 = __ldg(reinterpret_cast<const uint2*>(table_g + size_t(c1) * 32 + g * 4));
}

/// A tile's accumulators of m-tiles 0 (a0) and 1 (a1) set to the centroid scores of table_pair.
__device__ __forceinline__ void acc_from_table(const uint2& v0, const uint2& v1, float (&a0)[4], float (&a1)[4]) {
    const float2 a00 = __half22float2(*reinterpret_cast<const __half2*>(&v0.x));  // m0: rows g, g+8
    const float2 a01 = __half22float2(*reinterpret_cast<const __half2*>(&v0.y));  // m1
    const float2 a10 = __half22float2(*reinterpret_cast<const __half2*>(&v1.x));
    const float2 a11 = __half22float2(*reinterpret_cast<const __half2*>(&v1.y));
    a0[0] = a00.x;
    a0[1] = a10.x;
    a0[2] = a00.y;
    a0[3] = a10.y;
    a1[0] = a01.x;
    a1[1] = a11.x;
    a1[2] = a01.y;
    a1[3] = a11.y;
}

/// Each accumulator column of a step's n8 tiles (lane g*4+t: tokens 8n + 2t and 8n + 2t + 1 of
/// tile n) multiplied by its token's scale (scl: the step's 32 scales).
template <int kM, int kN>
__device__ __forceinline__ void scale_columns(float (&acc)[kM][kN][4], const float* scl, int t) {
#pragma unroll
    for (int n = 0; n < kN; ++n) {
        const float2 s = *reinterpret_cast<const float2*>(scl + n * 8 + 2 * t);
#pragma unroll
        for (int m = 0; m < kM; ++m) {
            acc[m][n][0] *= s.x;
            acc[m][n][1] *= s.y;
            acc[m][n][2] *= s.x;
            acc[m][n][3] *= s.y;
        }
    }
}

/// One 32-token step of one document from stage `st` (tokens s0 .. s0 + 31 of n_tok; the
/// stage holds tokens s0 .. min(s0 + 32, n_tok) - 1), folded into the running row maxima.
template <class T>
__device__ __forceinline__ void warp_step_code(const CodeArgs& a, const unsigned char* st, int code_off, int s0,
                                               int n_tok, const __half* table_g, const unsigned char* cb,
                                               const unsigned char* q_s, int lane, float (&rmax)[T::kMTiles][2]) {
    constexpr int kM = T::kMTiles, kN = T::kNTiles;
    const int g = lane >> 2, t = lane & 3;
    const int nv = n_tok - s0;  // tokens of this step in the stage (more than 32: all 32)
    const uint32_t* cid_s = reinterpret_cast<const uint32_t*>(st);
    float acc[kM][kN][4];
#pragma unroll
    for (int n = 0; n < kN; ++n) {
        uint2 v0, v1;
        table_pair(cid_s, n, nv, table_g, g, t, v0, v1);
        acc_from_table(v0, v1, acc[0][n], acc[1][n]);
    }
    if constexpr (T::kSub != 0) {
        const unsigned char* crow[kN];
#pragma unroll
        for (int n = 0; n < kN; ++n) crow[n] = st + 128 + code_off + (n * 8 + g) * a.n_code_bytes;
        const int n_chunks = a.dim >> 5;
        // acc += Q(chunk c) x B: k 0..15 of every tile, then k 16..31 (8 MMAs between two into
        // one accumulator).
        auto mma_chunk = [&](int c, const uint4(&bf)[kN]) {
            uint4 qf[kM][2];
#pragma unroll
            for (int m = 0; m < kM; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h) qf[m][h] = lds128(q_s + mma_tile::a_frag_offset(m, c, h, lane, n_chunks));
#pragma unroll
            for (int n = 0; n < kN; ++n)
#pragma unroll
                for (int m = 0; m < kM; ++m)
                    mma16816<false>(acc[m][n], qf[m][0].x, qf[m][0].y, qf[m][0].z, qf[m][0].w, bf[n].x, bf[n].y);
#pragma unroll
            for (int n = 0; n < kN; ++n)
#pragma unroll
                for (int m = 0; m < kM; ++m)
                    mma16816<false>(acc[m][n], qf[m][1].x, qf[m][1].y, qf[m][1].z, qf[m][1].w, bf[n].z, bf[n].w);
        };
        if constexpr (T::kPaired) {
            // Chunks c, c+1 (n_chunks is even): lanes of even token rows read chunk c first, odd
            // rows chunk c+1 first; with the rotation r, one phase's lanes read distinct slots.
            constexpr int D = T::kSub;
            const int odd = g & 1, r = (g >> 1) & (8 / D - 1);
            for (int c = 0; c < n_chunks; c += 2) {
                int b0, b1;
                paired_blocks<D>(c, t, odd, b0, b1);
                uint4 r0[kN], r1[kN];
#pragma unroll
                for (int n = 0; n < kN; ++n) r0[n] = paired_decode8<D>(cb, crow[n], b0, r);
#pragma unroll
                for (int n = 0; n < kN; ++n) r1[n] = paired_decode8<D>(cb, crow[n], b1, r);
                uint4 bf[kN];
#pragma unroll
                for (int n = 0; n < kN; ++n) bf[n] = odd ? r1[n] : r0[n];
                mma_chunk(c, bf);
#pragma unroll
                for (int n = 0; n < kN; ++n) bf[n] = odd ? r0[n] : r1[n];
                mma_chunk(c + 1, bf);
            }
        } else {
            const int rep_off = T::kShared ? (lane % T::kReplicas) * T::kEntryBytes : 0;
            for (int c = 0; c < n_chunks; ++c) {
                int b, off;
                chunk_code_byte<T>(a, c, t, b, off);
                uint4 bf[kN];
#pragma unroll
                for (int n = 0; n < kN; ++n) bf[n] = decode8<T>(crow[n], b, off, a.dsub, cb, rep_off);
                mma_chunk(c, bf);
            }
        }
        if (a.token_scales != nullptr) scale_columns<kM, kN>(acc, stage_scales(st, a.n_code_bytes), t);
    }
    mma_tile::fold_step_max<kM, kN>(rmax, acc, s0, n_tok, t, s0 + T::kStepTokens <= n_tok);
}

/// Query fragments held in registers for a walk (CodeTraits::kQReg): chunk c, m-tile m, k half h.
template <class T>
struct QueryRegs {
    uint4 f[T::kQReg ? T::kQChunks : 1][T::kMTiles][2];
};

/// warp_step_code with the query fragments in registers (T::kQReg: 2-dim PQ sub-vectors in the
/// per-byte layout, n_chunks <= 4): the same decode and MMAs, run tile by tile (8 accumulator
/// registers instead of 32), each tile's maxima folded before the next.
template <class T>
__device__ __forceinline__ void warp_step_code_qreg(const CodeArgs& a, const unsigned char* st, int code_off, int s0,
                                                    int n_tok, const __half* table_g, const unsigned char* cb,
                                                    const QueryRegs<T>& qr, int lane, float (&rmax)[T::kMTiles][2]) {
    constexpr int kM = T::kMTiles, kN = T::kNTiles, kC = T::kQChunks;
    static_assert(kM == 2, "table slots hold two m-tiles");
    static_assert(T::kSub == 2 && T::kBook == kBookPerByte, "measured faster for dsub 2, per-byte layout only");
    const int g = lane >> 2, t = lane & 3;
    const int nv = n_tok - s0;
    const int n_chunks = a.dim >> 5;
    const uint32_t* cid_s = reinterpret_cast<const uint32_t*>(st);
    // Every tile's table entries first: the L2 gathers are in flight together.
    uint2 tv[kN][2];
#pragma unroll
    for (int n = 0; n < kN; ++n) table_pair(cid_s, n, nv, table_g, g, t, tv[n][0], tv[n][1]);
#pragma unroll
    for (int n = 0; n < kN; ++n) {
        float acc[kM][1][4];
        acc_from_table(tv[n][0], tv[n][1], acc[0][0], acc[1][0]);
        const unsigned char* crow = st + 128 + code_off + (n * 8 + g) * a.n_code_bytes;
#pragma unroll
        for (int c = 0; c < kC; ++c) {
            if (c < n_chunks) {
                const uint4 bf = decode8<T>(crow, (c * 32 + 8 * t) / 2, 0, 2, cb, 0);
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int m = 0; m < kM; ++m) {
                        const uint4& q = qr.f[c][m][h];
                        mma16816<false>(acc[m][0], q.x, q.y, q.z, q.w, h ? bf.z : bf.x, h ? bf.w : bf.y);
                    }
            }
        }
        if (a.token_scales != nullptr) scale_columns<kM, 1>(acc, stage_scales(st, a.n_code_bytes) + n * 8, t);
        mma_tile::fold_step_max<kM, 1>(rmax, acc, s0 + n * 8, n_tok, t, s0 + n * 8 + 8 <= n_tok);
    }
}

/// One step of a warp's walk over its items (lane u holds item u's token range [tb, te); the
/// walk is at token s0 of item u, n_tok tokens from ub): the step after this one (item lane nu,
/// token ns0 of its nn from nub; nu = 32: none), whose copy it issues into next_stage, and the
/// wait for this step's copies (issued one step earlier).
template <class T>
__device__ __forceinline__ void walk_advance(const CodeArgs& a, unsigned nonempty, int64_t tb, int64_t te, int u,
                                             int s0, int n_tok, int64_t ub, unsigned char* next_stage, int lane,
                                             int& nu, int& ns0, int& nn, int64_t& nub) {
    nu = u;
    ns0 = s0 + T::kStepTokens;
    nn = n_tok;
    nub = ub;
    if (ns0 >= n_tok) {
        nu = mma_tile::next_lane(nonempty, u);
        ns0 = 0;
        if (nu < 32) {
            nub = __shfl_sync(0xffffffffu, tb, nu);
            nn = int(__shfl_sync(0xffffffffu, te, nu) - nub);
        }
    }
    __syncwarp();  // every lane is done reading the stage the next copy overwrites
    if (nu < 32) stage_step(a, nub + ns0, min(nn - ns0, T::kStepTokens), next_stage, lane);
    async_copy::commit();
    async_copy::wait_pending(1);
    __syncwarp();  // the current stage's copies, from every lane, are visible
}

/// Scores this warp's n_mine items (lane u holds item u's token range [tb, te)) against one
/// query group, adding each item's group score to `part` in the lane that owns it. The warp
/// walks the items' 32-token steps in order with two stages: the copy of the next step
/// (possibly the next item's first) is in flight while the current one is scored.
template <class T>
__device__ __forceinline__ void warp_items_code(const CodeArgs& a, int64_t tb, int64_t te, int n_mine,
                                                const __half* table_g, const unsigned char* cb,
                                                const unsigned char* q_s, int rows_valid, unsigned char* stages,
                                                int lane, float& part) {
    const int g = lane >> 2;
    const int sb = stage_bytes(a.n_code_bytes);
    const unsigned nonempty = __ballot_sync(0xffffffffu, lane < n_mine && te > tb);
    int u = nonempty ? __ffs(nonempty) - 1 : 32;
    if (u == 32) return;
    int64_t ub = __shfl_sync(0xffffffffu, tb, u);
    int n_tok = int(__shfl_sync(0xffffffffu, te, u) - ub);
    int s0 = 0, cur = 0;
    QueryRegs<T> qr;
    if constexpr (T::kQReg) {  // the group's rows are in q_s (the caller's __syncthreads)
        const int n_chunks = a.dim >> 5;
#pragma unroll
        for (int c = 0; c < T::kQChunks; ++c)
#pragma unroll
            for (int m = 0; m < T::kMTiles; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    qr.f[c][m][h] = c < n_chunks ? lds128(q_s + mma_tile::a_frag_offset(m, c, h, lane, n_chunks))
                                                 : make_uint4(0u, 0u, 0u, 0u);
    }
    __syncwarp();  // every lane is done reading the stage (previous batch or group) the first copy overwrites
    stage_step(a, ub, min(n_tok, T::kStepTokens), stages, lane);
    async_copy::commit();
    float rmax[T::kMTiles][2];
#pragma unroll
    for (int m = 0; m < T::kMTiles; ++m) rmax[m][0] = rmax[m][1] = -INFINITY;
    while (u < 32) {
        int nu, ns0, nn;
        int64_t nub;
        walk_advance<T>(a, nonempty, tb, te, u, s0, n_tok, ub, stages + (cur ^ 1) * sb, lane, nu, ns0, nn, nub);
        if constexpr (T::kQReg)
            warp_step_code_qreg<T>(a, stages + cur * sb, stage_code_off(a, ub + s0), s0, n_tok, table_g, cb, qr, lane,
                                   rmax);
        else
            warp_step_code<T>(a, stages + cur * sb, stage_code_off(a, ub + s0), s0, n_tok, table_g, cb, q_s, lane,
                              rmax);
        if (ns0 == 0) {  // the item's last step
            const float sc = mma_tile::sum_row_maxima<T::kMTiles>(rmax, rows_valid, g);
            if (lane == u) part += sc;
#pragma unroll
            for (int m = 0; m < T::kMTiles; ++m) rmax[m][0] = rmax[m][1] = -INFINITY;
        }
        u = nu;
        s0 = ns0;
        ub = nub;
        n_tok = nn;
        cur ^= 1;
    }
}

/// kWg: word (4 bytes: dims d, d + 1, d even) of query row r (0..31 of a group) in the B operand
/// of wgmma (wgmma.cuh: no swizzle, K-major, k groups 512 bytes apart, n groups 128). Column n =
/// 8j + 2t + e holds the row in table slot 8t + 2j + e (table_slot), so that lane g*4+t's 8
/// accumulator columns are the 8 consecutive slots 8t .. 8t + 7 of a token's table entry (one
/// 16-byte load). The k order inside each 32-dim chunk is permuted as on the A side, where lane
/// g*4+t holds a token's dims 8t .. 8t + 7 of the chunk: k16 half h, k position 2t + e + 8f is
/// dim 8t + 4h + 2f + e. A group takes dim * 64 bytes, as in A-fragment order.
/// kLaneMajor (CodeTraits::kLaneMajor, dim 128): the lane's 8 dims of chunk c are 32t + 8c ..
/// instead, so that k16 half h of chunk c, k position 2t + e + 8f is dim 32t + 8c + 4h + 2f + e.
template <bool kLaneMajor>
__host__ __device__ constexpr int wg_b_word(int r, int d) {
    const int s = table_slot(r);
    const int n = ((s >> 1) & 3) * 8 + (s >> 3) * 2 + (s & 1);
    const int chunk = kLaneMajor ? (d >> 3) & 3 : d >> 5, t = kLaneMajor ? d >> 5 : (d >> 3) & 3;
    const int kg = (chunk * 2 + ((d >> 2) & 1)) * 2 + ((d >> 1) & 1);
    return kg * 128 + (n >> 3) * 32 + (n & 7) * 4 + t;
}
template <bool kLaneMajor>
struct WgBIndex {
    __device__ __forceinline__ int operator()(int row, int dim) const { return wg_b_word<kLaneMajor>(row, dim); }
};

/// kWg: the document's score for this group: each accumulator column's maximum over the lanes
/// that share it (lane g*4+t, column k of 8 is table slot 8t + k, cmax[k / 2] half k % 2),
/// summed in fp32 over the columns whose query row is below rows_valid; every lane returns the
/// sum.
__device__ __forceinline__ float wg_sum_cols(const __half2 (&cmax)[4], int rows_valid, int t) {
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        __half2 v = cmax[j];
        v = __hmax2(v, __shfl_xor_sync(0xffffffffu, v, 4));
        v = __hmax2(v, __shfl_xor_sync(0xffffffffu, v, 8));
        v = __hmax2(v, __shfl_xor_sync(0xffffffffu, v, 16));
        const float2 f = __half22float2(v);
        if (table_row(8 * t + 2 * j) < rows_valid) sum += f.x;
        if (table_row(8 * t + 2 * j + 1) < rows_valid) sum += f.y;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    return sum;
}

/// kWg: the lane's 8 dims of chunks c and c + 1 of the tokens whose code rows are crow0, crow1
/// (rows of the same parity) into v[0..1] (chunk c) and v[2..3] (chunk c + 1).
template <class T>
__device__ __forceinline__ void wg_decode_pair(const CodeArgs& a, const unsigned char* crow0,
                                               const unsigned char* crow1, int c, int g, int t, const unsigned char* cb,
                                               int rep_off, uint4 (&v)[4]) {
    const unsigned char* const crow[2] = {crow0, crow1};
    if constexpr (T::kLaneMajor) {
        // Dims 32t + 8c .. 32t + 8c + 15: code bytes (32t + 8c) / kSub .., one word (2-bit
        // residual: 4 dims a byte) or two (4-bit: 2 dims a byte); each byte one entry.
        static_assert(T::kShared && (T::kSub == 4 || T::kSub == 2), "lane-major: the shared block, dsub 4 or 2");
        const int off = (32 * t + 8 * c) / T::kSub;
        const uint32_t rep = uint32_t(rep_off);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            if constexpr (T::kSub == 4) {
                const uint32_t w = lds32(crow[i] + off);
                const uint2 e0 = lds64(cb + shared_entry<0>(w, rep)), e1 = lds64(cb + shared_entry<1>(w, rep));
                const uint2 e2 = lds64(cb + shared_entry<2>(w, rep)), e3 = lds64(cb + shared_entry<3>(w, rep));
                v[i] = make_uint4(e0.x, e0.y, e1.x, e1.y);
                v[2 + i] = make_uint4(e2.x, e2.y, e3.x, e3.y);
            } else {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const uint32_t w = lds32(crow[i] + off + 4 * h);
                    v[2 * h + i] = make_uint4(lds32(cb + shared_entry<0>(w, rep)), lds32(cb + shared_entry<1>(w, rep)),
                                              lds32(cb + shared_entry<2>(w, rep)), lds32(cb + shared_entry<3>(w, rep)));
                }
            }
        }
    } else if constexpr (T::kPaired) {
        constexpr int D = T::kSub;
        const int odd = g & 1, r = (g >> 1) & (8 / D - 1);
        int b0, b1;
        paired_blocks<D>(c, t, odd, b0, b1);
        uint4 x0[2], x1[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) x0[i] = paired_decode8<D>(cb, crow[i], b0, r);
#pragma unroll
        for (int i = 0; i < 2; ++i) x1[i] = paired_decode8<D>(cb, crow[i], b1, r);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            v[i] = odd ? x1[i] : x0[i];
            v[2 + i] = odd ? x0[i] : x1[i];
        }
    } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int b, off;
            chunk_code_byte<T>(a, c + h, t, b, off);
#pragma unroll
            for (int i = 0; i < 2; ++i) v[2 * h + i] = decode8<T>(crow[i], b, off, a.dsub, cb, rep_off);
        }
    }
}

/// kWg: one tile's accumulators plus the two tokens' centroid scores (table entries e0, e1:
/// slots 8t .. 8t + 7 = columns k = 2j + e) folded into the running column maxima (tokens row0 =
/// base + g and row0 + 8 valid when below nv, or all when `full`). In fp16, two columns an
/// instruction: each accumulator is rounded to fp16 and the fp16 centroid score added (rounded),
/// then the maxima taken; a third of the fp32 fold's instructions (it converted each score to
/// fp32 first), +4% on the H200. The score a query row contributes is thus within an fp16
/// rounding of the similarity and one of the sum, like the centroid score itself (the table is
/// fp16), and assumes |similarity| < 65504 as the table does.
/// With `scaled`, each token's sums are then multiplied by its scale (sc0, sc1; one more fp16
/// rounding).
__device__ __forceinline__ void wg_fold(const float (&acc)[16], const uint4& e0, const uint4& e1, int row0, int nv,
                                        bool full, bool scaled, float sc0, float sc1, __half2 (&cmax)[4]) {
    const bool ok0 = full || row0 < nv, ok1 = full || row0 + 8 < nv;
    const uint32_t w0[4] = {e0.x, e0.y, e0.z, e0.w}, w1[4] = {e1.x, e1.y, e1.z, e1.w};
    const __half2 ninf = __float2half2_rn(-INFINITY);
    const __half2 h0 = __float2half2_rn(sc0), h1 = __float2half2_rn(sc1);
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // rows g (acc[4j], acc[4j + 1]) and g + 8 (acc[4j + 2], acc[4j + 3])
        const __half2 s0 = *reinterpret_cast<const __half2*>(&w0[j]), s1 = *reinterpret_cast<const __half2*>(&w1[j]);
        __half2 c0 = __hadd2(__floats2half2_rn(acc[4 * j], acc[4 * j + 1]), s0);
        __half2 c1 = __hadd2(__floats2half2_rn(acc[4 * j + 2], acc[4 * j + 3]), s1);
        if (scaled) {
            c0 = __hmul2(c0, h0);
            c1 = __hmul2(c1, h1);
        }
        cmax[j] = __hmax2(cmax[j], __hmax2(ok0 ? c0 : ninf, ok1 ? c1 : ninf));
    }
}

/// kWg: warp_items_code's walk, in lockstep with the other warps of the warpgroup: they first
/// agree (counts: 8 ints of shared memory, one a warp, alternating between two sets by the
/// caller) on the largest number of 32-token steps among them; a warp whose items need fewer
/// runs empty ones to the end (they decode whatever their stage holds: in bounds, results
/// dropped). dim = 128.
/// A step's tokens are two tiles of 16 (tile h: rows 16h + g and 16h + g + 8 of lane g*4+t), each
/// the warp's 16 rows of a wgmma m64n32, scored one after the other into one set of accumulators.
/// Per 64 dims (a chunk pair) a sub-round decodes 16 A registers (two buffers, used in turn) and
/// issues 4 wgmmas; the next sub-round's decode runs while they do (wait_group 1), also across
/// tiles and steps: a tile is folded into the running column maxima (fp16, wg_fold) after the
/// next tile's first decode, and an item's score is summed (fp32) after its last tile's fold.
/// The centroid scores are added at the fold, gathered from L2 when the tile starts (after the
/// previous fold frees the registers; ptxas may move the gather down to the fold). The sub-rounds are straight-line
/// code with distinct wgmma call sites: merged or looped sites pass the A buffers through register moves, and ptxas
/// then serializes the wgmmas.
template <class T>
__device__ __forceinline__ void warp_items_code_wg(const CodeArgs& a, int64_t tb, int64_t te, int n_mine,
                                                   const __half* table_g, const unsigned char* cb, uint64_t qdesc,
                                                   int rows_valid, unsigned char* stages, int* counts, int lane,
                                                   float& part) {
    const int g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5;
    const int sb = stage_bytes(a.n_code_bytes);
    const bool mine = lane < n_mine && te > tb;
    const unsigned nonempty = __ballot_sync(0xffffffffu, mine);
    const int my_steps =
        __reduce_add_sync(0xffffffffu, mine ? int((te - tb + T::kStepTokens - 1) / T::kStepTokens) : 0);
    if (lane == 0) counts[warp] = my_steps;
    wgmma::warpgroup_barrier(warp >> 2);
    const int4 cw = *reinterpret_cast<const int4*>(counts + (warp & ~3));
    const int n_steps = max(max(cw.x, cw.y), max(cw.z, cw.w));
    int u = nonempty ? __ffs(nonempty) - 1 : 32;
    int64_t ub = 0;
    int n_tok = 0;
    if (u < 32) {
        ub = __shfl_sync(0xffffffffu, tb, u);
        n_tok = int(__shfl_sync(0xffffffffu, te, u) - ub);
    }
    __syncwarp();  // every lane is done reading the stage (previous batch or group) the first copy overwrites
    if (u < 32) stage_step(a, ub, min(n_tok, T::kStepTokens), stages, lane);
    async_copy::commit();
    __half2 cmax[4];  // the running column maxima (wg_fold)
#pragma unroll
    for (int k = 0; k < 4; ++k) cmax[k] = __float2half2_rn(-INFINITY);
    const int rep_off = T::kShared ? (lane % T::kReplicas) * T::kEntryBytes : 0;
    const uint32_t lo = uint32_t(qdesc), hi = uint32_t(qdesc >> 32);
    float acc[16];
    uint4 tent[2];              // the tile's table entries (tokens 16h + g, + 8)
    float tsc[2] = {1.f, 1.f};  // their scales (token_scales)
    const bool scaled = a.token_scales != nullptr;
    uint4 buf[2][4];  // A fragments: sub-round p uses buf[p]
    // The tile in the accumulators, to fold: tokens of its step (0: none), first row (0 or 16),
    // and the lane holding its item when it is the item's last tile (32: not the last).
    int f_nv = 0, f_row = 0, f_end = 32;
    auto fold_pending = [&]() {
        if (f_nv > 0) {
            if (f_nv >= f_row + 16) {  // warp-uniform: no masks on a whole tile
                wg_fold(acc, tent[0], tent[1], 0, 0, true, scaled, tsc[0], tsc[1], cmax);
            } else {
                wg_fold(acc, tent[0], tent[1], f_row + g, f_nv, false, scaled, tsc[0], tsc[1], cmax);
            }
        }
        if (f_end < 32) {  // the item's last tile: its score
            const float sc = wg_sum_cols(cmax, rows_valid, t);
            if (lane == f_end) part += sc;
#pragma unroll
            for (int j = 0; j < 4; ++j) cmax[j] = __float2half2_rn(-INFINITY);
        }
    };
    int s0 = 0, cur = 0;
#pragma unroll 1
    for (int k = 0; k < n_steps; ++k) {
        const bool real = u < 32;
        const int nv = real ? n_tok - s0 : 0;
        int nu = 32, ns0 = 0, nn = 0;
        int64_t nub = 0;
        if (real)
            walk_advance<T>(a, nonempty, tb, te, u, s0, n_tok, ub, stages + (cur ^ 1) * sb, lane, nu, ns0, nn, nub);
        const unsigned char* st = stages + cur * sb;
        const unsigned char* crow0 = st + 128 + (real ? stage_code_off(a, ub + s0) : 0) + g * a.n_code_bytes;
        const int rs = 8 * a.n_code_bytes;  // 8 token rows
        const int end_lane = real && ns0 == 0 ? u : 32;
        auto gather_table = [&](int h) {  // an empty step gathers centroid 0
            const uint32_t* cid_s = reinterpret_cast<const uint32_t*>(st);
            // The stage is rewritten before this tile is folded: its scales are read now too.
            const float* scl = stage_scales(st, a.n_code_bytes);
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int r = h * 16 + i * 8 + g;
                const uint32_t c = r < nv ? cid_s[r] : 0u;  // < 2^25 centroids: 32-bit offsets
                tent[i] = __ldg(reinterpret_cast<const uint4*>(table_g) + (c * 4 + uint32_t(t)));
                if (scaled) tsc[i] = r < nv ? scl[r] : 1.f;
            }
        };
        // Sub-round p (chunks 2p, 2p + 1) of tile h.
        auto sub_round = [&]<int h, int p>() {
            uint4(&v)[4] = buf[p];
            wg_decode_pair<T>(a, crow0 + 2 * h * rs, crow0 + (2 * h + 1) * rs, 2 * p, g, t, cb, rep_off, v);
            if (p == 0) {  // the previous tile's wgmmas are done: fold it, free the accumulators
                wgmma::wait<0>();
                wgmma::keep_until_here(buf[1]);
                fold_pending();
                f_nv = nv;
                f_row = 16 * h;
                f_end = h == 1 ? end_lane : 32;
                gather_table(h);
            }
            wgmma::fence();
            // Chunk 2p + q, k16 half 0: dims 8t .. 8t+3 (x, y), half 1: 8t+4 .. 8t+7 (z, w); a0 / a2
            // token 16h + g, a1 / a3 token 16h + g + 8. 1 KB of B a k16. The tile's first wgmma
            // starts the accumulators.
            constexpr int site = (h * 2 + p) * 4;
            const uint32_t d = lo + uint32_t((4 * p) * (1024 >> 4));
            wgmma::mma_m64n32k16<site + 0, p != 0>(acc, v[0].x, v[1].x, v[0].y, v[1].y, d, hi);
            wgmma::mma_m64n32k16<site + 1>(acc, v[0].z, v[1].z, v[0].w, v[1].w, d + (1024 >> 4), hi);
            wgmma::mma_m64n32k16<site + 2>(acc, v[2].x, v[3].x, v[2].y, v[3].y, d + (2048 >> 4), hi);
            wgmma::mma_m64n32k16<site + 3>(acc, v[2].z, v[3].z, v[2].w, v[3].w, d + (3072 >> 4), hi);
            wgmma::commit();
            wgmma::wait<1>();  // the sub-round before this one is done: its buffer is free
            wgmma::keep_until_here(buf[p ^ 1]);
        };
        sub_round.template operator()<0, 0>();
        sub_round.template operator()<0, 1>();
        sub_round.template operator()<1, 0>();
        sub_round.template operator()<1, 1>();
        if (!real) continue;
        u = nu;
        s0 = ns0;
        ub = nub;
        n_tok = nn;
        cur ^= 1;
    }
    wgmma::wait<0>();
    wgmma::keep_until_here(buf[1]);
    fold_pending();
}

/// Query rows [row0, row0 + 32) of query q as fp16 in shared memory, in A-fragment order
/// (mma_tile::a_frag_offset; rows past ql are 0). kVector (the one-group fill before the
/// batch loop) with 16-byte aligned queries: 8 values a thread-load (mma_tile::fill_a_frag_rows);
/// else one (inside the batch loop the vector fill's registers cost the walk spills).
template <class T, bool kVector>
__device__ __forceinline__ void fill_query_group(const CodeArgs& a, int q, int ql, int row0, unsigned char* q_s) {
    const auto put = [&](int w, float v0, float v1) {
        *reinterpret_cast<__half2*>(q_s + 4 * w) = __floats2half2_rn(v0, v1);
    };
    const float* src = a.queries + (int64_t(q) * a.q_stride + row0) * a.dim;
    if constexpr (T::kWg) {  // the B operand's layout: 8 values a thread-load, or one
        if (kVector && (reinterpret_cast<uintptr_t>(a.queries) & 15u) == 0) {
            mma_tile::fill_rows_as<T::kThreads>(WgBIndex<T::kLaneMajor>{}, src, 0, T::kRows, ql - row0, a.dim, put);
        } else {
            const int n_words = T::kRows * a.dim / 2, half_dim = a.dim / 2;
            for (int w = threadIdx.x; w < n_words; w += T::kThreads) {
                const int r = w / half_dim, c = (w - r * half_dim) * 2;
                const bool ok = row0 + r < ql;
                put(wg_b_word<T::kLaneMajor>(r, c), ok ? src[int64_t(r) * a.dim + c] : 0.f,
                    ok ? src[int64_t(r) * a.dim + c + 1] : 0.f);
            }
        }
        wgmma::fence_smem_for_async();  // before the caller's barrier
        return;
    }
    if (kVector && (reinterpret_cast<uintptr_t>(a.queries) & 15u) == 0) {
        mma_tile::fill_a_frag_rows<T::kThreads>(src, 0, T::kRows, ql - row0, a.dim, put);
        return;
    }
    const int n_words = T::kRows * a.dim / 2, n_chunks = a.dim >> 5;
    for (int w = threadIdx.x; w < n_words; w += T::kThreads) {
        int r, c;
        mma_tile::a_frag_word(w, n_chunks, r, c);
        const bool ok = row0 + r < ql;
        put(w, ok ? src[int64_t(r) * a.dim + c] : 0.f, ok ? src[int64_t(r) * a.dim + c + 1] : 0.f);
    }
}

/// The fp16 codebook in the layout kBook keeps in shared memory (cb_smem_bytes at dst), from
/// the fp32 codebook [n_code_bytes][256][dsub]: threads tid, tid + n_threads, ... of the writers.
/// Per CTA into shared memory, or once into a global image (codebook_image_kernel).
template <int kSub, int kBook>
__device__ __forceinline__ void write_codebook(const float* __restrict__ codebook, int dim, unsigned char* dst, int tid,
                                               int n_threads) {
    if constexpr (kBook == kBookPaired) {
        // fp32 [n_code_bytes][256][dsub] -> fp16 entries at paired_offset, 4 values (one or half
        // an entry) a thread a step.
        constexpr int D = kSub;
        const int n4 = dim * 64;  // n_code_bytes * 256 * dsub / 4
        const float4* src = reinterpret_cast<const float4*>(codebook);
#pragma unroll 4
        for (int i = tid; i < n4; i += n_threads) {
            const float4 v = __ldg(src + i);
            const __half2 lo = __floats2half2_rn(v.x, v.y), hi = __floats2half2_rn(v.z, v.w);
            const int e = (4 * i) / D;  // entry (block * 256 + code) of v.x
            const uint32_t wl = *reinterpret_cast<const uint32_t*>(&lo), wh = *reinterpret_cast<const uint32_t*>(&hi);
            if constexpr (D == 2) {  // two entries (codes e, e + 1 of one block): two slots
                *reinterpret_cast<uint32_t*>(dst + paired_offset<D>(e >> 8, uint32_t(e & 255))) = wl;
                *reinterpret_cast<uint32_t*>(dst + paired_offset<D>((e + 1) >> 8, uint32_t((e + 1) & 255))) = wh;
            } else {
                *reinterpret_cast<uint2*>(dst + paired_offset<D>(e >> 8, uint32_t(e & 255)) + (4 * i) % D * 2) =
                    make_uint2(wl, wh);
            }
        }
    } else if constexpr (kBook == kBookShared) {
        // Block 0 of the fp32 codebook -> 256 / (2 * kSub) interleaved fp16 copies (64 KB).
        constexpr int E = 2 * kSub, R = kSharedEntryStride / E;
        for (int i = tid; i < 256 * R * kSub; i += n_threads) {
            const int j = i % kSub, r = (i / kSub) % R, e = i / (kSub * R);
            *reinterpret_cast<__half*>(dst + e * kSharedEntryStride + r * E + j * 2) =
                __float2half_rn(__ldg(codebook + e * kSub + j));
        }
    } else if constexpr (kSub != 0) {
        // fp32 codebook -> fp16 as given (n_code_bytes * 256 * dsub = dim * 256 values).
        const int n4 = dim * 64;
        const float4* src = reinterpret_cast<const float4*>(codebook);
#pragma unroll 4
        for (int i = tid; i < n4; i += n_threads) {
            const float4 v = __ldg(src + i);
            const __half2 lo = __floats2half2_rn(v.x, v.y), hi = __floats2half2_rn(v.z, v.w);
            uint2 w;
            w.x = *reinterpret_cast<const uint32_t*>(&lo);
            w.y = *reinterpret_cast<const uint32_t*>(&hi);
            *reinterpret_cast<uint2*>(dst + size_t(i) * 8) = w;
        }
    }
}

template <class T>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocksPerSM) code_maxsim_kernel(const CodeArgs a) {
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char* cb = smem;
    unsigned char* q_s = smem + a.cb_smem_bytes;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int q_bytes = T::kSub != 0 ? T::kRows * a.dim * 2 : 0;
    unsigned char* stages = q_s + q_bytes + warp * 2 * stage_bytes(a.n_code_bytes);
    // Launched by pdl::launch_pdl: wait for the stream's previous kernel (the centroid table,
    // say) before the first global access.
    pdl::grid_dependency_wait();
    pdl::trigger_dependents();
    // Top-k mode: each warp's sorted list of a.k keys, then the lists' lengths (computed where
    // used, so that the scoring walk keeps its registers).
    auto topk_lists = [&]() {
        return reinterpret_cast<uint64_t*>(q_s + q_bytes + T::kWarps * 2 * stage_bytes(a.n_code_bytes));
    };

    // kWg: the B operand's descriptor (wgmma.cuh; k groups 512 bytes apart, n groups 128), and
    // two sets of 8 step counts after the stages (warp_items_code_wg), used in turn.
    const uint64_t qdesc = wgmma::desc_b(async_copy::smem_addr(q_s), 512, 128);
    int* wg_counts = reinterpret_cast<int*>(q_s + q_bytes + T::kWarps * 2 * stage_bytes(a.n_code_bytes));
    int wg_calls = 0;
    const int64_t s = blockIdx.x, n_slices = gridDim.x;
    const bool dense = a.cand_offsets == nullptr;
    constexpr bool topk = T::kTopK;

    // The fp16 codebook: copied from the prepared image (one round trip; waited for before the
    // first barrier below), or converted from the fp32 codebook.
    if constexpr (T::kSub != 0) {
        if (a.cb_image != nullptr) {
            for (int i = threadIdx.x; i < a.cb_smem_bytes / 16; i += T::kThreads)
                async_copy::cp16(cb + i * 16, a.cb_image + i * 16);
            async_copy::commit();
        } else {
            write_codebook<T::kSub, T::kBook>(a.codebook, a.dim, cb, threadIdx.x, T::kThreads);
        }
    }

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
            if constexpr (T::kSub != 0) fill_query_group<T, true>(a, q, ql, 0, q_s);
            async_copy::wait_pending(0);  // the codebook image's copies (first query only)
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
                    if constexpr (T::kSub != 0) fill_query_group<T, false>(a, q, ql, grp * T::kRows, q_s);
                    async_copy::wait_pending(0);
                    __syncthreads();
                }
                const int rows_valid = min(T::kRows, ql - grp * T::kRows);
                const __half* table_g = a.table + (int64_t(q) * a.n_groups + grp) * int64_t(a.n_centroids) * 32;
                if constexpr (T::kWg) {
                    warp_items_code_wg<T>(a, tb, te, n_mine, table_g, cb, qdesc, rows_valid, stages,
                                          wg_counts + 8 * (wg_calls & 1), lane, part);
                    ++wg_calls;
                } else {
                    warp_items_code<T>(a, tb, te, n_mine, table_g, cb, q_s, rows_valid, stages, lane, part);
                }
            }
            if (bad) part = __int_as_float(0x7fc00000);
            if constexpr (!topk) {
                if (valid) a.scores[dense ? int64_t(q) * a.n_docs + item : base + item] = part;
            } else {
                const uint64_t key = valid ? topk_dev::make_key(part, int32_t(doc)) : 0;  // NaN (bad): none
                for (int u = 0; u < n_mine; ++u) {
                    const uint64_t ku = __shfl_sync(0xffffffffu, key, u);
                    if (ku != 0) topk_dev::warp_insert(topk_lists() + warp * a.k, list_n, a.k, ku, lane);
                }
            }
        }
        if constexpr (topk) {
            uint64_t* lists = topk_lists();
            int* counts = reinterpret_cast<int*>(lists + T::kWarps * a.k);
            if (lane == 0) counts[warp] = list_n;
            __syncthreads();
            topk_dev::block_merge_topk(lists, a.k, counts, T::kWarps, a.k,
                                       a.topk_partial + (int64_t(q) * n_slices + s) * a.k, nullptr, nullptr);
        }
    }
    // The codebook image's copies are waited for before the first use; a CTA whose queries are
    // all of length 0 never uses it and must not exit with them in flight.
    async_copy::wait_pending(0);
}

}  // namespace tms::kernels::code_impl

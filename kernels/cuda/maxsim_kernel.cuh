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
//              Balanced mode (MaxSimArgs::balance: dense lists of many documents, one query
//              group): warp W of the grid instead takes the documents that start in its
//              share [T*W/NW, T*(W+1)/NW) of all T tokens (two 32-ary searches of the offsets),
//              32 consecutive ones a batch, so that variable lengths do not leave one warp
//              with more tokens than the rest; when 32 probes of the offsets show equal
//              lengths the count split is kept (it is the same split, without the search).
//   warp unit: 8*kNTiles document tokens x one 128-byte dimension tile (64 dims of fp16/bf16,
//              32 of fp32). Each warp walks the units of its items (documents, steps, tiles)
//              in order through its own ring of n_stages shared-memory stages: cp.async copies
//              the next n_stages - 1 units (coalesced 128-byte rows, no registers held) while
//              the warp scores the current one, across document boundaries. Lane g*4+t reads
//              token g, dims 8t..8t+7 of every 32-dim chunk from the stage (ld.shared.v4, rows
//              swizzled so a phase is conflict-free) as the B fragment of mma.m16n8k16; the k
//              order inside a chunk is permuted identically on the query side. Query rows come
//              from shared memory in A-fragment order (mma_tile::a_frag_offset: one
//              conflict-free ld.shared.v4 per fragment, registers in operand order).
//              TMA instantiations (MaxSimTraits::kTma: documents whose buffer length the caller
//              gave, MaxSimParams::n_tokens, on sm_90+) copy a unit with one bulk tensor copy
//              issued by lane 0 (box of kStepTokens rows x 128 bytes, i.e. 64 16-bit or 32 fp32
//              elements, from a 2-D tensor map of the token buffer, 128-byte swizzle; rows past
//              the buffer read as zeros, rows past a document are masked like before)
//              completing on the stage's barrier; 16-bit documents read B rows g/2 + 4*(g%2) so
//              that the swizzled phases stay conflict-free. One instruction per 4 KB unit
//              instead of 8 cp.async per lane (fewer issue slots for the same bytes).
//              256-byte units (MaxSimTraits::kPair: rows of a multiple of 256 bytes, i.e. 16-bit
//              dim % 128 == 0 or fp32 dim % 64 == 0): a unit is instead kStepTokens = 4*kNTiles
//              tokens x 256 bytes (128 16-bit or 64 fp32 dims), whole rows at 16-bit dim 128 (one
//              contiguous 4 KB block), read through a 3-D tensor map [n_tokens, row / 128 bytes,
//              128 bytes] as two 128-byte pieces a token (half the copies and barriers).
//              Accumulators: kMTiles x kNTiles x 4 fp32 = 32 registers (256-byte units: 16); the running max per
//              query row stays in registers across steps; the doc score is reduced with warp
//              shuffles at the end of the document.
//   Query tokens are processed kRows = 16*kMTiles at a time (a "group"); queries longer than
//   one group reload the group in shared memory and revisit the batch (partial sums in the
//   lane that owns the item).
//   Precision: fp16/bf16 docs with the same query dtype use one MMA per tile; any query that
//   the doc type cannot hold exactly is split q = hi + lo (two MMAs), fp32 docs are split too
//   (bf16 hi/lo, three MMAs: hi*hi + lo*hi + hi*lo), keeping results at fp32 accuracy.
// Shared memory per CTA: kRows * dim * 2 * kQTerms query bytes, kWarps sorted lists of k
//   64-bit keys (top-k mode) and their counts, (TMA) kWarps x kMaxStages barriers and up to
//   1 KB to align the rings to 1024 bytes, then kWarps rings of n_stages x kStepTokens x
//   128 bytes, slot-major (stage i of every warp, then stage i + 1, ...).
// Prologue (one query group): the query rows are copied raw into the rings with cp.async while
//   the warps load their first items and the balance probe (one round trip for all); when they
//   fit in the rings' last slot (bulk-copy instantiations) the warps start their first copies
//   into the other slots before the block converts the rows into the query layout, else after;
//   the rows take the slot's first bytes (Nq=32 d=128 fp16: the last stages of warps 0 and 1), and
//   the other warps fill their last stage too. (Copying the rows with dependent loads instead
//   would put a round trip per two query words, eight for Nq=32 d=128, ahead of everything.)
//   Static documents (MaxSimArgs::docs_early, from MaxSimParams::docs_static; dense): the item
//   loads, balance probes and guessed first copies go out before the wait for the previous
//   kernel (they read only doc_offsets and doc_tokens), the query rows after it; the next call
//   is released once this CTA's query rows are in, so that its early copies do not queue in
//   front of them.
//   The launcher takes the deepest ring (<= 6) that keeps
//   two CTAs per SM, else the deepest that fits one (dim=128, Nq<=32, fp16: 8 KB + 3 x 32 KB;
//   dim=1024, split, top-k 1000: 191 KB + 1 x 32 KB, no copy ahead).
#pragma once

#include <cuda.h>  // CUtensorMap (the type only; the map is encoded through the runtime's driver entry point)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch_cache.h"
#include "kernels/cuda/mma_tile.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/topk_device.cuh"
#include "kernels/maxsim.h"

namespace tms::kernels::cuda_impl {

/// Kernel arguments (device pointers), passed by value. The TMA instantiations also take the
/// tensor map of doc_tokens as a parameter of its own (a __grid_constant__: the copy engine
/// reads it from parameter space); inside this struct it costs the fp32 instantiation ~90
/// bytes of spills.
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
    float* scores;           // scores mode (topk_partial == nullptr)
    uint64_t* topk_partial;  // top-k mode: [n_queries, n_slices, k] sorted keys
    int k;
    int n_stages;      // per-warp copy ring, 1..6 stages of kStageBytes
    int balance;       // dense, one query group: warps take documents by token share
    int copy_only;     // bench diagnostic: the copies and the walk without the MMAs (scores undefined)
    int64_t n_tokens;  // rows of doc_tokens when the caller gave them (MaxSimParams::n_tokens), else 0
    int docs_early;    // static documents, dense (the plan decides): first document loads before the PDL wait
};

/// Most stages of a warp's copy ring (one barrier each in TMA mode).
constexpr int kMaxStages = 6;

template <typename TD, bool kSplitQ_, int kMTiles_, bool kTma_ = false, bool kPair_ = false>
struct MaxSimTraits {
    using Doc = TD;
    static constexpr bool kDocF32 = std::is_same_v<TD, float>;
    /// Units arrive by bulk tensor copies (TMA) on per-stage barriers instead of per-thread
    /// cp.async; a separate instantiation, so that neither path pays the other's registers.
    static constexpr bool kTma = kTma_;
    static constexpr bool kDocBF16 = std::is_same_v<TD, __nv_bfloat16>;
    /// Tensor-core input type: fp16 for fp16 docs, bf16 for bf16 and fp32 docs.
    static constexpr bool kComputeBF16 = kDocBF16 || kDocF32;
    static constexpr int kWarps = 8;
    static constexpr int kThreads = 32 * kWarps;
    static constexpr int kMinBlocksPerSM = 2;
    static constexpr int kMTiles = kMTiles_;
    static constexpr int kRows = 16 * kMTiles;  // query rows per group
    /// 256-byte units (rows of a multiple of 256 bytes: 16-bit dim % 128 == 0, fp32 dim % 64 ==
    /// 0; TMA only; the launcher picks it): a unit is kStepTokens tokens x 256 bytes (128 16-bit
    /// or 64 fp32 dims), at 16-bit dim 128 whole rows, one contiguous 4 KB block (Nq <= 32) that
    /// one bulk copy reads, instead of 128 bytes of twice as many tokens. Token j's two 128-byte
    /// pieces land in stage rows 2j and 2j + 1 (a 3-D tensor map [n_tokens, row / 128 bytes, 128
    /// bytes], box 2 pieces x kStepTokens tokens). 16 x 4 accumulators. Half the copies and
    /// barriers of 128-byte units for the same bytes.
    static constexpr bool kPair = kPair_;
    static constexpr int kNTiles = (kPair ? 4 : 8) / kMTiles;  // n8 tiles of doc tokens per step
    static constexpr int kStepTokens = 8 * kNTiles;
    static constexpr int kTileBytes = kPair ? 256 : 128;  // bytes of one token per dimension tile
    static constexpr int kTileDims = kTileBytes / int(sizeof(TD));
    static constexpr int kChunks = kTileDims / 32;     // 32-dim chunks per tile (2 MMAs each)
    static constexpr int kVecs = int(sizeof(TD)) / 2;  // 16-byte loads per lane per chunk
    static constexpr int kQTerms = (kSplitQ_ || kDocF32) ? 2 : 1;
    static constexpr bool kSplitQ = kQTerms == 2;
    static constexpr int kBatch = 32;  // items per warp per batch (one per lane)
    /// Unit of the per-warp copy ring: one dimension tile of kStepTokens tokens, one row each.
    static constexpr int kRowBytes = kTileBytes;
    static constexpr int kRowPieces = kRowBytes / 16;
    static constexpr int kStageBytes = kStepTokens * kRowBytes;
    /// The rings are slot-major: stage i of warp w at (i * kWarps + w) * kStageBytes, so that the
    /// CTA's last stages form one block (the query's staging area while the first are copied).
    static constexpr int kSlotBytes = kWarps * kStageBytes;

    static_assert(std::is_same_v<TD, __half> || kDocBF16 || kDocF32, "doc type");
    static_assert(kMTiles == 2 || kMTiles == 4, "query groups of 32 or 64 rows");
    static_assert(kMTiles * kNTiles == (kPair ? 4 : 8), "32 (256-byte units: 16) fp32 accumulators per lane");
    static_assert(!kPair || kTma, "256-byte units: bulk copies");
    /// The query layout (mma_tile): the B fragments of fp32 documents in 256-byte units hold dims
    /// 4t..4t+3 and 16+4t..16+4t+3 of a chunk in lane t (pieces t and t + 4 of a stage row, the
    /// phase pattern of the 16-bit units); every other instantiation dims 8t..8t+7.
    using QIndex = std::conditional_t<kPair && kDocF32, mma_tile::AFragIndexQuads, mma_tile::AFragIndex>;
    static_assert(kTileDims % 32 == 0 && kChunks >= 1, "tile is whole 32-dim chunks");
    static_assert(kVecs * 16 == 8 * int(sizeof(TD)), "a lane covers 8 dims per chunk");
    static_assert(kWarps * kBatch == 256, "batch of 256 items per CTA");
};

// ---------------------------------------------------------------------------------------
// Small device helpers
// ---------------------------------------------------------------------------------------

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

using topk_dev::block_merge_topk;
using topk_dev::key_id;
using topk_dev::key_score;
using topk_dev::make_key;
using topk_dev::warp_insert;

/// One round of a warp-wide 32-ary search for the first d in [lo, hi] with off[d] >= x, off
/// non-decreasing over [0, hi): narrows [lo, hi] to at most (hi - lo + 31) / 32 entries.
__device__ __forceinline__ void lower_bound_round(int64_t& lo, int64_t& hi, bool ge_at_probe, int64_t step) {
    const unsigned m = __ballot_sync(0xffffffffu, ge_at_probe);
    if (m & 1u) {
        hi = lo;
    } else if (m == 0) {
        lo += 31 * step + 1;
    } else {
        const int f = __ffs(m) - 1;  // probe f is the first at or past x: the answer is in (p_{f-1}, p_f]
        hi = min(hi, lo + f * step);
        lo += (f - 1) * step + 1;
    }
}

/// The first documents d0, d1 in [0, n_docs) with off[d] >= x0, x1 (n_docs when none): two
/// interleaved warp-wide 32-ary searches, one load each per lane per round (4 rounds for 100K
/// documents).
__device__ inline void doc_lower_bounds(const int64_t* off, int64_t n_docs, int64_t x0, int64_t x1, int lane,
                                        int64_t& d0, int64_t& d1) {
    int64_t lo0 = 0, hi0 = n_docs, lo1 = 0, hi1 = n_docs;
    while (lo0 < hi0 || lo1 < hi1) {
        const int64_t st0 = (hi0 - lo0 + 31) / 32, st1 = (hi1 - lo1 + 31) / 32;
        const int64_t p0 = lo0 + lane * st0, p1 = lo1 + lane * st1;
        const bool g0 = p0 >= hi0 || off[p0] >= x0;
        const bool g1 = p1 >= hi1 || off[p1] >= x1;
        if (lo0 < hi0) lower_bound_round(lo0, hi0, g0, st0);
        if (lo1 < hi1) lower_bound_round(lo1, hi1, g1, st1);
    }
    d0 = lo0;
    d1 = lo1;
}

// ---------------------------------------------------------------------------------------
// One warp, one document, one query group
// ---------------------------------------------------------------------------------------

/// Position of a warp's walk over its items' units: item u (32: done), its tokens
/// [ub, ub + n_tok), step s0, dimension tile c.
struct Cursor {
    int u;
    int n_tok;
    int s0;
    int c;
    int64_t ub;
};

/// Moves to the next unit: next tile, else next step, else the next non-empty item.
template <class T>
__device__ __forceinline__ void advance(Cursor& k, int n_tiles, unsigned nonempty, int64_t tb, int64_t te) {
    if (++k.c < n_tiles) return;
    k.c = 0;
    k.s0 += T::kStepTokens;
    if (k.s0 < k.n_tok) return;
    k.s0 = 0;
    k.u = mma_tile::next_lane(nonempty, k.u);
    if (k.u < 32) {
        k.ub = __shfl_sync(0xffffffffu, tb, k.u);
        k.n_tok = int(__shfl_sync(0xffffffffu, te, k.u) - k.ub);
    }
}

/// Piece (16 bytes) position inside a 128-byte stage row. One shared-memory phase of an LDS.128
/// serves 8 lanes: rows 2j and 2j + 1, pieces 4c + t (16-bit) or 2t + v (fp32); odd rows flip
/// piece bit 2 (16-bit) or bit 0 (fp32), so the two rows fall in different banks.
template <class T>
__device__ __forceinline__ int stage_offset(int row, int piece) {
    return row * T::kRowBytes + ((piece ^ ((row & 1) * (T::kDocF32 ? 1 : 4))) << 4);
}

/// Issues (no wait) the copy of unit k: tile k.c of tokens k.s0 .. of item k.u into stage st.
/// Lane copies piece lane % 8 of rows lane / 8 + 4i.
template <class T>
__device__ __forceinline__ void copy_unit(const Cursor& k, const unsigned char* docs, int dim, unsigned char* st,
                                          int lane) {
    static_assert(T::kRowPieces == 8, "128-byte rows");
    const int nv = min(T::kStepTokens, k.n_tok - k.s0);
    const int row_bytes = dim * int(sizeof(typename T::Doc));
    const int p = lane & 7, r0 = lane >> 3;
    const int tile_bytes = row_bytes - k.c * T::kRowBytes;  // bytes left in the row from this tile on
    if (p * 16 >= tile_bytes) return;                       // a partial last tile (16-bit, 64 bytes)
    const unsigned char* src = docs + ((k.ub + k.s0 + r0) * row_bytes + k.c * T::kRowBytes + p * 16);
    unsigned char* dst = st + stage_offset<T>(r0, p);
#pragma unroll
    for (int i = 0; i < T::kStepTokens / 4; ++i) {
        if (r0 + 4 * i < nv) async_copy::cp16_stream(dst + 4 * i * T::kRowBytes, src + 4 * i * row_bytes);
    }
}

/// Starts the copy of unit k into stage `stage` (TMA: one bulk copy by lane 0).
template <class T>
__device__ __forceinline__ void issue_unit(const MaxSimArgs& a, const Cursor& k, int stage, unsigned char* stages,
                                           const CUtensorMap* tmap, uint64_t* bars, int lane) {
    if constexpr (T::kTma) {
        if (lane == 0) {
            async_copy::mbar_arrive_expect_tx(bars + stage, T::kStageBytes);
            if constexpr (T::kPair) {  // 128-byte pieces 2c, 2c + 1 of tokens ub + s0 ..
                async_copy::tma_load_3d(stages + stage * T::kSlotBytes, tmap, 0, 2 * k.c, int(k.ub + k.s0),
                                        bars + stage);
            } else {
                async_copy::tma_load_2d(stages + stage * T::kSlotBytes, tmap, k.c * T::kTileDims, int(k.ub + k.s0),
                                        bars + stage);
            }
        }
    } else {
        copy_unit<T>(k, static_cast<const unsigned char*>(a.doc_tokens), a.dim, stages + stage * T::kSlotBytes, lane);
    }
}

/// The start of a warp's walk over its n_mine items (lane u: tokens [tb, te)): `cur` is the
/// first unit (cur.u = 32: nothing to score), the return value the unit after the first
/// n_stages - 1, whose copies are started when `issue` (else a prime_walk call started them).
template <class T>
__device__ __forceinline__ Cursor walk_start(const MaxSimArgs& a, int64_t tb, int64_t te, int n_mine, bool issue,
                                             unsigned char* stages, const CUtensorMap* tmap, uint64_t* bars, int lane,
                                             unsigned& nonempty, Cursor& cur, int* n_issued = nullptr,
                                             int n_first = 0) {
    const int n_tiles = (a.dim + T::kTileDims - 1) / T::kTileDims;
    nonempty = __ballot_sync(0xffffffffu, lane < n_mine && te > tb);
    cur.u = nonempty ? __ffs(nonempty) - 1 : 32;
    cur.ub = __shfl_sync(0xffffffffu, tb, cur.u & 31);
    cur.n_tok = int(__shfl_sync(0xffffffffu, te, cur.u & 31) - cur.ub);
    cur.s0 = 0;
    cur.c = 0;
    Cursor ahead = cur;
    if (cur.u == 32) return ahead;
    __syncwarp();  // every lane is done reading the stages (previous batch) the first copies overwrite
    const int n_units = T::kTma && n_first > 0 ? n_first : a.n_stages - 1;  // cp.async: S - 1 always
    for (int i = 0; i < n_units; ++i) {                                     // the first S - 1 units (or n_first)
        if (ahead.u < 32) {
            if (issue) issue_unit<T>(a, ahead, i, stages, tmap, bars, lane);
            if (n_issued) ++*n_issued;
            advance<T>(ahead, n_tiles, nonempty, tb, te);
        }
        if constexpr (!T::kTma) {
            if (issue) async_copy::commit();
        }
    }
    return ahead;
}

/// Starts the copies of the first units of the warp's next warp_items call (same items, which
/// then passes primed = true), so that they are in flight while the block fills the query;
/// returns how many it started.
template <class T>
__device__ __forceinline__ int prime_walk(const MaxSimArgs& a, int64_t tb, int64_t te, int n_mine,
                                          unsigned char* stages, const CUtensorMap* tmap, uint64_t* bars, int lane,
                                          int n_first = 0) {
    unsigned nonempty;
    Cursor cur;
    int n_issued = 0;
    (void)walk_start<T>(a, tb, te, n_mine, true, stages, tmap, bars, lane, nonempty, cur, &n_issued, n_first);
    return n_issued;  // the units started, into stages 0 .. n_issued - 1
}

/// Scores this warp's n_mine items (lane u holds item u's token range [tb, te)) against one
/// query group, adding each item's group score to `part` in the lane that owns it. The warp
/// walks its items' units (kStepTokens tokens x one dimension tile) through a ring of
/// a.n_stages stages: `cur` is scored while the copies of the units up to `ahead` are in
/// flight. Tokens past a document's end are never copied; their columns are masked. primed:
/// prime_walk already started the first copies (S - 1 of them; all_primed: S, one a stage).
template <class T>
__device__ __forceinline__ void warp_items(const MaxSimArgs& a, int64_t tb, int64_t te, int n_mine,
                                           const unsigned char* q_hi, const unsigned char* q_lo, int rows_valid,
                                           unsigned char* stages, const CUtensorMap* tmap, uint64_t* bars,
                                           uint32_t& phases, int lane, float& part, bool primed, bool all_primed) {
    constexpr int kM = T::kMTiles, kN = T::kNTiles, kV = T::kVecs;
    const int g = lane >> 2, t = lane & 3;
    constexpr bool tma = T::kTma;
    // B fragments: lane g*4+t reads row brow of each n8 tile. TMA stages use the copy
    // engine's 128-byte swizzle (piece p of row r at p ^ (r % 8)). 16-bit: rows g/2 + 4*(g%2),
    // so that the two rows of one shared-memory phase (pieces 4c + t) differ in bit 2 and the
    // phase is conflict-free; the accumulator columns 2t, 2t+1 then hold tokens t, t+4. fp32
    // (pieces 2t + v): rows g, whose phase pairs differ in bit 0. cp.async stages flip piece
    // bit 2 (16-bit) or 0 (fp32) on odd rows instead (stage_offset).
    // 256-byte units (kPair): token j's piece h is stage row 2j + h, and the two tokens of a phase
    // (g = 2p, 2p + 1) must differ in bit 1 (bit 2 of the stage row): tokens
    // (g & 4) | (g & 1) << 1 | (g >> 1) & 1, so that the accumulator columns 2t, 2t+1 hold
    // tokens (t & 2) << 1 | (t & 1) and that + 2.
    constexpr int kTokPerm = T::kPair ? mma_tile::kTokPairRows : (tma && !T::kDocF32) ? mma_tile::kTokHalves : 0;
    const int brow = T::kPair   ? ((g & 4) | ((g & 1) << 1) | ((g >> 1) & 1))
                     : kTokPerm ? (((g & 1) << 2) | (g >> 1))
                                : g;  // TMA only
    const int S = a.n_stages, n_tiles = (a.dim + T::kTileDims - 1) / T::kTileDims;
    unsigned nonempty;
    Cursor cur;
    all_primed = tma && all_primed;  // every stage already holds a unit: the first turn issues none
    Cursor ahead =
        walk_start<T>(a, tb, te, n_mine, !primed, stages, tmap, bars, lane, nonempty, cur, nullptr, all_primed ? S : 0);
    if (cur.u == 32) return;
    float rmax[kM][2];
#pragma unroll
    for (int m = 0; m < kM; ++m) rmax[m][0] = rmax[m][1] = -INFINITY;
    float acc[kM][kN][4];
    int slot = 0;
    while (cur.u < 32) {
        __syncwarp();  // every lane is done reading the stage the next copy overwrites
        if (ahead.u < 32 && !all_primed) {
            const int fill = slot == 0 ? S - 1 : slot - 1;
            issue_unit<T>(a, ahead, fill, stages, tmap, bars, lane);
            advance<T>(ahead, n_tiles, nonempty, tb, te);
        }
        all_primed = false;
        if constexpr (tma) {
            async_copy::mbar_wait(bars + slot, (phases >> slot) & 1u);
            phases ^= 1u << slot;
        } else {
            async_copy::commit();
            async_copy::wait_pending(S - 1);
        }
        __syncwarp();  // the current unit's copies, from every lane, are visible

        if (cur.c == 0) {
#pragma unroll
            for (int m = 0; m < kM; ++m)
#pragma unroll
                for (int n = 0; n < kN; ++n) acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.f;
        }
        const unsigned char* st = stages + slot * T::kSlotBytes;
        const int nch = a.copy_only ? 0 : min(T::kChunks, (a.dim - cur.c * T::kTileDims) >> 5);
#pragma unroll
        for (int ch = 0; ch < T::kChunks; ++ch) {
            if (ch >= nch) break;
            const int qc = cur.c * T::kChunks + ch, n_chunks = a.dim >> 5;
            uint4 qf[kM][T::kQTerms][2];  // [m][hi / lo term][k half]
#pragma unroll
            for (int m = 0; m < kM; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int off = mma_tile::a_frag_offset(m, qc, h, lane, n_chunks);
                    qf[m][0][h] = lds128(q_hi + off);
                    if constexpr (T::kQTerms == 2) qf[m][1][h] = lds128(q_lo + off);
                }
            // B fragments: lane g*4+t takes token n*8+g, dims 8t..8t+7 of the chunk.
            uint32_t bh[kN][4], bl[kN][4];
#pragma unroll
            for (int n = 0; n < kN; ++n) {
                uint4 dr[kV];
#pragma unroll
                for (int v = 0; v < kV; ++v) {
                    if constexpr (T::kPair) {
                        // 16-bit: stage row 2j + ch / 2, piece (ch % 2) * 4 + t; fp32: row 2j + ch,
                        // piece 4v + t (dims 4t.., 16 + 4t..: T::QIndex); swizzled by the row.
                        const int row = 2 * (n * 8 + brow) + (T::kDocF32 ? ch : ch >> 1);
                        const int piece = T::kDocF32 ? 4 * v + t : ((ch & 1) << 2) + t;
                        dr[v] = lds128(st + row * 128 + ((piece ^ (row & 7)) << 4));
                    } else if constexpr (tma) {
                        dr[v] = lds128(st + (n * 8 + brow) * T::kRowBytes + (((ch * 4 + t * kV + v) ^ brow) << 4));
                    } else {
                        dr[v] = lds128(st + stage_offset<T>(n * 8 + g, ch * 4 + t * kV + v));
                    }
                }
                if constexpr (T::kDocF32) {
                    // 8 fp32 values (2 vectors) -> bf16 hi and lo pairs, same k order as fp16.
                    const float xs[8] = {__uint_as_float(dr[0].x),      __uint_as_float(dr[0].y),
                                         __uint_as_float(dr[0].z),      __uint_as_float(dr[0].w),
                                         __uint_as_float(dr[kV - 1].x), __uint_as_float(dr[kV - 1].y),
                                         __uint_as_float(dr[kV - 1].z), __uint_as_float(dr[kV - 1].w)};
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        // One packed conversion rounds both hi parts; they are read back as
                        // floats by bit placement (bf16 is the top half of an fp32).
                        const uint32_t hp = pack_bf16(xs[2 * j], xs[2 * j + 1]);
                        const float h0 = __uint_as_float(hp << 16), h1 = __uint_as_float(hp & 0xffff0000u);
                        bh[n][j] = hp;
                        bl[n][j] = pack_bf16(xs[2 * j] - h0, xs[2 * j + 1] - h1);
                    }
                } else {
                    bh[n][0] = dr[0].x;
                    bh[n][1] = dr[0].y;
                    bh[n][2] = dr[0].z;
                    bh[n][3] = dr[0].w;
                }
            }
            // Each term (k half x precision part) over all kM x kN tiles before the next, so
            // that two MMAs into one accumulator are kM * kN MMAs apart.
            constexpr bool bf = T::kComputeBF16;
            constexpr int kTerms = 2 * (1 + (T::kQTerms == 2 ? 1 : 0) + (T::kDocF32 ? 1 : 0));
#pragma unroll
            for (int term = 0; term < kTerms; ++term) {
                const int h = term & 1;        // k 0..15 or 16..31
                const int part_i = term >> 1;  // 0: hi x hi; 1: q lo x hi (split); last: q hi x doc lo (fp32)
                const bool doc_lo = T::kDocF32 && part_i == kTerms / 2 - 1;
                const int qt = (part_i == 1 && T::kQTerms == 2 && !doc_lo) ? 1 : 0;
#pragma unroll
                for (int n = 0; n < kN; ++n)
#pragma unroll
                    for (int m = 0; m < kM; ++m) {
                        const uint4& A = qf[m][qt][h];
                        const uint32_t* bb = doc_lo ? bl[n] : bh[n];
                        mma16816<bf>(acc[m][n], A.x, A.y, A.z, A.w, bb[2 * h], bb[2 * h + 1]);
                    }
            }
        }
        if (cur.c == n_tiles - 1) {  // the step's last tile
            mma_tile::fold_step_max<kM, kN, kTokPerm>(rmax, acc, cur.s0, cur.n_tok, t,
                                                      cur.s0 + T::kStepTokens <= cur.n_tok);
            if (cur.s0 + T::kStepTokens >= cur.n_tok) {  // the item's last step
                const float sc = mma_tile::sum_row_maxima<kM>(rmax, rows_valid, g);
                if (lane == cur.u) part += sc;
#pragma unroll
                for (int m = 0; m < kM; ++m) rmax[m][0] = rmax[m][1] = -INFINITY;
            }
        }
        advance<T>(cur, n_tiles, nonempty, tb, te);
        slot = slot + 1 == S ? 0 : slot + 1;
    }
}

/// Stores the pair of query values of A-fragment word w as the compute type's hi (and lo)
/// terms.
template <class T>
struct QueryPut {
    unsigned char* q_hi;
    unsigned char* q_lo;
    __device__ __forceinline__ void operator()(int w, float v0, float v1) const {
        using C = std::conditional_t<T::kComputeBF16, __nv_bfloat16, __half>;
        const float v[2] = {v0, v1};
        C h[2], l[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            if constexpr (T::kComputeBF16) {
                h[e] = __float2bfloat16_rn(v[e]);
                l[e] = __float2bfloat16_rn(v[e] - __bfloat162float(h[e]));
            } else {
                h[e] = __float2half_rn(v[e]);
                l[e] = __float2half_rn(v[e] - __half2float(h[e]));
            }
        }
        reinterpret_cast<C*>(q_hi + 4 * w)[0] = h[0];
        reinterpret_cast<C*>(q_hi + 4 * w)[1] = h[1];
        if constexpr (T::kQTerms == 2) {
            reinterpret_cast<C*>(q_lo + 4 * w)[0] = l[0];
            reinterpret_cast<C*>(q_lo + 4 * w)[1] = l[1];
        }
    }
};

/// Converts query rows [row0, row0 + kRows) of query q into shared memory (hi, and lo terms),
/// in A-fragment order (mma_tile::a_frag_offset; rows past ql are 0), one value a load: the
/// fill of long queries inside the batch loop and of unaligned ones (the one-group query of
/// an aligned buffer is staged and converted in the kernel's prologue: convert_staged_query).
template <class T>
__device__ __forceinline__ void fill_query_group(const MaxSimArgs& a, int q, int ql, int row0, unsigned char* q_hi,
                                                 unsigned char* q_lo) {
    const QueryPut<T> put{q_hi, q_lo};
    const int n_words = T::kRows * a.dim / 2, n_chunks = a.dim >> 5;
    for (int w = threadIdx.x; w < n_words; w += T::kThreads) {
        int r, c, word = w;
        if constexpr (std::is_same_v<typename T::QIndex, mma_tile::AFragIndex>) {
            mma_tile::a_frag_word(w, n_chunks, r, c);  // layout order: consecutive words
        } else {
            r = w / (a.dim >> 1);  // row-major, into the other layout
            c = 2 * (w - r * (a.dim >> 1));
            word = typename T::QIndex{n_chunks}(r, c);
        }
        const int row = row0 + r;
        const int64_t i = (int64_t(q) * a.q_stride + row) * a.dim + c;
        put(word, row < ql ? load_q(a.queries, a.q_dtype, i) : 0.f,
            row < ql ? load_q(a.queries, a.q_dtype, i + 1) : 0.f);
    }
}

/// Converts the query rows staged as they are (row-major, dim values of a.q_dtype each) into
/// the query layout through put; rows at or past ql are 0.
template <class T>
__device__ __forceinline__ void convert_staged_query(const MaxSimArgs& a, int ql, const unsigned char* staged,
                                                     const QueryPut<T>& put) {
    const int vpr = a.dim >> 3, n_vec = T::kRows * vpr, n_chunks = a.dim >> 5;
    const int esize = a.q_dtype == int(DType::kF32) ? 4 : 2;
    for (int v = threadIdx.x; v < n_vec; v += T::kThreads) {
        const int r = v / vpr, c = (v - r * vpr) * 8;
        uint4 raw[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
        if (r < ql) {
            raw[0] = lds128(staged + (r * a.dim + c) * esize);
            if (esize == 4) raw[1] = lds128(staged + (r * a.dim + c) * esize + 16);
        }
        mma_tile::put_raw8_as(typename T::QIndex{n_chunks}, r, c, raw, a.q_dtype, put);
    }
}

/// One batch of a warp's items: lane u holds item b0 + woff + lstride * u (valid: before
/// it_end), its document (cand_docs for a ragged list; -1 when invalid), the document's token
/// range [tb, te) (empty when invalid or out of range: bad), and the warp's item count n_mine.
struct WarpBatch {
    int64_t item, doc, tb, te;
    bool valid, bad;
    int n_mine;
};

__device__ __forceinline__ WarpBatch load_batch(const MaxSimArgs& a, bool dense, int64_t base, int64_t b0, int woff,
                                                int lstride, int64_t it_end, int lane) {
    WarpBatch bt;
    bt.item = b0 + woff + int64_t(lstride) * lane;
    bt.valid = bt.item < it_end;
    bt.doc = -1;
    bt.tb = bt.te = 0;
    if (bt.valid) {
        bt.doc = dense ? bt.item : int64_t(a.cand_docs[base + bt.item]);
        if (bt.doc >= 0 && bt.doc < a.n_docs) {
            bt.tb = a.doc_offsets[bt.doc];
            bt.te = a.doc_offsets[bt.doc + 1];
        }
    }
    bt.bad = bt.valid && !(bt.doc >= 0 && bt.doc < a.n_docs);
    const int64_t left = (it_end - b0 - woff + lstride - 1) / lstride;  // items of this warp from b0 on
    bt.n_mine = left <= 0 ? 0 : (left >= 32 ? 32 : int(left));
    return bt;
}

template <class T>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocksPerSM)
    maxsim_kernel(const MaxSimArgs a, const __grid_constant__ CUtensorMap tmap) {
    using TD = typename T::Doc;
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char* q_hi = smem;
    unsigned char* q_lo = smem + T::kRows * a.dim * 2;
    uint64_t* lists = reinterpret_cast<uint64_t*>(smem + T::kRows * a.dim * 2 * T::kQTerms);
    int* counts = reinterpret_cast<int*>(lists + T::kWarps * a.k);
    unsigned char* after_counts = reinterpret_cast<unsigned char*>(counts) + 16 * ((T::kWarps * sizeof(int) + 15) / 16);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    // TMA: each warp's stage barriers, then the rings from a 1024-byte boundary (the swizzle
    // pattern follows address bits 7..9).
    uint64_t* bars = reinterpret_cast<uint64_t*>(after_counts) + warp * kMaxStages;
    unsigned char* ring = after_counts;
    if constexpr (T::kTma) {
        ring += T::kWarps * kMaxStages * sizeof(uint64_t);
        ring += (1024u - (async_copy::smem_addr(ring) & 1023u)) & 1023u;
        if (lane < a.n_stages) async_copy::mbar_init(bars + lane);
        __syncwarp();
    }
    unsigned char* stages = ring + warp * T::kStageBytes;  // this warp's stage 0 (slot-major rings)
    uint32_t phases = 0;                                   // TMA: parity of the next completion of each stage's barrier
    if constexpr (T::kTma) {  // the map's first use on this SM then finds it fetched (parameter space)
        if (threadIdx.x == 0) async_copy::prefetch_tensormap(&tmap);
    }
    // Launched by pdl::launch_pdl: everything above touched only shared memory. With
    // a.docs_early, the first query's item loads, balance probes and guessed first copies (dense:
    // doc_offsets and doc_tokens only, which the previous kernel does not write) go out before
    // the wait, so that they overlap that kernel's end; the query rows follow it.
    if (!a.docs_early) {
        pdl::grid_dependency_wait();
        pdl::trigger_dependents();
    }
    // Queries of one group (q_stride <= kRows), 16-byte aligned, whose rows fit in the CTA's
    // copy rings: each query's rows are first copied as they are into the rings (cp.async, no
    // registers held), alongside the item and probe loads, then converted into the query
    // layout. When they fit in the rings' last slot (bulk-copy instantiations), the walk's
    // first copies (into the other slots) start before the conversion; else after it.
    const int q_esize = a.q_dtype == int(DType::kF32) ? 4 : 2;
    const int q_raw_bytes = a.q_stride * a.dim * q_esize;
    const bool staged_fill = a.q_stride <= T::kRows && (reinterpret_cast<uintptr_t>(a.queries) & 15u) == 0 &&
                             q_raw_bytes <= a.n_stages * T::kSlotBytes;
    const bool early_copies = T::kTma && staged_fill && a.n_stages >= 2 && q_raw_bytes <= T::kSlotBytes;
    unsigned char* staging = early_copies ? ring + (a.n_stages - 1) * T::kSlotBytes : ring;
    // The staged rows fill the last slot's first q_raw_bytes (the first warps' last stages): the
    // other warps start their walks with every stage in flight.
    const int n_first = early_copies && warp * T::kStageBytes >= q_raw_bytes ? a.n_stages : a.n_stages - 1;

    const int64_t s = blockIdx.x, n_slices = gridDim.x;
    const bool dense = a.cand_offsets == nullptr;
    const bool topk = a.topk_partial != nullptr;
    uint64_t* my_list = lists + warp * a.k;

    for (int q = blockIdx.y; q < a.n_queries; q += gridDim.y) {
        const bool before_wait = a.docs_early && q == blockIdx.y;
        const auto stage_query = [&]() {
            if (staged_fill) {
                __syncthreads();  // the rings' previous readers (the last query's walk) are done
                const unsigned char* src = static_cast<const unsigned char*>(a.queries) + int64_t(q) * q_raw_bytes;
                for (int i = threadIdx.x * 16; i < q_raw_bytes; i += T::kThreads * 16)
                    async_copy::cp16(staging + i, src + i);
                async_copy::commit();
            }
        };
        if (!before_wait) stage_query();
        const int64_t base = dense ? 0 : a.cand_offsets[q];
        const int64_t n = dense ? a.n_docs : a.cand_offsets[q + 1] - base;
        const int64_t lo = n * s / n_slices, hi = n * (s + 1) / n_slices;
        int list_n = 0;

        // This warp's items: items b0 + warp + 8u of each batch of 256 of the slice [lo, hi);
        // balanced (dense, one group): the documents that start in its share of all tokens,
        // 32 consecutive ones a batch. Documents of equal lengths (as 32 probes of the offsets
        // see them) keep the count split, which is then the same split without the search's
        // rounds. fp32 documents keep it too: the balanced walk's registers make the fp32
        // instantiation spill (80 -> 124 bytes of spill stores). The count split's first
        // batch is loaded before the probes, so that both take one round trip.
        int64_t it0 = lo, it_end = hi;
        int lstride = T::kWarps;  // balanced: 1 (then the warp offset is 0 and a batch is 32 items)
        WarpBatch bt = load_batch(a, dense, base, it0, warp, lstride, it_end, lane);
        // Dense documents whose rows divide evenly: the first copies start at once on the guess
        // that all documents have n_tokens / n_docs rows from row 0 (before the offsets arrive),
        // checked against the offsets below. A wrong guess lets those copies land and starts
        // again. Saves the offsets' round trip (the kernel's first, ~1.3 us on the H200).
        const bool guess = early_copies && dense && a.n_tokens > 0 && a.n_tokens % a.n_docs == 0;
        const int64_t guess_len = guess ? a.n_tokens / a.n_docs : 0;
        const int guessed =
            guess ? prime_walk<T>(a, bt.valid ? bt.item * guess_len : 0, bt.valid ? (bt.item + 1) * guess_len : 0,
                                  bt.n_mine, stages, &tmap, bars, lane, n_first)
                  : 0;
        const bool balance = !T::kDocF32 && a.balance;
        int64_t t_first = 0, t_total = 0;
        bool equal = true;
        if (balance) {
            t_first = a.doc_offsets[0];
            t_total = a.doc_offsets[a.n_docs] - t_first;
            const int64_t probe_at = a.n_docs * (lane + 1) / 32;
            equal = t_total % a.n_docs == 0 && a.doc_offsets[probe_at] - t_first == t_total / a.n_docs * probe_at;
        }
        if (before_wait) {
            pdl::grid_dependency_wait();
            stage_query();
        }
        int ql = a.query_lens ? a.query_lens[q] : a.q_stride;
        ql = max(0, min(ql, a.q_stride));
        const int n_groups = (ql + T::kRows - 1) / T::kRows;
        const bool rebalance = balance && !__all_sync(0xffffffffu, equal);
        if (rebalance) {
            const int64_t n_warps = n_slices * T::kWarps, gw = s * T::kWarps + warp;
            doc_lower_bounds(a.doc_offsets, a.n_docs, t_first + t_total * gw / n_warps,
                             t_first + t_total * (gw + 1) / n_warps, lane, it0, it_end);
            if (gw + 1 == n_warps) it_end = a.n_docs;  // trailing empty documents
            lstride = 1;
            bt = load_batch(a, dense, base, it0, 0, lstride, it_end, lane);
        }
        const int woff = lstride == 1 ? 0 : warp;
        // One query group: its rows are in shared memory before the walk starts (their loads
        // were issued with the item and probe loads above: one round trip for all), and the
        // walk's first copies start before (staging in the last slot) or after the conversion.
        const bool primed = n_groups == 1;
        bool guess_ok = false;
        if (guess) {
            guess_ok =
                primed && !rebalance &&
                __all_sync(0xffffffffu, !bt.valid || (bt.tb == bt.item * guess_len && bt.te == bt.tb + guess_len));
            if (!guess_ok) {  // let the guessed copies land before the stages are reused
                for (int i = 0; i < guessed; ++i) {
                    async_copy::mbar_wait(bars + i, (phases >> i) & 1u);
                    phases ^= 1u << i;
                }
            }
        }
        if (primed && early_copies && !guess_ok) {
            prime_walk<T>(a, bt.tb, bt.te, bt.n_mine, stages, &tmap, bars, lane, n_first);
        }
        if (primed) {
            __syncthreads();
            if (staged_fill) {
                async_copy::wait_pending(0);
                __syncthreads();
                convert_staged_query<T>(a, ql, staging, QueryPut<T>{q_hi, q_lo});
            } else {
                fill_query_group<T>(a, q, ql, 0, q_hi, q_lo);
            }
            __syncthreads();
            // The rings' generic-proxy writes and reads above come before the bulk copies into them.
            if constexpr (T::kTma) async_copy::fence_proxy_async_smem();
        }
        // The next call's CTAs start their own early copies once released: not before this one's
        // query rows are in, so that those copies do not queue in front of them.
        if (before_wait) pdl::trigger_dependents();
        if (primed && !early_copies) prime_walk<T>(a, bt.tb, bt.te, bt.n_mine, stages, &tmap, bars, lane);
        for (int64_t b0 = it0; b0 < it_end; b0 += T::kBatch * lstride) {
            if (b0 != it0) bt = load_batch(a, dense, base, b0, woff, lstride, it_end, lane);
            const int64_t item = bt.item, doc = bt.doc;
            const bool valid = bt.valid, bad = bt.bad;
            const int n_mine = bt.n_mine;
            float part = 0.f;
            for (int grp = 0; grp < n_groups; ++grp) {
                if (n_groups > 1) {
                    __syncthreads();
                    fill_query_group<T>(a, q, ql, grp * T::kRows, q_hi, q_lo);
                    __syncthreads();
                }
                const int rows_valid = min(T::kRows, ql - grp * T::kRows);
                warp_items<T>(a, bt.tb, bt.te, n_mine, q_hi, q_lo, rows_valid, stages, &tmap, bars, phases, lane, part,
                              primed && b0 == it0, early_copies && primed && b0 == it0 && n_first == a.n_stages);
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
        // A query of length 0 scored nothing (no walk): its staged rows still land before the
        // CTA moves on (the next query's staging writes the same bytes) or exits. (Otherwise
        // nothing is pending here.)
        async_copy::wait_pending(0);
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
    /// tmap: T::kTma's tensor map of a.doc_tokens (ignored by the others).
    static Status Launch(const MaxSimArgs& a, const CUtensorMap& tmap, dim3 grid, size_t smem_bytes,
                         cudaStream_t stream) {
        TMS_RETURN_IF_ERROR(launch_cache::ensure_smem(reinterpret_cast<const void*>(maxsim_kernel<T>), smem_bytes));
        return pdl::launch_pdl(maxsim_kernel<T>, grid, dim3(T::kThreads), smem_bytes, stream, a, tmap);
    }
    static Status Occupancy(size_t smem_bytes, int* blocks_per_sm) {
        return launch_cache::occupancy(reinterpret_cast<const void*>(maxsim_kernel<T>), T::kThreads, smem_bytes,
                                       blocks_per_sm);
    }
};

// The instantiations that exist (kernels/cuda/instances/, generated by generate.py).
#define TMS_MAXSIM_FOR_EACH_INSTANCE(X)      \
    X(__half, false, 2, false, false)        \
    X(__half, false, 4, false, false)        \
    X(__half, true, 2, false, false)         \
    X(__half, true, 4, false, false)         \
    X(__half, false, 2, true, false)         \
    X(__half, false, 4, true, false)         \
    X(__half, true, 2, true, false)          \
    X(__half, true, 4, true, false)          \
    X(__nv_bfloat16, false, 2, false, false) \
    X(__nv_bfloat16, false, 4, false, false) \
    X(__nv_bfloat16, true, 2, false, false)  \
    X(__nv_bfloat16, true, 4, false, false)  \
    X(__nv_bfloat16, false, 2, true, false)  \
    X(__nv_bfloat16, false, 4, true, false)  \
    X(__nv_bfloat16, true, 2, true, false)   \
    X(__nv_bfloat16, true, 4, true, false)   \
    X(float, true, 2, false, false)          \
    X(float, true, 4, false, false)          \
    X(float, true, 2, true, false)           \
    X(float, true, 4, true, false)           \
    X(__half, false, 2, true, true)          \
    X(__half, false, 4, true, true)          \
    X(__half, true, 2, true, true)           \
    X(__half, true, 4, true, true)           \
    X(__nv_bfloat16, false, 2, true, true)   \
    X(__nv_bfloat16, false, 4, true, true)   \
    X(__nv_bfloat16, true, 2, true, true)    \
    X(__nv_bfloat16, true, 4, true, true)    \
    X(float, true, 2, true, true)            \
    X(float, true, 4, true, true)

#define TMS_MAXSIM_EXTERN(TD, SPLIT, MT, TMA, PAIR) \
    extern template struct MaxSimKernel<MaxSimTraits<TD, SPLIT, MT, TMA, PAIR>>;

}  // namespace tms::kernels::cuda_impl

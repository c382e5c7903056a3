// Copyright TileMaxSim authors. Candidate-generation ops of the query pipeline, on memory the
// caller owns (kernels/maxsim.h's conventions):
//   IVF union: the documents of every IVF list probed by a query's tokens, each once, ascending;
//   probe scores: each probed document's approximate score from the probed centroids that hold
//   it, and the best `keep` of each query (the pruning before compressed scoring);
//   TF32x3 split: fp32 rows as three TF32-exact parts, so that one TF32 tensor-core GEMM over
//   them is accurate to fp32 (the centroid scores of probing).
// ref (kernels/ref/candidates_ref.cpp, the spec), cpu (kernels/cpu/candidates_cpu.cpp), cuda
// (kernels/cuda/candidates_cuda.h: the same steps as device kernels on a stream).
#pragma once

#include <cstdint>
#include <vector>

#include "tilemaxsim/status.h"

namespace tms::kernels {

/// The union of the probed IVF lists of each query.
struct IvfUnionParams {
    /// [n_queries, q_stride, nprobe] centroid ids probed by each token slot; < 0: none.
    const int32_t* probe = nullptr;
    int n_queries = 0;
    int q_stride = 0;
    int nprobe = 0;
    /// [n_queries] token slots used per query (<= q_stride); nullptr: all q_stride.
    const int32_t* query_lens = nullptr;
    /// [n_centroids + 1] offsets into ivf_docs; list c holds document ids in [0, n_docs).
    const int64_t* ivf_offsets = nullptr;
    const int32_t* ivf_docs = nullptr;
    int n_centroids = 0;
    int64_t n_docs = 0;
    /// The documents a search may return (its filter; nullptr: every document): query q's row
    /// of bitmap_words(n_docs) words starts at allow + q * allow_stride (0: one row for every
    /// query), bit d % 32 of word d / 32 set when document d is allowed. A document that is not
    /// allowed is in no query's union, list or scores.
    const uint32_t* allow = nullptr;
    int64_t allow_stride = 0;
};

/// Words of one row of a bitmap over n_docs documents (IvfUnionParams::allow, the union's bitmaps).
inline int64_t bitmap_words(int64_t n_docs) { return (n_docs + 31) / 32; }

/// Sizes non-negative, inputs present when anything is probed (shared by every path).
Status ivf_union_validate(const IvfUnionParams& p);
/// Query q's documents into docs[off[q] .. off[q + 1]), ascending, each once.
Status ivf_union_ref(const IvfUnionParams& p, std::vector<int64_t>* off, std::vector<int32_t>* docs);
/// The same, queries in parallel (OpenMP), a bitmap of n_docs bits per thread.
Status ivf_union_cpu(const IvfUnionParams& p, std::vector<int64_t>* off, std::vector<int32_t>* docs);

/// Pruning by probe scores, PLAID's centroid interaction restricted to the probed centroids with
/// WARP's imputation (Scheerer et al., SIGIR 2025): for query q and each of its rows i, s_i(d) is
/// the score of the first probe of row i (in probe order: score descending, as probing gives
/// them) whose IVF list holds document d, and m_i (floor_scores) the score of row i's best
/// unprobed centroid, imputed for documents that no probe of the row holds. A document's score is
/// sum_i (s_i(d) - m_i) over the rows that hold it, in fixed point so that every path is exact and
/// order-free: each term is probe_term(s, m_i, scale_q), scale_q = probe_score_scale(the sum over
/// rows of the row's best probe score minus m_i), so that a query's scores are integers below
/// 2^24 (exact in fp32). Its cost is the probed lists' entries, not the candidates' tokens.
struct ProbeScoreParams {
    /// The probes ([n_queries, q_stride, nprobe] centroid ids, < 0: none), query lengths and IVF
    /// lists (each list's documents ascending, each once).
    IvfUnionParams lists;
    /// [n_queries, q_stride, nprobe]: the centroid score of each probe.
    const float* probe_scores = nullptr;
    /// [n_queries, q_stride]: m_i, each row's imputed score.
    const float* floor_scores = nullptr;
    /// Candidates kept per query: the best by (score descending, document ascending); 0: all.
    int keep = 0;
};

/// The fixed-point unit: a query's scores are at most about kProbeScoreUnit.
inline constexpr float kProbeScoreUnit = 8388608.f;  // 2^23

#if defined(__CUDACC__)
#define TMS_KERNELS_HD __host__ __device__
#else
#define TMS_KERNELS_HD
#endif
/// scale_q from the sum of a query's row ranges (each row's best probe score minus its floor).
TMS_KERNELS_HD inline float probe_score_scale(float range) { return range > 0.f ? kProbeScoreUnit / range : 0.f; }
/// One row's term for a probe of score s: (s - floor) * scale in [0, kProbeScoreUnit], truncated
/// (NaN: 0).
TMS_KERNELS_HD inline uint32_t probe_term(float s, float floor, float scale) {
    const float x = (s - floor) * scale;
    return x > 0.f ? (x < kProbeScoreUnit ? uint32_t(x) : uint32_t(kProbeScoreUnit)) : 0u;
}
/// A row's range: its best valid probe's score minus its floor, at least 0.
TMS_KERNELS_HD inline float probe_row_range(const int32_t* probe, const float* scores, int nprobe, int n_centroids,
                                            float floor) {
    float r = 0.f;
    for (int j = 0; j < nprobe; ++j) {
        if (probe[j] < 0 || probe[j] >= n_centroids) continue;
        const float x = scores[j] - floor;
        r = x > r ? x : r;
    }
    return r;
}
/// Bit d of a bitmap row (bit d % 32 of word d / 32).
TMS_KERNELS_HD inline bool bitmap_has(const uint32_t* row, int64_t d) { return (row[d >> 5] >> (d & 31)) & 1u; }
/// Document d may be returned for query q (IvfUnionParams::allow).
TMS_KERNELS_HD inline bool doc_allowed(const IvfUnionParams& p, int q, int32_t d) {
    return p.allow == nullptr || bitmap_has(p.allow + int64_t(q) * p.allow_stride, d);
}
#undef TMS_KERNELS_HD

/// probe_scores inputs present (shared by every path).
Status probe_scores_validate(const ProbeScoreParams& p);
/// Query q's kept documents into docs[off[q] .. off[q + 1]) in the order (score descending,
/// document ascending), their fixed-point scores into scores.
Status probe_scores_ref(const ProbeScoreParams& p, std::vector<int64_t>* off, std::vector<int32_t>* docs,
                        std::vector<uint32_t>* scores);
/// The same, queries in parallel (OpenMP), per-thread dense arrays of n_docs.
Status probe_scores_cpu(const ProbeScoreParams& p, std::vector<int64_t>* off, std::vector<int32_t>* docs,
                        std::vector<uint32_t>* scores);
/// What a query's fixed-point probe scores stand for: a document of score x has
/// sum_i max(s_i(d), m_i) = base + x / scale (up to each row's truncation, less than rows / scale),
/// the sum over its rows of the best probed centroid score of the document's tokens, or the row's
/// floor, which is at least its centroid interaction score (every unprobed centroid of a row
/// scores at most its floor). A document no probe reaches has score 0. scale 0: every document
/// scores base.
struct ProbeFrame {
    float base = 0;
    float scale = 0;
    int rows = 0;  ///< the query's rows (its length)
};
/// Query q's frame (host pointers in p).
ProbeFrame probe_frame(const ProbeScoreParams& p, int q);

/// dst [rows, 3 * dim]: row r of src [rows, dim] as three parts of dim each, part s being lo when
/// bit s of lo_parts is set, else hi; hi = x with its low 13 mantissa bits cleared (exact in
/// TF32), lo = x - hi (exact in fp32). Centroids as (hi, lo, hi) and query rows as (hi, hi, lo):
/// their product over 3 * dim is hi.hi + lo.hi + hi.lo, all but lo.lo (2^-20 of the product).
void split_tf32x3_ref(const float* src, int64_t rows, int dim, unsigned lo_parts, float* dst);

}  // namespace tms::kernels

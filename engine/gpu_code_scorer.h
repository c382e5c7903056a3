// Copyright TileMaxSim authors. Host-level GPU compressed scorer (no CUDA headers here).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/candidates.h"
#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms::kernels {
class GpuContext;
}

namespace tms::engine {

/// Owns device copies of one shard's compressed tokens (centroid ids, codes, codebook,
/// centroids, doc offsets) and scores queries against them with the fused kernels of
/// kernels/cuda/code_maxsim_cuda.h. Per-call buffers live in one device arena that grows and
/// is reused. Runs on its GpuContext's stream, with the scratch arenas every scorer on that
/// device shares. Thread-safety: callers hold the context's mutex (one call at a time on the
/// device, and Candidates .. ScoreCandidatesTop of one search under one hold).
class GpuCodeScorer {
public:
    /// h_token_centroids [n_tokens]; h_codes [n_tokens, n_code_bytes] (null when
    /// n_code_bytes == 0); h_codebook [n_code_bytes, 256, dim / n_code_bytes] fp32;
    /// h_centroids [n_centroids, dim] fp32; h_doc_offsets [n_docs + 1], 0 .. n_tokens.
    static Status Create(std::shared_ptr<kernels::GpuContext> ctx, const uint32_t* h_token_centroids,
                         const uint8_t* h_codes, int64_t n_tokens, int n_code_bytes, const float* h_codebook,
                         const float* h_centroids, int n_centroids, int dim, const int64_t* h_doc_offsets,
                         int64_t n_docs, std::unique_ptr<GpuCodeScorer>* out);
    ~GpuCodeScorer();
    /// Scores the decoded tokens as unit vectors from now on (IndexModel::unit_norm): each
    /// token's 1 / ||centroid + residual||, computed on the device (kernels::decoded_scales_cuda)
    /// from the resident codes and h_centroids (Create's), multiplies its similarities. No-op
    /// without codes.
    Status NormalizeDecoded(const float* h_centroids);
    /// Scores laid out like kernels::CodeMaxSimParams::scores (dense [n_queries, n_docs] when
    /// h_cand_offsets is null). h_queries [n_queries, q_stride, dim] fp32; h_centroid_scores
    /// [n_queries, q_stride, n_centroids] fp32 on the host, or null to compute them on the
    /// device (cuBLAS, from the resident centroids). centroids_only drops the residual
    /// (PLAID's centroid-interaction pruning score).
    Status Score(const float* h_queries, int n_queries, int q_stride, const int32_t* h_query_lens,
                 const float* h_centroid_scores, const int64_t* h_cand_offsets, const int32_t* h_cand_docs,
                 bool centroids_only, std::vector<float>* scores);

    /// The nprobe best centroids of every query row (PLAID's probing), on the device: the
    /// cuBLAS GEMM of the rows against the resident centroids, then one warp per row picks them
    /// in order (score descending, lower id first on ties). probe: [n_queries * q_stride, nprobe].
    /// Rows past a query's length are probed too (callers ignore them). nprobe in [1, 64] and at
    /// most n_centroids, else InvalidArgument.
    Status Probe(const float* h_queries, int n_queries, int q_stride, int nprobe, std::vector<int32_t>* probe);

    /// Uploads the IVF lists (documents of each centroid, ascending; h_ivf_offsets
    /// [n_centroids + 1]) that Candidates reads.
    Status SetIvf(const int64_t* h_ivf_offsets, const int32_t* h_ivf_docs);

    /// PLAID's candidate generation on the device: probing (as Probe), the union of the probed
    /// IVF lists of each query's first h_query_lens[q] rows (one bitmap per query), then, when
    /// ncandidates > 0 and a query has more, pruning of every query to its ncandidates best
    /// (kInteraction: by centroid-only score, score descending, lower id first on ties).
    /// Output on the host: off [n_queries + 1] and docs, in id order when nothing was pruned,
    /// in score order when it was; docs may be null (the lists stay on the device only, for
    /// ScoreCandidates / ScoreCandidatesTop). Needs SetIvf first. h_queries [n_queries, q_stride,
    /// dim] of q_dtype: 16-bit ones are uploaded as they are and converted on the device.
    /// pruning: how to prune (kProbe: kernels::ProbeScoreParams, the kept documents in the order
    /// score descending, lower id first).
    /// keys (with docs): the pruning scores of the kept documents (kProbe: the fixed-point
    /// score; kInteraction: the centroid-only score), every query cut to its ncandidates best
    /// (score descending, lower id first) even where nothing needed pruning (the cut of a search
    /// spread over several shards, SearchCuts); unset when ncandidates == 0. ticket: names this
    /// call's device state for ScoreLists. h_allow: the documents the search may return
    /// (kernels::IvfUnionParams::allow), one host row of bitmap_words(n_docs) words for every query,
    /// or one per query when allow_per_query; nullptr: every document. frames (kProbe with
    /// ncandidates > 0): each query's kernels::ProbeFrame, what its keys stand for.
    Status Candidates(const void* h_queries, DType q_dtype, int n_queries, int q_stride, const int32_t* h_query_lens,
                      int nprobe, int ncandidates, Pruning pruning, std::vector<int64_t>* off,
                      std::vector<int32_t>* docs, std::vector<float>* keys = nullptr, uint64_t* ticket = nullptr,
                      const uint32_t* h_allow = nullptr, bool allow_per_query = false,
                      std::vector<kernels::ProbeFrame>* frames = nullptr);
    Status Candidates(const float* h_queries, int n_queries, int q_stride, const int32_t* h_query_lens, int nprobe,
                      int ncandidates, Pruning pruning, std::vector<int64_t>* off, std::vector<int32_t>* docs) {
        return Candidates(h_queries, DType::kF32, n_queries, q_stride, h_query_lens, nprobe, ncandidates, pruning, off,
                          docs);
    }

    /// Compressed scores of the candidate lists the last Candidates call returned (scores[i]
    /// for its docs[i]), from that call's device state: its query rows, centroid scores and
    /// candidate lists (and its centroid-score table when it pruned) are reused, not uploaded
    /// or computed again. InvalidArgument when no Candidates call precedes it, or when Score or
    /// Probe ran in between (they reuse the device buffers).
    Status ScoreCandidates(std::vector<float>* scores);

    /// As ScoreCandidates, but only the `keep` best of each query's list come back, selected on
    /// the device: off [n_queries + 1], docs and scores in the order score descending, lower
    /// document id first on ties (kernels::topk_cpu's order). keep > 0.
    Status ScoreCandidatesTop(int keep, std::vector<int64_t>* off, std::vector<int32_t>* docs,
                              std::vector<float>* scores);

    /// Compressed scores of given candidate lists (h_off [n_queries + 1], h_docs), the `keep`
    /// best of each query back as ScoreCandidatesTop returns them, computed as a Candidates call
    /// followed by ScoreCandidatesTop computes them (the same query conversion, centroid GEMM
    /// and table kernel), so that a list cut between the two steps scores as it would have.
    /// ticket: a Candidates call's on the same queries; while its device state is still there (no
    /// call on the device since), the query rows, centroid scores and table are reused, not
    /// uploaded and computed again. 0: none.
    Status ScoreLists(const void* h_queries, DType q_dtype, int n_queries, int q_stride, const int32_t* h_query_lens,
                      const int64_t* h_off, const int32_t* h_docs, int keep, std::vector<int64_t>* off,
                      std::vector<int32_t>* docs, std::vector<float>* scores, uint64_t ticket = 0);

private:
    GpuCodeScorer() = default;
    /// Compressed scores of the last Candidates call's lists into the device buffer g_scores.
    Status ScoreLast(const char* who);
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace tms::engine

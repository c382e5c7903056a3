// Copyright TileMaxSim authors. Host-level GPU exact scorer (no CUDA headers here).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms::kernels {
class GpuContext;
}

namespace tms::engine {

class VectorRows;

/// Owns device copies of one shard's fp16 token vectors and scores queries against them, on
/// its GpuContext's stream with the arena every exact scorer on that device shares (callers
/// hold the context's mutex).
class GpuExactScorer {
public:
    static Status Create(std::shared_ptr<kernels::GpuContext> ctx, const uint16_t* h_tokens_f16, int64_t n_tokens,
                         int dim, const int64_t* h_doc_offsets, int64_t n_docs, std::unique_ptr<GpuExactScorer>* out) {
        return Create(std::move(ctx), {{h_tokens_f16, n_tokens}}, dim, h_doc_offsets, n_docs, out);
    }
    /// Host tokens in consecutive parts (the shards of one device), uploaded in order into one
    /// device array of the parts' summed tokens. A part with `rows` instead of data is read
    /// from there (vectors files, each chunk checked) by several threads while it uploads.
    struct TokenPart {
        const uint16_t* data;
        int64_t n_tokens;
        const VectorRows* rows = nullptr;
    };
    static Status Create(std::shared_ptr<kernels::GpuContext> ctx, const std::vector<TokenPart>& parts, int dim,
                         const int64_t* h_doc_offsets, int64_t n_docs, std::unique_ptr<GpuExactScorer>* out);
    /// A scorer that holds no documents: every call brings its own (Rows).
    static Status CreateForRows(std::shared_ptr<kernels::GpuContext> ctx, int dim,
                                std::unique_ptr<GpuExactScorer>* out);
    ~GpuExactScorer();
    /// Documents a call brings, on the host (pinned memory uploads fastest): tokens
    /// [offsets[n_docs], dim] fp16, document d's rows [offsets[d], offsets[d + 1]). They are
    /// uploaded with the call's inputs and scored instead of the resident ones.
    struct Rows {
        const uint16_t* tokens = nullptr;
        const int64_t* offsets = nullptr;
        int64_t n_docs = 0;
        /// Instead of tokens: [n_docs] where each document's rows start in host memory that is
        /// registered with the device (GpuShard::RegisterHost); the device reads them itself.
        const uint16_t* const* sources = nullptr;
        /// The tokens already on the device (GpuShard::StageRows), copied by another stream:
        /// the call waits for `ready` (a cudaEvent_t) on the device and copies nothing.
        const uint16_t* device_tokens = nullptr;
        void* ready = nullptr;
    };
    /// Top-k per query (doc indices, -1 padded) and scores, on the host. h_queries
    /// [n_queries, q_stride, dim] of q_dtype, uploaded as they are (fp16 queries against the
    /// fp16 documents take one MMA a tile; fp32 and bf16 ones are split into two fp16 terms).
    Status ScoreTopK(const void* h_queries, DType q_dtype, int n_queries, int q_stride, const int32_t* h_query_lens,
                     const int64_t* h_cand_offsets, const int32_t* h_cand_docs, int k, std::vector<int32_t>* ids,
                     std::vector<float>* scores, const Rows* rows = nullptr);
    Status ScoreTopK(const float* h_queries, int n_queries, int q_stride, const int32_t* h_query_lens,
                     const int64_t* h_cand_offsets, const int32_t* h_cand_docs, int k, std::vector<int32_t>* ids,
                     std::vector<float>* scores) {
        return ScoreTopK(h_queries, DType::kF32, n_queries, q_stride, h_query_lens, h_cand_offsets, h_cand_docs, k, ids,
                         scores);
    }
    /// Scores only, laid out like kernels::MaxSimParams::scores.
    Status Score(const void* h_queries, DType q_dtype, int n_queries, int q_stride, const int32_t* h_query_lens,
                 const int64_t* h_cand_offsets, const int32_t* h_cand_docs, std::vector<float>* scores,
                 const Rows* rows = nullptr);
    /// Whether documents are resident (Create, not CreateForRows).
    bool resident() const;
    Status Score(const float* h_queries, int n_queries, int q_stride, const int32_t* h_query_lens,
                 const int64_t* h_cand_offsets, const int32_t* h_cand_docs, std::vector<float>* scores) {
        return Score(h_queries, DType::kF32, n_queries, q_stride, h_query_lens, h_cand_offsets, h_cand_docs, scores);
    }

private:
    GpuExactScorer() = default;
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace tms::engine

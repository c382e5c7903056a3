// Copyright TileMaxSim authors. Host-level GPU exact scorer (no CUDA headers here).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tilemaxsim/status.h"

namespace tms::engine {

/// Number of CUDA devices; 0 without a driver or device (never an error).
Status GpuDeviceCount(int* n);

/// Owns device copies of one shard's fp16 token vectors and scores queries against them.
class GpuExactScorer {
public:
    static Status Create(int device, const uint16_t* h_tokens_f16, int64_t n_tokens, int dim,
                         const int64_t* h_doc_offsets, int64_t n_docs, std::unique_ptr<GpuExactScorer>* out);
    ~GpuExactScorer();
    /// Top-k per query (doc indices, -1 padded) and scores, on the host.
    Status ScoreTopK(const float* h_queries, int n_queries, int q_stride, const int32_t* h_query_lens,
                     const int64_t* h_cand_offsets, const int32_t* h_cand_docs, int k, std::vector<int32_t>* ids,
                     std::vector<float>* scores);
    /// Scores only, laid out like kernels::MaxSimParams::scores.
    Status Score(const float* h_queries, int n_queries, int q_stride, const int32_t* h_query_lens,
                 const int64_t* h_cand_offsets, const int32_t* h_cand_docs, std::vector<float>* scores);

private:
    GpuExactScorer() = default;
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace tms::engine

// Copyright TileMaxSim authors. One shard's data on one GPU, as the query pipeline uses it: the
// compressed tokens and IVF lists (candidate generation, compressed scoring) and the fp16
// vectors (exact scoring). Host header; made by engine::MakeGpuShard (backend.h), which is
// NotSupported in a build without CUDA.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/gpu_scorer.h"
#include "kernels/candidates.h"
#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms::engine {

/// Thread-safety: callers hold the shard's GpuContext mutex (one call at a time on the device,
/// and Candidates .. ScoreCandidatesTop of one search under one hold).
class GpuShard {
public:
    virtual ~GpuShard() = default;
    /// Codes, centroids and IVF lists are on the device (false: a shape the fused kernels do
    /// not cover; candidates and compressed scores are then the CPU's).
    virtual bool has_codes() const = 0;
    /// The fp16 vectors are on the device.
    virtual bool has_vectors() const = 0;
    /// Documents' rows a call brings from the host (tokens best in a PinnedRows buffer).
    using Rows = GpuExactScorer::Rows;
    /// Registers host memory with the device (page-locked and mapped) for Rows::sources,
    /// until the shard is destroyed; false when the system refuses (the rows are then copied).
    virtual bool RegisterHost(const void* p, size_t bytes) = 0;
    /// A pinned host buffer of at least `elems` fp16 values, one of two (slot 0 or 1) that the
    /// shard keeps and grows: rows gathered there upload at the link's full speed.
    virtual Status PinnedRows(int slot, size_t elems, uint16_t** out) = 0;
    /// Starts copying rows->tokens (`elems` fp16 values, in PinnedRows buffer `slot`) into the
    /// shard's device buffer of that slot on the context's copy stream, and returns at once
    /// with rows->device_tokens and rows->ready set: an ExactScore(TopK) of *rows then waits
    /// for the copy on the device, so that the copy of one step's rows overlaps the scoring of
    /// the step before. A slot is staged again only after the call that scored it returned.
    /// May be called beside a call of another thread that holds the context's mutex (it
    /// touches only the slot and the copy stream). ResourceExhausted when the device has no
    /// room for the buffer (the call then copies the rows itself).
    virtual Status StageRows(int slot, size_t elems, Rows* rows) = 0;

    // With has_codes(): GpuCodeScorer's Candidates, ScoreCandidatesTop, ScoreLists and Score.
    virtual Status Candidates(const void* h_queries, DType q_dtype, int n_queries, int q_stride,
                              const int32_t* h_query_lens, int nprobe, int ncandidates, Pruning pruning,
                              std::vector<int64_t>* off, std::vector<int32_t>* docs, std::vector<float>* keys,
                              uint64_t* ticket, const uint32_t* h_allow, bool allow_per_query,
                              std::vector<kernels::ProbeFrame>* frames) = 0;
    virtual Status ScoreCandidatesTop(int keep, std::vector<int64_t>* off, std::vector<int32_t>* docs,
                                      std::vector<float>* scores) = 0;
    virtual Status ScoreLists(const void* h_queries, DType q_dtype, int n_queries, int q_stride,
                              const int32_t* h_query_lens, const int64_t* h_off, const int32_t* h_docs, int keep,
                              std::vector<int64_t>* off, std::vector<int32_t>* docs, std::vector<float>* scores,
                              uint64_t ticket) = 0;
    virtual Status CodeScore(const float* h_queries, int n_queries, int q_stride, const int32_t* h_query_lens,
                             const int64_t* h_cand_offsets, const int32_t* h_cand_docs, bool centroids_only,
                             std::vector<float>* scores) = 0;

    // GpuExactScorer's Score and ScoreTopK: against `rows` when given, else (has_vectors()) the
    // resident vectors.
    virtual Status ExactScore(const void* h_queries, DType q_dtype, int n_queries, int q_stride,
                              const int32_t* h_query_lens, const int64_t* h_cand_offsets, const int32_t* h_cand_docs,
                              std::vector<float>* scores, const Rows* rows = nullptr) = 0;
    virtual Status ExactScoreTopK(const void* h_queries, DType q_dtype, int n_queries, int q_stride,
                                  const int32_t* h_query_lens, const int64_t* h_cand_offsets,
                                  const int32_t* h_cand_docs, int k, std::vector<int32_t>* ids,
                                  std::vector<float>* scores, const Rows* rows = nullptr) = 0;
};

}  // namespace tms::engine

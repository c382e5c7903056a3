// Copyright TileMaxSim authors.
// CUDA MaxSim and per-query top-k (host-only header: no CUDA includes; a stream is passed as
// void* and is a cudaStream_t). Every pointer inside MaxSimParams is a DEVICE pointer,
// including query_lens, doc_offsets, cand_offsets and cand_docs. The calls check only what
// needs no device read (sizes, null pointers); candidate ids outside [0, n_docs) yield a NaN
// score and are left out of top-k rather than read out of bounds.
// Calls enqueue work on `stream` and return without synchronizing; they never allocate and
// can be captured in a CUDA graph.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/maxsim.h"

namespace tms::kernels {

/// Largest k of maxsim_topk_cuda.
inline constexpr int kMaxTopKCuda = 1024;

/// Scores every (query, candidate) pair into p.scores (layout of maxsim_num_scores).
/// Supports dim multiple of 32 in [32, 1024], q_stride <= 256, any q/doc dtype
/// (fp16/bf16 docs use tensor cores directly; fp32 docs and mixed dtypes use a split
/// hi+lo representation so results stay within fp32 accuracy). Others: NotSupported.
Status maxsim_cuda(const MaxSimParams& p, void* stream);

/// Bench diagnostic: maxsim_cuda's launch with the same grid, copy ring and walk over the
/// documents, minus the tensor-core work; p.scores is left undefined. What it reaches is what
/// the copy pipeline alone allows on these inputs (`tms bench kernels`, impl "copy-only").
Status maxsim_cuda_copy_only(const MaxSimParams& p, void* stream);

/// Workspace maxsim_topk_cuda needs for these sizes (p.scores is ignored). Depends only on
/// n_queries, n_docs, dense/ragged, k and the current device.
size_t maxsim_topk_cuda_workspace_bytes(const MaxSimParams& p, int k);

/// Scores the candidates and writes per-query top-k, best first: d_out_ids [n_queries, k]
/// (DOCUMENT indices; ties -> lower index; short lists padded with -1) and d_out_scores
/// [n_queries, k] (padding -inf). p.scores is not used (may be null). d_workspace holds at
/// least maxsim_topk_cuda_workspace_bytes(p, k) bytes, 256-byte aligned. k in [1, 1024].
Status maxsim_topk_cuda(const MaxSimParams& p, int k, int32_t* d_out_ids, float* d_out_scores, void* d_workspace,
                        size_t workspace_bytes, void* stream);

/// Number of CUDA devices; 0 (and OK) without a driver or device. Never fails hard.
Status cuda_device_count(int* n);
/// Free memory of GPU `device` (cudaMemGetInfo), the current device left as it was.
Status cuda_free_memory(int device, int64_t* free_bytes);

}  // namespace tms::kernels

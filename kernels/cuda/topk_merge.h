// Copyright TileMaxSim authors. Host side of the MaxSim kernels' per-query top-k (internal): the
// kernels leave one sorted list of k keys per (query, slice); merge_partials reduces them to k per
// query in rounds of fan-in 8. Used by maxsim_topk_cuda and code_maxsim_topk_cuda.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "tilemaxsim/status.h"

namespace tms::kernels::topk_dev {

/// Workspace of the partial lists for n_slices slices: [n_queries, n_slices, k] keys, then
/// the first merge round's output (256-byte aligned parts).
size_t partial_bytes(int n_queries, int n_slices, int k);

/// Merges the lists at d_workspace (laid out as partial_bytes says) into d_out_ids /
/// d_out_scores [n_queries, k], best first (ids -1 and scores -inf past the last entry).
Status merge_partials(void* d_workspace, int n_slices, int n_queries, int k, int32_t* d_out_ids, float* d_out_scores,
                      cudaStream_t stream);

}  // namespace tms::kernels::topk_dev

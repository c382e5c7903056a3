// Copyright TileMaxSim authors. The candidate-generation ops (kernels/candidates.h) as device
// kernels, enqueued on a stream; every pointer is device memory the caller owns. The IVF union
// takes three steps around a host-side prefix sum (the caller sizes the output from the counts):
// ivf_mark_cuda sets each query's bits, bit_count_cuda counts them, bit_emit_cuda writes them out.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/candidates.h"

namespace tms::kernels {

/// bits [n_queries, bitmap_words(n_docs)], zeroed by the caller: bit d of query q's row set
/// for every document of its probed lists (p's pointers on the device).
Status ivf_mark_cuda(const IvfUnionParams& p, uint32_t* bits, cudaStream_t stream);
/// counts [n_queries]: the set bits of each row of bits [n_queries, words].
Status bit_count_cuda(const uint32_t* bits, int64_t words, int n_queries, int64_t* counts, cudaStream_t stream);
/// The ids of each row's set bits, ascending, into docs[off[q] ..] (off: the counts' prefix sums).
Status bit_emit_cuda(const uint32_t* bits, int64_t words, int n_queries, const int64_t* off, int32_t* docs,
                     cudaStream_t stream);
/// probe_scores on the device, in three steps around a host-side prefix sum, over ranges of
/// kProbeRangeDocs documents (one CTA per range and query scores them in shared memory):
///   probe_accumulate_cuda: every query's fixed-point scores into dense [n_queries, n_docs]
///     (score + 1; 0: not probed) and their histogram into hist [n_queries, kProbeBins] (zeroed
///     by the caller), bin min(v >> kProbeBinShift, kProbeBins - 1);
///   probe_threshold_cuda: per query the least value thr[q] that keeps at least p.keep documents
///     (every probed one when it has no more, or keep is 0), whole bins only, and counts[q], the
///     documents at or above it;
///   probe_emit_cuda: those documents and their scores (as float, exact) into docs / scores from
///     off[q] (the counts' prefix sums), in no particular order; cursor [n_queries] zeroed by the
///     caller. The caller keeps the p.keep best of each list (score descending, document
///     ascending).
inline constexpr int kProbeRangeDocs = 8192;
inline constexpr int kProbeBins = 2048;
inline constexpr int kProbeBinShift = 12;  // kProbeScoreUnit / kProbeBins
/// Ranges of n_docs documents.
inline int64_t probe_ranges(int64_t n_docs) { return (n_docs + kProbeRangeDocs - 1) / kProbeRangeDocs; }
/// rix [n_centroids, probe_ranges(n_docs) + 1]: where each range's documents start in each IVF
/// list, relative to the list's start (ivf_off / ivf_docs on the device, lists ascending).
Status ivf_range_index_cuda(const int64_t* ivf_off, const int32_t* ivf_docs, int n_centroids, int64_t n_docs,
                            int32_t* rix, cudaStream_t stream);
Status probe_accumulate_cuda(const ProbeScoreParams& p, const int32_t* rix, uint32_t* dense, uint32_t* hist,
                             cudaStream_t stream);
Status probe_threshold_cuda(const uint32_t* hist, int n_queries, int keep, uint32_t* thr, int64_t* counts,
                            cudaStream_t stream);
Status probe_emit_cuda(const uint32_t* dense, int n_queries, int64_t n_docs, const uint32_t* thr, const int64_t* off,
                       uint32_t* cursor, int32_t* docs, float* scores, cudaStream_t stream);
/// split_tf32x3_ref on the device.
Status split_tf32x3_cuda(const float* src, int64_t rows, int dim, unsigned lo_parts, float* dst, cudaStream_t stream);

/// Per row of s [rows, K] (one warp a row): its n best columns in order into out [rows, n] (-1
/// past K), ties to the lower column (warp_row_top_n): the centroids a query token probes.
Status row_top_n_cuda(const float* s, int64_t rows, int K, int n, int32_t* out, cudaStream_t stream);
/// As row_top_n_cuda, with the scores: the first nprobe of each row's n best into probe and
/// scores [rows, nprobe], the n-th best's score into floor [rows] (n = nprobe + 1: the best
/// unprobed centroid; n = nprobe when every centroid is probed: the worst probed one).
Status row_top_n_scores_cuda(const float* s, int64_t rows, int K, int n, int nprobe, int32_t* probe, float* scores,
                             float* floor, cudaStream_t stream);
/// keys[i] = topk_dev::make_key(scores[i], docs[i]) for i < n: in descending key order, score
/// descending, then document ascending.
Status score_doc_keys_cuda(const float* scores, const int32_t* docs, int64_t n, uint64_t* keys, cudaStream_t stream);
/// The first new_off[q + 1] - new_off[q] keys of each sorted segment q (from off[q]) back to
/// documents into docs, and scores into `scores` when it is not null (new_off indexes both).
Status gather_top_keys_cuda(const uint64_t* sorted, const int64_t* off, const int64_t* new_off, int n_segments,
                            int32_t* docs, float* scores, cudaStream_t stream);

}  // namespace tms::kernels

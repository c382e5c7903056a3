// Copyright TileMaxSim authors. The candidate-generation ops (kernels/candidates.h) as device
// kernels, enqueued on a stream; every pointer is device memory the caller owns. The IVF union
// takes three steps around a host-side prefix sum (the caller sizes the output from the counts):
// ivf_mark_cuda sets each query's bits, bit_count_cuda counts them, bit_emit_cuda writes them out.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/candidates.h"

namespace tms::kernels {

/// Words of one query's bitmap over n_docs documents.
inline int64_t ivf_bitmap_words(int64_t n_docs) { return (n_docs + 31) / 32; }

/// bits [n_queries, ivf_bitmap_words(n_docs)], zeroed by the caller: bit d of query q's row set
/// for every document of its probed lists (p's pointers on the device).
Status ivf_mark_cuda(const IvfUnionParams& p, uint32_t* bits, cudaStream_t stream);
/// counts [n_queries]: the set bits of each row of bits [n_queries, words].
Status bit_count_cuda(const uint32_t* bits, int64_t words, int n_queries, int64_t* counts, cudaStream_t stream);
/// The ids of each row's set bits, ascending, into docs[off[q] ..] (off: the counts' prefix sums).
Status bit_emit_cuda(const uint32_t* bits, int64_t words, int n_queries, const int64_t* off, int32_t* docs,
                     cudaStream_t stream);
/// split_tf32x3_ref on the device.
Status split_tf32x3_cuda(const float* src, int64_t rows, int dim, unsigned lo_parts, float* dst, cudaStream_t stream);

}  // namespace tms::kernels

// Copyright TileMaxSim authors. Token pooling: each document's most similar tokens merged before encoding.
#pragma once

#include <cstdint>
#include <vector>

#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms::index {

/// The tokens a document of `len` keeps under pooling by `factor`: ceil(len / factor) (all of
/// them for factor <= 1).
inline int64_t PooledLength(int64_t len, int factor) { return factor <= 1 ? len : (len + factor - 1) / factor; }

/// Pools one document (the reference): agglomerative clustering of its `n` tokens `x` [n, dim],
/// the two clusters whose mean directions have the highest cosine merged first (ties: the
/// lowest cluster, then its lowest partner; a cluster is named by its first token), until `keep`
/// remain; each cluster becomes its mean direction scaled to its tokens' mean norm (unit tokens
/// pool to unit tokens), in the order of the clusters' first tokens. out: [keep, dim].
void PoolTokens(const float* x, int64_t n, int dim, int64_t keep, float* out);

/// Pools every document of `tokens` (rows of each document contiguous, `doclens`) by `factor`
/// on every thread: out [sum PooledLength, dim] fp16, out_lens the pooled lengths.
Status PoolDocuments(const EmbeddingView& tokens, const std::vector<int64_t>& doclens, int factor,
                     std::vector<uint16_t>* out, std::vector<int64_t>* out_lens);

}  // namespace tms::index

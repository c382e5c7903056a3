// Copyright TileMaxSim authors. Training an index's model: the token sample, k-means, the codec.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "index/model.h"
#include "tilemaxsim/options.h"
#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms::index {

/// `release(shard, rows)`: the first `rows` rows of a memory-mapped shard are done with (their
/// pages may be dropped).
using ReleaseFn = std::function<void(size_t shard, int64_t rows)>;

/// The tokens TrainModel samples for `n_centroids` centroids out of `n_tokens`:
/// max(kMinTrainTokens, opts.train_tokens_per_centroid x n_centroids), at most
/// opts.max_train_tokens (when > 0) and n_tokens.
inline constexpr int64_t kMinTrainTokens = 262144;
int64_t TrainSampleTokens(int64_t n_tokens, int n_centroids, const IndexBuildOptions& opts);
/// PLAID's centroid count for `n_tokens` (the power of two nearest 16 sqrt(n_tokens) from
/// below), halved until every centroid has at least 8 of the `n_train` tokens sampled at most.
int AutoCentroids(int64_t n_tokens, int64_t n_train);

/// Sample (TrainSampleTokens rows for k-means and an independent 65,536 for the codec, drawn
/// directly: no memory beyond the samples), k-means, codec training on the residuals of its
/// sample. Reads only the sampled rows of `tokens` (and releases them behind
/// the sampling pass when `release` is set); a non-finite sampled value is an error naming
/// names[shard] (or "docs"). `shards` are read as one concatenated token matrix.
Status TrainModel(const std::vector<EmbeddingView>& shards, const IndexBuildOptions& opts, IndexModel* model,
                  std::vector<std::pair<std::string, double>>* phase_seconds,
                  const std::vector<std::string>* names = nullptr, const ReleaseFn& release = nullptr);

/// min(k, n) distinct values of [0, n), uniformly at random (seeded), ascending: the rows
/// TrainModel samples.
std::vector<int64_t> SortedSample(int64_t n, int64_t k, uint64_t seed);

}  // namespace tms::index

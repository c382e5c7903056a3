// Copyright TileMaxSim authors. Hybrid search's fusion of a MaxSim and a BM25 ranking
// (SearchOptions::mode kHybrid; the searcher gathers both, engine/searcher.cpp).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "tilemaxsim/types.h"

namespace tms::engine {

/// (internal id, score) of one ranking, in any order.
using Scored = std::vector<std::pair<int64_t, float>>;

/// The reciprocal-rank constant (Cormack et al.): a document's share is weight / (kRrfK + rank),
/// ranks from 1.
inline constexpr double kRrfK = 60;

/// One query's fused best k: each ranking ordered by score (ties to the lower id), then kRrf:
/// weight / (kRrfK + rank) summed over the rankings holding the document; kWeighted: the
/// weighted sum of its scores scaled to [0, 1] over each ranking (min to max; a ranking of
/// equal scores scales them to 1). Weights: bm25_weight for `bm25`, 1 - bm25_weight for
/// `maxsim`. A document only in rankings of weight 0 is left out. Best first, ties to the
/// lower id.
Scored FuseRankings(const Scored& maxsim, const Scored& bm25, Fusion fusion, double bm25_weight, int k);

}  // namespace tms::engine

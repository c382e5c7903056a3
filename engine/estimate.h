// Copyright TileMaxSim authors. How an index's recall estimate becomes a search plan, and the
// pseudo-queries it is measured with. Internal to the engine (Searcher::Plan is the public view).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tilemaxsim/estimate.h"
#include "tilemaxsim/options.h"
#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms {

/// The pseudo-queries EstimateRecall measures with `opts`' recipe, at most `n` (one a live
/// document): [*n_out, opts.query_tokens, dim] fp16 into *q, each one's tokens used into *lens.
Status MakePseudoQueries(const std::string& path, const EstimateOptions& opts, int n, std::vector<uint16_t>* q,
                         std::vector<int32_t>* lens, int* n_out);
/// `opts` with nprobe, ncandidates and rerank taken from est.For(opts.target_recall), each only
/// where it holds SearchOptions' default (a value set otherwise is kept); `opts` as given when
/// target_recall is 0, when the search is exhaustive or when `est` has no points.
SearchOptions ApplyTargetRecall(const RecallEstimate& est, const SearchOptions& opts);
/// The search a call runs (Searcher::Plan): with target_recall > 0 and not exhaustive, `opts`
/// with the estimate's setting for the target (ApplyTargetRecall; `est` may be null) when the
/// vectors are loaded, and then exhaustive when the index's `live_docs` are at most
/// SmallIndexDocs (exhaustive search scores them all exactly, for less); else `opts` as given.
/// `device`: where the search runs (kCpu or kGpu).
SearchOptions PlanSearch(const RecallEstimate* est, int64_t live_docs, bool vectors, Device device,
                         const SearchOptions& opts);
/// The live documents up to which exhaustive search is cheaper than `o`'s approximate search on
/// `device`: o.rerank on a CPU, 2 * o.ncandidates on a GPU.
int64_t SmallIndexDocs(Device device, const SearchOptions& o);

}  // namespace tms

// Copyright TileMaxSim authors. The distributed cut protocol: one approximate search spread over
// several searchers (MPI ranks, or any other group of processes) that keeps exactly the
// candidates one Searcher over all the shards would keep. Internal to the engine and the MPI
// runtime (not installed).
#pragma once

#include <cstdint>
#include <vector>

#include "tilemaxsim/options.h"
#include "tilemaxsim/searcher.h"
#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms {

/// A candidate's place in a cut: its score and internal id.
struct CutKey {
    float score = 0;
    int64_t id = 0;
};
/// The cut order: a higher score first, then a lower id (as Search ranks hits).
inline bool CutKeyBetter(const CutKey& a, const CutKey& b) {
    return a.score > b.score || (a.score == b.score && a.id < b.id);
}

/// The collective steps of one approximate search spread over several searchers, each holding
/// some of an index's shards (MPI ranks, or any other group of processes): through it, every
/// participant keeps exactly the candidates that one Searcher over all the shards would keep, so
/// that the merged results equal that Searcher's, whatever the split. A search cuts its
/// candidates twice per chunk of queries (the best ncandidates by pruning score, when
/// ncandidates > 0; then the best max(rerank, k), or k, by compressed score); every participant
/// makes the same calls in the same order.
class SearchCuts {
public:
    virtual ~SearchCuts();
    /// Documents and centroids of the whole index (every participant's shards): they size the
    /// chunks a batch is searched in, which must be the same everywhere.
    virtual int64_t n_docs() const = 0;
    virtual int n_centroids() const = 0;
    /// Collective. `best[q]`: this participant's best (at most `keep`) keys of query q, in any
    /// order, or its error in `mine`. *cut gets per query the keep-th best key over every
    /// participant's, or {-inf, INT64_MAX} where they hold fewer (everything is kept). Any
    /// participant's error fails the call on every participant, with that error.
    virtual Status Cut(int keep, const Status& mine, const std::vector<std::vector<CutKey>>& best,
                       std::vector<CutKey>* cut) = 0;
};

/// Approximate search of `searcher`'s shards as a part of a whole whose other parts run the same
/// call elsewhere, each cut agreed through `cuts` (SearchCuts); each participant returns its own
/// documents' share of the whole's top-k (MergeHits of every participant's gives that of one
/// Searcher over the whole). `searcher` may be null: a participant that holds no documents takes
/// part in the cuts and returns empty lists. Exhaustive search needs no cuts (each participant's
/// exact top-k, merged, is exact) and makes none.
Status SearchWithCuts(const Searcher* searcher, const QueryBatch& queries, const SearchOptions& opts, SearchCuts* cuts,
                      std::vector<std::vector<SearchHit>>* results, SearchTimings* timings = nullptr);

/// The exact top-k of several searchers' results for the same queries (parts[p][q]: searcher
/// p's hits of query q, each list best first): score descending, lower internal id first, as one
/// Searcher over all their shards ranks them. The parts are moved from.
void MergeHits(std::vector<std::vector<std::vector<SearchHit>>>* parts, int n_queries, int k,
               std::vector<std::vector<SearchHit>>* out);

}  // namespace tms

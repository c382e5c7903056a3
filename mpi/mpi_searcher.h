// Copyright TileMaxSim authors. Distributed search and builds over an MPI communicator (built and
// installed only with TMS_ENABLE_MPI; the one public header that needs mpi.h; link tms_mpi).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tilemaxsim/estimate.h"
#include "tilemaxsim/index_builder.h"
#include "tilemaxsim/searcher.h"

namespace tms {
namespace mpi {
class Channel;
}

/// Where the time of a distributed search went, summed over its batches (rank 0's view).
struct MpiSearchStats {
    int64_t batches = 0;
    double broadcast_s = 0;  ///< waiting for a batch's queries to arrive (every rank: the broadcast)
    double search_s = 0;     ///< this rank's own search of its shards, cuts included
    double cut_s = 0;        ///< of search_s: the cuts (every rank's best keys to rank 0 and each
                             ///< cut back, including waiting for slower ranks' stages)
    double gather_s = 0;     ///< the per-rank results reaching rank 0 (including slower ranks' search)
    double merge_s = 0;      ///< rank 0: decoding and merging the per-rank top-k lists
};

/// Scatter-gather search: rank r of the communicator opens the r-th of R runs of consecutive
/// shards of the index (S shards: S / R each, the first S % R ranks one more;
/// SearcherOptions::shards is set so; its devices, as in one process, place them), rank 0's
/// queries are broadcast batch by batch, every rank searches its shards, and the per-rank top-k
/// lists are merged on rank 0 (MergeHits): the results of one Searcher over every shard, exhaustive
/// or approximate (the ranks cut their candidates together, SearchWithCuts).
/// Every call is collective: all ranks make it, in the same order. Every wait is bounded
/// (timeout_s): a rank that stops answering ends the job (MPI_Abort) with a message naming what
/// did not arrive. A rank that fails (a missing shard, a bad batch) fails the call on every rank
/// with one message naming the failed ranks. The index directory must be readable on every rank
/// (a shared filesystem, or the same copy on each node); a rank reads only its shards' stores and
/// the last shard's (which holds the index's deletions).
class MpiSearcher {
public:
    static Status Open(MPI_Comm comm, const SearcherOptions& opts, const std::string& path,
                       std::unique_ptr<MpiSearcher>* out, double timeout_s = 600);
    ~MpiSearcher();

    int rank() const { return rank_; }
    int size() const { return size_; }
    /// The index's shard count, and this rank's shards.
    int n_shards() const { return n_shards_; }
    const std::vector<int>& shards() const { return mine_; }
    /// This rank's searcher (null when it holds no shard: more ranks than shards).
    const Searcher* local() const { return local_.get(); }

    /// Collective. Rank 0's `queries` (the other ranks' are ignored) are searched in batches of
    /// `batch`; on rank 0 `on_batch(first_query, hits)` receives each batch's merged results, in
    /// order. The broadcast of batch i + 1 starts before rank 0 merges batch i, so that the other
    /// ranks search while it merges. An error of on_batch ends the search on every rank.
    /// Modes bm25 and hybrid (SearchOptions::mode; rank 0's query_texts) give the results of
    /// one Searcher too: each rank ranks its own documents by BM25 over the index's text
    /// (every rank reads the same text index), and for hybrid rank 0 sends every rank the union
    /// of the merged BM25 and MaxSim candidates, which each scores exactly where it holds the
    /// document before rank 0 fuses the rankings.
    Status SearchBatches(const QueryBatch& queries, int batch, const SearchOptions& opts,
                         const std::function<Status(int64_t, std::vector<std::vector<SearchHit>>&)>& on_batch);
    /// Collective: one batch; results on rank 0.
    Status Search(const QueryBatch& queries, const SearchOptions& opts, std::vector<std::vector<SearchHit>>* results);

    const MpiSearchStats& stats() const { return stats_; }

private:
    MpiSearcher() = default;
    std::unique_ptr<mpi::Channel> ch_;
    int rank_ = 0, size_ = 1, n_shards_ = 0, n_centroids_ = 0;
    int64_t n_docs_ = 0, live_docs_ = 0;  // of the whole index (live: not deleted)
    std::vector<int> mine_;
    std::unique_ptr<Searcher> local_;
    RecallEstimate estimate_;              // rank 0 resolves SearchOptions::target_recall with it
    bool tune_ = false, vectors_ = false;  // vectors_: loaded (exhaustive search can run)
    bool exact_ = false;                   // every rank's shards have their vectors loaded
    MpiSearchStats stats_;
};

/// The ranks of `comm` as an IndexBuilder's BuildGroup (IndexBuilder::SetGroup): a distributed
/// build, every wait bounded by timeout_s.
std::unique_ptr<BuildGroup> MakeMpiBuildGroup(MPI_Comm comm, double timeout_s = 600);

}  // namespace tms

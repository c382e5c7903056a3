// Copyright TileMaxSim authors. The index a server serves: the searcher of its latest commit, and
// its one writer.
//
// Searches take the current searcher (a shared pointer: a search that started on one keeps it
// to the end). Writes are committed in groups: the writes that arrive while one group commits
// form the next, applied by one updater, committed durably at once, then a searcher of the new
// state is opened and put in place; only then do their calls return. So a write is acknowledged
// only when it is on disk and every search that starts after sees it, one group's cost (the new
// searcher) is shared by its writes, and searches never wait for writes.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tilemaxsim/estimate.h"
#include "tilemaxsim/metadata.h"
#include "tilemaxsim/options.h"
#include "tilemaxsim/searcher.h"
#include "tilemaxsim/status.h"

namespace tms::server {

class IndexService {
public:
    /// Opens the index at `path` for searching with `opts`. `compact_deleted`: after a write
    /// leaves at least this share of the documents deleted (and at least 1,000), the index is
    /// compacted before the next write (0: only when asked, Compact).
    static Status Open(const std::string& path, const SearcherOptions& opts, std::unique_ptr<IndexService>* out,
                       double compact_deleted = 0);

    /// The searcher of the latest acknowledged write.
    std::shared_ptr<const Searcher> Current() const;
    /// The same, and the recall estimate it plans from, as read when it opened (null: none).
    std::shared_ptr<const Searcher> Current(std::shared_ptr<const RecallEstimate>* estimate) const;
    /// Writes acknowledged since the server started.
    int64_t generation() const { return generation_.load(); }

    /// Adds documents (IndexUpdater::Add). `required_filter` (an API key's): every new document's
    /// metadata must satisfy it, and a replaced document must be one it allows; otherwise the
    /// call fails, changing nothing, with an InvalidArgument whose message starts kForbidden.
    Status Add(const EmbeddingView& tokens, const std::vector<int64_t>& doclens, const std::vector<std::string>& ids,
               bool replace, const DocMetadata* metadata, const std::string& required_filter);
    /// Deletes documents by external id, all or none: NotFound naming the ids the index does not
    /// hold (or that `required_filter` does not allow, so that another tenant's ids look absent).
    Status Delete(const std::vector<std::string>& ids, const std::string& required_filter, int64_t* deleted);

    /// Rewrites the index without its deleted documents (CompactIndex), between two write
    /// groups; searches go on meanwhile, with the searcher before, then the one after.
    Status Compact();

    /// Measures the recall estimate again on the sample of the queries served
    /// (SearcherOptions::record_into, EstimateRecall) with the current searcher, when at least
    /// `min_new` queries were served since the last measurement (writes go on meanwhile; call it
    /// when searches are idle); then, between two write groups, stores it and opens a searcher
    /// that plans from it. *measured: whether it did. A failed measurement is not tried again
    /// before min_new more queries.
    Status Recalibrate(int64_t min_new, bool* measured);
    /// Whether Recalibrate(min_new) would measure: min_new queries served since the last time.
    bool RecalibrationDue(int64_t min_new) const;
    /// The queries searched so far (0 without a sample).
    int64_t queries_seen() const;
    const std::string& path() const { return path_; }
    /// Ends a measurement of Recalibrate in progress at its next step (Cancelled), and keeps
    /// later ones from starting: for a server that stops.
    void StopRecalibrating() { stop_measuring_ = true; }

    /// The documents `filter` allows in `s` (empty filter: null, every document).
    static Status Allowed(const Searcher& s, const std::string& filter, std::shared_ptr<DocSet>* out);

private:
    // One write of a group commit (Commit).
    struct Write {
        bool is_delete = false, is_compact = false, is_estimate = false;
        const RecallEstimate* estimate = nullptr;  // is_estimate: to store
        const EmbeddingView* tokens = nullptr;
        const std::vector<int64_t>* doclens = nullptr;
        const std::vector<std::string>* ids = nullptr;
        bool replace = false;
        const DocMetadata* metadata = nullptr;
        int64_t deleted = 0;
        Status status;
        bool done = false;
    };
    struct Applied {
        Status status;
        bool committed = false;  // on disk (a failure after it is the new searcher's)
    };

    IndexService() = default;
    Status Commit(Write* w);
    Applied Apply(const std::vector<Write*>& group);  // one updater, one commit, one new searcher
    Status CompactNow();                              // the group committer only
    Status StoreEstimate(const RecallEstimate& e);    // the group committer only
    Status Reopen(bool count_write = true);
    Status CheckNewMetadata(const std::vector<std::string>& ids, const DocMetadata* metadata,
                            const std::string& required_filter) const;

    std::string path_;
    SearcherOptions opts_;
    double compact_deleted_ = 0;
    mutable std::mutex current_mu_;
    std::shared_ptr<const Searcher> current_;
    std::shared_ptr<const RecallEstimate> current_estimate_;  // under current_mu_, with current_
    std::mutex queue_mu_;                                     // pending_, committing_, Write::done
    std::condition_variable queue_cv_;
    std::vector<Write*> pending_;
    bool committing_ = false;
    std::atomic<int64_t> generation_{0};
    std::atomic<int64_t> estimated_seen_{0};  // queries seen at the last measurement
    std::mutex recalibrate_mu_;               // one measurement at a time
    std::atomic<bool> stop_measuring_{false};
};

/// Messages of writes a key's filter refuses start with this.
inline constexpr const char* kForbidden = "forbidden: ";

}  // namespace tms::server

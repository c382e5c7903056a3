// Copyright TileMaxSim authors. The index a server serves: the searcher of its latest commit, and
// its one writer.
//
// Searches take the current searcher (a shared pointer: a search that started on one keeps it
// to the end). A write opens the index's updater, commits durably, opens a searcher of the new
// state and puts it in place before it returns: a write is acknowledged only when it is on disk
// and every search that starts after sees it. Writes run one at a time; searches never wait for
// them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tilemaxsim/metadata.h"
#include "tilemaxsim/options.h"
#include "tilemaxsim/searcher.h"
#include "tilemaxsim/status.h"

namespace tms::server {

class IndexService {
public:
    /// Opens the index at `path` for searching with `opts`.
    static Status Open(const std::string& path, const SearcherOptions& opts, std::unique_ptr<IndexService>* out);

    /// The searcher of the latest acknowledged write.
    std::shared_ptr<const Searcher> Current() const;
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

    /// The documents `filter` allows in `s` (empty filter: null, every document).
    static Status Allowed(const Searcher& s, const std::string& filter, std::shared_ptr<DocSet>* out);

private:
    IndexService() = default;
    Status Reopen();  // under write_mu_
    Status CheckNewMetadata(const std::vector<std::string>& ids, const DocMetadata* metadata,
                            const std::string& required_filter) const;

    std::string path_;
    SearcherOptions opts_;
    mutable std::mutex current_mu_;
    std::shared_ptr<const Searcher> current_;
    std::mutex write_mu_;
    std::atomic<int64_t> generation_{0};
};

/// Messages of writes a key's filter refuses start with this.
inline constexpr const char* kForbidden = "forbidden: ";

}  // namespace tms::server

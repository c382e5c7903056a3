// Copyright TileMaxSim authors.
#include "server/index_service.h"

#include <filesystem>
#include <stdlib.h>

#include "index/ingest/metadata_jsonl.h"
#include "index/metadata/metadata.h"
#include "tilemaxsim/index_updater.h"

namespace tms::server {

Status IndexService::Open(const std::string& path, const SearcherOptions& opts, std::unique_ptr<IndexService>* out) {
    std::unique_ptr<IndexService> s(new IndexService());
    s->path_ = path;
    s->opts_ = opts;
    s->opts_.progress = false;
    std::unique_ptr<Searcher> searcher;
    TMS_RETURN_IF_ERROR(Searcher::Open(s->opts_, path, &searcher));
    s->current_ = std::move(searcher);
    *out = std::move(s);
    return Status::OK();
}

std::shared_ptr<const Searcher> IndexService::Current() const {
    std::lock_guard<std::mutex> lk(current_mu_);
    return current_;
}

Status IndexService::Reopen() {
    std::unique_ptr<Searcher> searcher;
    TMS_RETURN_IF_ERROR(Searcher::Open(opts_, path_, &searcher));
    std::shared_ptr<const Searcher> next(std::move(searcher));
    {
        std::lock_guard<std::mutex> lk(current_mu_);
        current_.swap(next);
    }
    ++generation_;
    return Status::OK();  // `next` (the old searcher) goes when its last search ends
}

Status IndexService::Allowed(const Searcher& s, const std::string& filter, std::shared_ptr<DocSet>* out) {
    out->reset();
    if (filter.empty()) return Status::OK();
    auto set = std::make_shared<DocSet>();
    TMS_RETURN_IF_ERROR(s.Filter(filter, set.get()));
    *out = std::move(set);
    return Status::OK();
}

namespace {

// A directory of its own under TMPDIR, removed with the object.
struct ScratchDir {
    std::string path;
    ~ScratchDir() {
        if (path.empty()) return;
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    Status Make() {
        const char* env = getenv("TMPDIR");
        std::string tmpl = std::string(env && *env ? env : "/tmp") + "/tms-serve-check.XXXXXX";
        if (!mkdtemp(tmpl.data())) return Status::IOError(tmpl + ": cannot create a scratch directory");
        path = tmpl;
        return Status::OK();
    }
};

}  // namespace

Status IndexService::CheckNewMetadata(const std::vector<std::string>& ids, const DocMetadata* metadata,
                                      const std::string& required_filter) const {
    if (required_filter.empty()) return Status::OK();
    if (!metadata || metadata->objects.empty()) {
        return Status::InvalidArgument(
            std::string(kForbidden) +
            "this key adds only documents whose metadata satisfies its filter: give metadata");
    }
    // The new rows in a metadata file of their own, filtered as a search would filter them.
    const std::shared_ptr<const Searcher> s = Current();
    index::MetaRows rows;
    TMS_RETURN_IF_ERROR(index::ResolveMetadata(*metadata, ids, s->info().metadata_columns, &rows));
    ScratchDir dir;
    TMS_RETURN_IF_ERROR(dir.Make());
    {
        std::unique_ptr<index::MetadataWriter> w;
        TMS_RETURN_IF_ERROR(index::MetadataWriter::Create(dir.path + "/" + index::kMetadataFile, rows.columns, &w));
        for (size_t i = 0; i < ids.size(); ++i) TMS_RETURN_IF_ERROR(w->Insert(int64_t(i), ids[i], rows.cells[i]));
        TMS_RETURN_IF_ERROR(w->Commit());
    }
    std::unique_ptr<index::MetadataSnapshot> snap;
    TMS_RETURN_IF_ERROR(index::MetadataSnapshot::Load(dir.path, int64_t(ids.size()), &snap));
    std::vector<uint32_t> bits;
    int64_t count = 0;
    Status st = snap ? snap->Filter(required_filter, &bits, &count) : Status::NotFound("no metadata");
    if (!st.ok()) {
        return Status::InvalidArgument(std::string(kForbidden) +
                                       "the new documents' metadata does not satisfy this key's filter");
    }
    for (size_t i = 0; i < ids.size(); ++i) {
        if (!((bits[i / 32] >> (i % 32)) & 1u)) {
            return Status::InvalidArgument(std::string(kForbidden) + "document '" + ids[i] +
                                           "': its metadata does not satisfy this key's filter");
        }
    }
    return Status::OK();
}

Status IndexService::Add(const EmbeddingView& tokens, const std::vector<int64_t>& doclens,
                         const std::vector<std::string>& ids, bool replace, const DocMetadata* metadata,
                         const std::string& required_filter) {
    std::lock_guard<std::mutex> lk(write_mu_);
    TMS_RETURN_IF_ERROR(CheckNewMetadata(ids, metadata, required_filter));
    if (replace && !required_filter.empty()) {
        // A replaced document must be one this key may see.
        const std::shared_ptr<const Searcher> s = Current();
        std::vector<int64_t> internal;
        s->FindDocs(ids, &internal);
        std::shared_ptr<DocSet> allowed;
        TMS_RETURN_IF_ERROR(Allowed(*s, required_filter, &allowed));
        for (size_t i = 0; i < ids.size(); ++i) {
            if (internal[i] >= 0 && !allowed->Has(0, internal[i])) {
                return Status::InvalidArgument(std::string(kForbidden) + "document '" + ids[i] +
                                               "' is not one this key may replace");
            }
        }
    }
    std::unique_ptr<IndexUpdater> up;
    TMS_RETURN_IF_ERROR(IndexUpdater::Open(path_, /*progress=*/false, &up));
    TMS_RETURN_IF_ERROR(up->Add(tokens, doclens, ids, replace, metadata));
    TMS_RETURN_IF_ERROR(up->Commit());
    up.reset();
    return Reopen();
}

Status IndexService::Delete(const std::vector<std::string>& ids, const std::string& required_filter, int64_t* deleted) {
    std::lock_guard<std::mutex> lk(write_mu_);
    const std::shared_ptr<const Searcher> s = Current();
    std::vector<int64_t> internal;
    s->FindDocs(ids, &internal);
    std::shared_ptr<DocSet> allowed;
    TMS_RETURN_IF_ERROR(Allowed(*s, required_filter, &allowed));
    std::string missing;
    int n_missing = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
        if (internal[i] < 0 || (allowed && !allowed->Has(0, internal[i]))) {
            if (n_missing++ < 5) missing += (missing.empty() ? "'" : ", '") + ids[i] + "'";
        }
    }
    if (n_missing) {
        return Status::NotFound(std::to_string(n_missing) + " of the ids are not in the index (" + missing +
                                (n_missing > 5 ? ", ..." : "") + "): nothing was deleted");
    }
    std::unique_ptr<IndexUpdater> up;
    TMS_RETURN_IF_ERROR(IndexUpdater::Open(path_, /*progress=*/false, &up));
    int64_t already = 0;
    TMS_RETURN_IF_ERROR(up->Delete(ids, &already));
    TMS_RETURN_IF_ERROR(up->Commit());
    up.reset();
    *deleted = int64_t(ids.size()) - already;
    return Reopen();
}

}  // namespace tms::server

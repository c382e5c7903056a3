// Copyright TileMaxSim authors.
#include "server/index_service.h"

#include <chrono>
#include <filesystem>
#include <stdlib.h>

#include "base/log.h"
#include "index/ingest/metadata_jsonl.h"
#include "index/metadata/metadata.h"
#include "tilemaxsim/estimate.h"
#include "tilemaxsim/index_updater.h"

namespace tms::server {

Status IndexService::Open(const std::string& path, const SearcherOptions& opts, std::unique_ptr<IndexService>* out,
                          double compact_deleted) {
    std::unique_ptr<IndexService> s(new IndexService());
    s->path_ = path;
    s->compact_deleted_ = compact_deleted;
    s->opts_ = opts;
    s->opts_.progress = false;
    TMS_RETURN_IF_ERROR(s->Reopen(/*count_write=*/false));
    *out = std::move(s);
    return Status::OK();
}

namespace {

// The estimate stored with the index at `path` (null: none or unreadable), read just after a
// searcher opened it: the one that searcher plans from (writes to it are serialized with opens).
std::shared_ptr<const RecallEstimate> ReadEstimate(const std::string& path) {
    auto e = std::make_shared<RecallEstimate>();
    if (!ReadRecallEstimate(path, e.get()).ok()) return nullptr;
    return e;
}

}  // namespace

std::shared_ptr<const Searcher> IndexService::Current(std::shared_ptr<const RecallEstimate>* estimate) const {
    std::lock_guard<std::mutex> lk(current_mu_);
    *estimate = current_estimate_;
    return current_;
}

std::shared_ptr<const Searcher> IndexService::Current() const {
    std::lock_guard<std::mutex> lk(current_mu_);
    return current_;
}

Status IndexService::Reopen(bool count_write) {
    // After writes, the searcher in service is refreshed: it shares its documents (and their GPU
    // memory) with the next, which reads only what the writes added; a compaction's new stores
    // are opened whole.
    std::unique_ptr<Searcher> searcher;
    const std::shared_ptr<const Searcher> now = Current();
    TMS_RETURN_IF_ERROR(now ? now->Refresh(&searcher) : Searcher::Open(opts_, path_, &searcher));
    std::shared_ptr<const Searcher> next(std::move(searcher));
    std::shared_ptr<const RecallEstimate> estimate = ReadEstimate(path_);
    {
        std::lock_guard<std::mutex> lk(current_mu_);
        current_.swap(next);
        current_estimate_.swap(estimate);
    }
    if (count_write) ++generation_;
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
    Write w;
    w.tokens = &tokens;
    w.doclens = &doclens;
    w.ids = &ids;
    w.replace = replace;
    w.metadata = metadata;
    return Commit(&w);
}

Status IndexService::Delete(const std::vector<std::string>& ids, const std::string& required_filter, int64_t* deleted) {
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
    Write w;
    w.is_delete = true;
    w.ids = &ids;
    Status st = Commit(&w);
    *deleted = w.deleted;
    return st;
}

Status IndexService::Compact() {
    Write w;
    w.is_compact = true;
    return Commit(&w);
}

Status IndexService::Recalibrate(int64_t min_new, bool* measured) {
    *measured = false;
    std::lock_guard<std::mutex> one(recalibrate_mu_);
    const std::shared_ptr<QuerySample>& sample = opts_.record_into;
    if (stop_measuring_ || !RecalibrationDue(min_new)) return Status::OK();
    const ServedQueries sq = sample->Get();
    estimated_seen_ = sq.seen;
    if (sq.n_queries == 0) return Status::OK();
    const auto t0 = std::chrono::steady_clock::now();
    const std::shared_ptr<const Searcher> s = Current();
    const QueryBatch q{sq.tokens.data(), DType::kF16, sq.n_queries, sq.q_tokens, sq.dim, nullptr};
    EstimateOptions eo;
    eo.sample = &q;
    eo.searcher = s.get();
    eo.store = false;
    eo.stop = &stop_measuring_;
    RecallEstimate e;
    sample->set_recording(false);  // the measurement's own searches are not served queries
    const Status st = EstimateRecall(path_, eo, &e);
    sample->set_recording(true);
    TMS_RETURN_IF_ERROR(st);
    Write w;
    w.is_estimate = true;
    w.estimate = &e;
    TMS_RETURN_IF_ERROR(Commit(&w));
    *measured = true;
    const SearchOptions plan = Current()->Plan(SearchOptions());
    LogInfo(
        "tms serve: recall estimate measured on %d served queries in %.2f s: default search now nprobe %d, "
        "ncandidates %d, rerank %d%s\n",
        sq.n_queries, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), plan.nprobe,
        plan.ncandidates, plan.rerank, plan.exhaustive ? " (exhaustive)" : "");
    return Status::OK();
}

int64_t IndexService::queries_seen() const { return opts_.record_into ? opts_.record_into->seen() : 0; }

bool IndexService::RecalibrationDue(int64_t min_new) const {
    return opts_.record_into && queries_seen() - estimated_seen_.load() >= std::max<int64_t>(1, min_new);
}

Status IndexService::StoreEstimate(const RecallEstimate& e) {
    TMS_RETURN_IF_ERROR(StoreRecallEstimate(path_, e));
    return Reopen(/*count_write=*/false);
}

Status IndexService::Commit(Write* w) {
    // Group commit: the first writer to find no group being committed commits every write
    // queued by then; the others wait for it (and the next group forms meanwhile).
    std::unique_lock<std::mutex> lk(queue_mu_);
    pending_.push_back(w);
    while (!w->done) {
        if (committing_) {
            queue_cv_.wait(lk);
            continue;
        }
        committing_ = true;
        std::vector<Write*> group;
        group.swap(pending_);
        lk.unlock();
        std::vector<Write*> writes, compactions, estimates;
        for (Write* g : group) (g->is_compact ? compactions : g->is_estimate ? estimates : writes).push_back(g);
        if (!writes.empty()) {
            const Applied a = Apply(writes);
            if (a.committed || writes.size() == 1) {
                for (Write* g : writes) g->status = a.status;
            } else {
                // One of them failed and nothing was committed: each alone, so that only it fails.
                for (Write* g : writes) g->status = Apply({g}).status;
            }
        }
        for (Write* g : compactions) g->status = CompactNow();
        for (Write* g : estimates) g->status = StoreEstimate(*g->estimate);
        lk.lock();
        for (Write* g : group) g->done = true;
        queue_cv_.notify_all();
        // Past the share of deleted documents, compact now: the writes above are answered, the
        // next group waits (searches go on with the current searcher).
        const std::shared_ptr<const Searcher> now = Current();
        const IndexInfo& info = now->info();
        const bool due = compact_deleted_ > 0 && compactions.empty() && info.n_deleted >= 1000 &&
                         double(info.n_deleted) >= compact_deleted_ * double(info.n_docs);
        if (due) {
            lk.unlock();
            const Status st = CompactNow();
            if (!st.ok()) Logf(LogLevel::kError, "tms serve: compaction failed: %s\n", st.message().c_str());
            lk.lock();
        }
        committing_ = false;
        queue_cv_.notify_all();
    }
    return w->status;
}

Status IndexService::CompactNow() {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t deleted = Current()->info().n_deleted;
    TMS_RETURN_IF_ERROR(CompactIndex(path_, /*progress=*/false));
    TMS_RETURN_IF_ERROR(Reopen());
    LogInfo("tms serve: compacted %s (%lld deleted documents dropped) in %.2f s\n", path_.c_str(), (long long)deleted,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return Status::OK();
}

IndexService::Applied IndexService::Apply(const std::vector<Write*>& group) {
    Applied a;
    std::unique_ptr<IndexUpdater> up;
    a.status = IndexUpdater::Open(path_, /*progress=*/false, &up);
    for (size_t i = 0; a.status.ok() && i < group.size(); ++i) {
        Write& w = *group[i];
        if (w.is_delete) {
            int64_t already = 0;
            a.status = up->Delete(*w.ids, &already);
            w.deleted = int64_t(w.ids->size()) - already;
        } else {
            a.status = up->Add(*w.tokens, *w.doclens, *w.ids, w.replace, w.metadata);
        }
    }
    if (!a.status.ok()) return a;  // the updater goes uncommitted: nothing of the group is applied
    a.status = up->Commit();
    if (!a.status.ok()) return a;
    up.reset();
    a.committed = true;
    // Durable already: a failure here fails the writes' answers, not the writes, and says so (a
    // retry would find the documents there).
    const Status opened = Reopen();
    if (!opened.ok()) {
        a.status = Status(opened.code(), "committed (durable), but not yet searchable: " + opened.message());
    }
    return a;
}

}  // namespace tms::server

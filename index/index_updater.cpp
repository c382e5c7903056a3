// Copyright TileMaxSim authors. The public IndexUpdater over the store's updater.
#include "tilemaxsim/index_updater.h"

#include "index/ingest/npy.h"
#include "index/ingest/input_checks.h"
#include "index/ingest/pool.h"
#include "index/store/compaction.h"
#include "index/store/updater.h"
#include "kernels/threads.h"
#include "index/ingest/files.h"
#include "index/ingest/npy.h"

namespace tms {

struct IndexUpdater::Impl {
    index::UpdaterPtr u;
    bool progress = true;
};

IndexUpdater::IndexUpdater() : impl_(std::make_unique<Impl>()) {}
IndexUpdater::~IndexUpdater() = default;

Status IndexUpdater::Open(const std::string& path, bool progress, std::unique_ptr<IndexUpdater>* out) {
    kernels::SetThreads();
    std::unique_ptr<IndexUpdater> up(new IndexUpdater());
    TMS_RETURN_IF_ERROR(index::OpenUpdater(path, &up->impl_->u));
    up->impl_->progress = progress;
    *out = std::move(up);
    return Status::OK();
}

Status IndexUpdater::Add(const EmbeddingView& tokens, const std::vector<int64_t>& doclens,
                         const std::vector<std::string>& doc_ids, bool replace, const DocMetadata* metadata) {
    // An index built with token pooling takes its additions pooled alike.
    IndexBuildOptions built;
    (void)ParseBuildOptionsJson(info().build_config_json, &built);
    if (built.pool_factor <= 1) {
        return index::UpdaterAdd(impl_->u.get(), tokens, doclens, doc_ids, replace, impl_->progress, metadata);
    }
    TMS_RETURN_IF_ERROR(index::CheckDocLens(doclens, tokens.rows, "doclens", "docs"));
    TMS_RETURN_IF_ERROR(index::CheckValues(tokens, "docs"));
    std::vector<uint16_t> pooled;
    std::vector<int64_t> lens;
    TMS_RETURN_IF_ERROR(index::PoolDocuments(tokens, doclens, built.pool_factor, &pooled, &lens));
    const EmbeddingView v{pooled.data(), DType::kF16, int64_t(pooled.size()) / tokens.dim, tokens.dim};
    return index::UpdaterAdd(impl_->u.get(), v, lens, doc_ids, replace, impl_->progress, metadata);
}

Status IndexUpdater::AddFromFiles(const std::string& docs_npy, const std::string& doclens_npy,
                                  const std::string& doc_ids_txt, bool replace, const DocMetadata* metadata) {
    std::unique_ptr<index::MappedNpy> m;
    TMS_RETURN_IF_ERROR(index::MappedNpy::Open(docs_npy, &m));
    EmbeddingView v;
    TMS_RETURN_IF_ERROR(index::EmbeddingsFromRaw(m->header(), m->data(), 2, docs_npy, &v));
    HostArray lens;
    TMS_RETURN_IF_ERROR(LoadNpy(doclens_npy, &lens));
    std::vector<int64_t> l;
    TMS_RETURN_IF_ERROR(IntegersFromArray(lens, doclens_npy, &l));
    std::vector<std::string> ids;
    TMS_RETURN_IF_ERROR(ReadLines(doc_ids_txt, &ids));
    Status st = Add(v, l, ids, replace, metadata);
    if (!st.ok() && st.message().rfind("doc-ids:", 0) == 0)
        return Status(st.code(), doc_ids_txt + st.message().substr(7));
    if (!st.ok() && st.message().rfind("doclens:", 0) == 0)
        return Status(st.code(), doclens_npy + st.message().substr(7));
    if (!st.ok() && st.message().rfind("docs:", 0) == 0) return Status(st.code(), docs_npy + st.message().substr(4));
    return st;
}

Status IndexUpdater::Delete(const std::vector<std::string>& doc_ids, int64_t* already_deleted) {
    return index::UpdaterDelete(impl_->u.get(), doc_ids, "doc-ids", already_deleted);
}

Status IndexUpdater::Commit() { return index::UpdaterCommit(impl_->u.get()); }

const IndexInfo& IndexUpdater::info() const { return index::UpdaterInfo(impl_->u.get()); }

Status CompactIndex(const std::string& path, bool progress) { return index::CompactIndex(path, progress); }

}  // namespace tms

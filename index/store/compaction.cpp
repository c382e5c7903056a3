// Copyright TileMaxSim authors. Compaction: an index rewritten without its deleted documents.

#include <filesystem>

#include "index/store/compaction.h"
#include "index/store/db.h"
#include "index/store/file_io.h"
#include "index/store/index_dir.h"
#include "index/store/index_reader.h"
#include "index/store/shards.h"
#include "index/store/index_writer.h"
#include "index/store/updater.h"
#include "index/metadata/metadata.h"

namespace tms::index {

namespace fs = std::filesystem;

Status CompactIndex(const std::string& path, bool progress) {
    UpdaterPtr lock;  // its writer lock is held until the new copy has replaced the old one
    TMS_RETURN_IF_ERROR(OpenUpdater(path, &lock));
    CrashPoint("compact:opened");
    const int chunk_docs = lock->chunk_docs;
    IndexBuildOptions opts;
    TMS_RETURN_IF_ERROR(
        ParseBuildOptionsJson(lock->info.build_config_json, &opts).WithContext(path + ": stored config"));
    IndexData d;
    {
        std::vector<IndexData> shards;
        TMS_RETURN_IF_ERROR(read_shards(lock->layout, lock->dbs, path, VectorLoad::kMemory, progress, {}, &shards));
        ConcatShards(&shards, &d);
    }
    const int64_t n = d.info.n_docs;
    const int nb = d.model.n_code_bytes, dim = d.model.dim;
    IndexData c;
    c.model = d.model;
    c.doc_offsets.assign(1, 0);
    for (int64_t doc = 0; doc < n; ++doc) {
        if (d.deleted[doc]) continue;
        const int64_t t0 = d.doc_offsets[doc], t1 = d.doc_offsets[doc + 1];
        c.doc_offsets.push_back(c.doc_offsets.back() + (t1 - t0));
        c.token_centroids.insert(c.token_centroids.end(), d.token_centroids.begin() + t0,
                                 d.token_centroids.begin() + t1);
        c.codes.insert(c.codes.end(), d.codes.begin() + t0 * nb, d.codes.begin() + t1 * nb);
        if (!d.vectors.empty())
            c.vectors.insert(c.vectors.end(), d.vectors.begin() + t0 * dim, d.vectors.begin() + t1 * dim);
        c.doc_ids.push_back(d.doc_ids[doc]);
    }
    if (c.doc_ids.empty()) return Status::InvalidArgument(path + ": every document is deleted; nothing would remain");
    c.info = d.info;
    c.info.n_docs = static_cast<int64_t>(c.doc_ids.size());
    c.info.n_tokens = c.doc_offsets.back();
    c.info.n_deleted = 0;
    opts.overwrite = true;
    opts.chunk_docs = chunk_docs;
    opts.progress = progress;
    opts.shards = int(lock->layout.stores.size());  // as many shards as before
    // The metadata follows its documents to their new ids (rows of deleted documents dropped),
    // into the new copy's directory: the swap replaces stores and metadata at once.
    std::function<Status(const std::string&)> put_metadata;
    const std::string meta_path = (lock->dir / kMetadataFile).string();
    if (lock->meta_exists) {
        put_metadata = [&](const std::string& build_dir) {
            std::vector<int64_t> new_of(size_t(n), -1);
            for (int64_t doc = 0, k = 0; doc < n; ++doc) {
                if (!d.deleted[doc]) new_of[size_t(doc)] = k++;
            }
            TextIndexSpec text;  // the text index goes with the rows
            bool has_text = false;
            TMS_RETURN_IF_ERROR(ReadTextIndexSpec(meta_path, &text, &has_text));
            std::unique_ptr<MetadataWriter> w;
            TMS_RETURN_IF_ERROR(MetadataWriter::Create((fs::path(build_dir) / kMetadataFile).string(),
                                                       lock->meta_columns, &w, has_text ? &text : nullptr));
            std::vector<MetaColumn> columns;
            TMS_RETURN_IF_ERROR(ForEachMetadataRow(
                meta_path, n, &columns, [&](int64_t doc, const std::string& id, const MetaCells& cells) {
                    const int64_t to = new_of[size_t(doc)];
                    if (to < 0) return Status::OK();
                    if (c.doc_ids[size_t(to)] != id) {
                        return Status::Corruption(meta_path + ": the row of document " + std::to_string(doc) +
                                                  " names '" + id + "', the index '" + c.doc_ids[size_t(to)] + "'");
                    }
                    return w->Insert(to, id, cells);
                }));
            if (columns.size() != lock->meta_columns.size()) return Status::Internal(meta_path + ": columns changed");
            TMS_RETURN_IF_ERROR(w->Commit());
            CrashPoint("meta:compacted");
            return Status::OK();
        };
    }
    // The recall estimate (measured on the documents before the deletions) stays with the index.
    const fs::path estimate = lock->dir / kEstimateFile;
    const auto before_complete = [&](const std::string& build_dir) {
        if (put_metadata) TMS_RETURN_IF_ERROR(put_metadata(build_dir));
        std::error_code ec;
        if (fs::exists(estimate, ec)) {
            fs::copy_file(estimate, fs::path(build_dir) / kEstimateFile, fs::copy_options::overwrite_existing, ec);
            if (ec) return io_error(estimate.string() + ": cannot copy", ec.value());
        }
        return Status::OK();
    };
    close_updating(&lock->db(), lock->dir);
    return WriteIndex(lock->dir.string(), c, opts, std::move(lock->writer), before_complete);
}

}  // namespace tms::index

// Copyright TileMaxSim authors. In-place updates of an index: add, delete, commit.

#include <rocksdb/write_batch.h>
#include <fcntl.h>
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/progress.h"
#include "index/build_metadata.h"
#include "index/ingest/input_checks.h"
#include "index/ingest/metadata_jsonl.h"
#include "index/encode/encoder.h"
#include "index/store/crc32c.h"
#include "index/store/format.h"
#include "index/store/index_reader.h"
#include "index/store/shards.h"
#include "index/store/updater.h"
#include "index/store/vectors_file.h"

namespace tms::index {

namespace fs = std::filesystem;

// Closing a read-write database replaces files (a new MANIFEST, logs): not while a reader loads.
void close_updating(Db* db, const fs::path& dir) {
    if (!db->db) return;
    std::unique_ptr<FileLock> readers;
    (void)AcquireMarkerLock(dir, true, &readers);
    db->Close();
}

void UpdaterDeleter::operator()(IndexUpdaterImpl* u) const {
    if (!u->dbs.empty()) close_updating(&u->db(), u->dir);
    delete u;
}

// Space an update needs on the index's file system before it starts: RocksDB aborts, rather
// than failing, on some write paths that run out of space.
Status check_free_space(const IndexUpdaterImpl& u, int64_t need_bytes) {
    constexpr int64_t kMargin = int64_t(16) << 20;
    const int64_t free = FreeBytes(u.dir);
    if (free >= 0 && free < need_bytes + kMargin) {
        return Status::IOError(u.path + ": disk full: " + std::to_string(free >> 20) +
                               " MB free on its file system, the " + "update needs about " +
                               std::to_string((need_bytes + kMargin + (1 << 20) - 1) >> 20) + " MB");
    }
    return Status::OK();
}

// emit(external id, global id) for every document of one store, in id order.
template <typename Emit>
Status for_each_store_id(Db& db, const std::string& path, const IndexInfo& info, int64_t first_doc, Emit emit) {
    rocksdb::ReadOptions ro;
    ro.verify_checksums = false;  // sealed
    rocksdb::PinnableSlice v;
    int64_t doc = 0;
    for (int64_t c = 0; c < info.n_chunks; ++c) {
        const std::string what = path + ": ids of chunk " + std::to_string(c);
        v.Reset();
        TMS_RETURN_IF_ERROR(from_rocks(db.db->Get(ro, db.cf[kIds], ids_key(c), &v), what));
        TMS_RETURN_IF_ERROR(check_seal(what, v));
        // Documents per chunk: chunk_docs, except for the last chunk of a build or an add.
        TMS_RETURN_IF_ERROR(for_each_id(what, v, [&](std::string_view id) {
            if (doc >= info.n_docs) return Status::Corruption(what + ": more documents than the metadata says");
            emit(id, first_doc + doc++);
            return Status::OK();
        }));
    }
    if (doc != info.n_docs) return Status::Corruption(path + ": document ids missing");
    return Status::OK();
}

Status OpenUpdater(const std::string& path, UpdaterPtr* out) {
    UpdaterPtr u(new IndexUpdaterImpl());
    u->path = path;
    TMS_RETURN_IF_ERROR(ResolveTargetPath(path, &u->dir));
    RecoverLeftovers(u->dir);
    TMS_RETURN_IF_ERROR(check_is_index_dir(path));
    TMS_RETURN_IF_ERROR(AcquireWriterLock(u->dir, &u->writer));
    TMS_RETURN_IF_ERROR(check_free_space(*u, 0));
    TMS_RETURN_IF_ERROR(read_layout(u->dir, path, &u->layout));
    const size_t n = u->layout.stores.size();
    u->dbs = std::vector<Db>(n);
    // The other stores are only read: the writer lock keeps every other writer away.
    for (size_t s = 0; s + 1 < n; ++s) TMS_RETURN_IF_ERROR(open_db(u->layout.stores[s].string(), true, &u->dbs[s]));
    {
        std::unique_ptr<FileLock> readers;
        TMS_RETURN_IF_ERROR(AcquireMarkerLock(u->dir, true, &readers));
        TMS_RETURN_IF_ERROR(open_db(u->layout.stores.back().string(), false, &u->db(), /*updating=*/true));
    }
    CrashPoint("update:opened");
    std::vector<IndexInfo> infos;
    std::vector<nlohmann::json> stats;
    TMS_RETURN_IF_ERROR(read_shard_metas(u->layout, u->dbs, path, &infos, &stats));
    u->store_infos = infos;
    u->info = infos.back();
    u->stats = stats.back();
    u->first_doc = u->stats.value("first_doc", int64_t{0});
    u->view = combine_infos(u->layout, infos, stats);
    u->others_deleted = u->view.n_deleted - u->info.n_deleted;
    u->chunk_docs = u->stats.value("chunk_docs", 2048);
    const std::string head = u->layout.sharded ? u->layout.stores.back().string() : path;
    TMS_RETURN_IF_ERROR(read_model(u->db(), head, u->info, u->stats, &u->model));
    // Live external ids: every store's ids, less the tombstoned documents.
    std::vector<char> deleted(size_t(u->view.n_docs), 0);
    for (size_t s = 0; s < n; ++s) {
        std::vector<int64_t> t;
        TMS_RETURN_IF_ERROR(read_tombstones(u->dbs[s], u->layout.stores[s].string(), u->view.n_docs, &t));
        for (int64_t g : t) deleted[g] = 1;
    }
    u->ids.reserve(size_t(u->view.n_docs));
    for (size_t s = 0; s < n; ++s) {
        const std::string sp = u->layout.sharded ? u->layout.stores[s].string() : path;
        TMS_RETURN_IF_ERROR(for_each_store_id(u->dbs[s], sp, infos[s], u->view.shards[s].first_doc,
                                              [&](std::string_view id, int64_t g) {
                                                  if (!deleted[g])
                                                      u->ids.emplace(std::string(id), g);
                                                  else
                                                      u->deleted_ids.emplace(id);
                                              }));
    }
    for (const auto& [id, d] : u->ids) u->deleted_ids.erase(id);  // replaced: live again
    u->ivf.resize(u->model.n_centroids);
    u->ivf_loaded.assign(u->model.n_centroids, 0);
    u->ivf_dirty.assign(u->model.n_centroids, 0);
    u->committed_docs = u->info.n_docs;
    const std::string meta_path = (u->dir / kMetadataFile).string();
    std::error_code ec;
    u->meta_exists = fs::exists(meta_path, ec);
    if (u->meta_exists) {
        // Rows past the committed documents are a commit's that stopped before the stores'
        // commit (invisible to readers): their documents' ids are given out again.
        std::unique_ptr<MetadataWriter> w;
        TMS_RETURN_IF_ERROR(MetadataWriter::Open(meta_path, &w));
        TMS_RETURN_IF_ERROR(w->DeleteFrom(u->view.n_docs));
        TMS_RETURN_IF_ERROR(w->Commit());
        int64_t rows = 0;
        TMS_RETURN_IF_ERROR(ReadMetadataInfo(meta_path, u->view.n_docs, &u->meta_columns, &rows));
        u->meta_rows = rows;
        u->update_view();
    }
    if (u->info.has_vectors && u->info.format_version != kInlineVectorsFormat) {
        // Bytes past the committed tokens' are an uncommitted update's: added chunks overwrite them.
        TMS_RETURN_IF_ERROR(open_vectors_file((fs::path(head) / kVectorsFile).string(), O_WRONLY, &u->vec_file));
    }
    *out = std::move(u);
    return Status::OK();
}

Status UpdaterAdd(IndexUpdaterImpl* u, const EmbeddingView& tokens, const std::vector<int64_t>& doclens,
                  std::vector<std::string> doc_ids, bool replace, bool progress, const DocMetadata* metadata) {
    if (tokens.dim != u->info.dim) {
        return Status::InvalidArgument("docs: dimension " + std::to_string(tokens.dim) + " differs from the index's " +
                                       std::to_string(u->info.dim));
    }
    // An empty batch (a stream's last, say) adds nothing and is no error.
    if (doclens.empty() && tokens.rows == 0 && doc_ids.empty() && (!metadata || metadata->objects.empty())) {
        return Status::OK();
    }
    if (doc_ids.empty()) return Status::InvalidArgument("doc-ids: adding documents needs explicit ids (--doc-ids)");
    TMS_RETURN_IF_ERROR(ValidateInput(tokens, doclens, &doc_ids));
    if (u->view.n_docs + int64_t(doclens.size()) > INT32_MAX)
        return Status::NotSupported("index would exceed 2^31 documents");
    for (size_t i = 0; i < doc_ids.size(); ++i) {
        auto it = u->ids.find(doc_ids[i]);
        if (it != u->ids.end() && !replace) {
            return Status::AlreadyExists("doc-ids: line " + std::to_string(i + 1) + ": id '" + doc_ids[i] +
                                         "' is already in the index (use --replace to replace it)");
        }
    }
    MetaRows rows;
    IndexBuildOptions built;  // the index's text and spans fields; the GPU it was built on encodes its additions
    (void)ParseBuildOptionsJson(u->info.build_config_json, &built);
    if (metadata) {
        TMS_RETURN_IF_ERROR(ResolveMetadata(*metadata, doc_ids, u->meta_columns, &rows));
        TMS_RETURN_IF_ERROR(CheckSpans(built.spans_field, built.text_field, rows.columns, rows.cells, doclens, doc_ids,
                                       metadata->source));
    }
    // Checked: from here on the add changes the updater's state.
    u->trim_staged();
    if (metadata) {
        u->meta_columns = std::move(rows.columns);
        u->meta_given = true;
    }
    for (size_t i = 0; i < doc_ids.size(); ++i) {
        u->meta_staged.push_back({u->first_doc + u->info.n_docs + int64_t(i), doc_ids[i],
                                  metadata ? std::move(rows.cells[i]) : MetaCells()});
    }
    for (const auto& id : doc_ids) {
        auto it = u->ids.find(id);
        if (it != u->ids.end()) {
            u->tombstones.push_back(it->second);
            u->ids.erase(it);
        }
    }
    const int nb = u->model.n_code_bytes, dim = u->info.dim;
    // Chunks are written once to memtables and once flushed (blob files), and the commit
    // rewrites the IVF lists they touch.
    TMS_RETURN_IF_ERROR(
        check_free_space(*u, 2 * tokens.rows * (4 + nb + (u->info.has_vectors ? 2 * dim : 0)) + 8 * tokens.rows));
    std::unique_ptr<Encoder> enc;
    TMS_RETURN_IF_ERROR(Encoder::Create(u->model, Device::kAuto, built.gpu, &enc));
    std::vector<uint32_t> cids;
    std::vector<uint8_t> codes;
    std::vector<uint16_t> vecs;
    Progress prog("adding", tokens.rows, progress, " tok");
    int64_t row = 0;
    for (size_t d0 = 0; d0 < doclens.size(); d0 += u->chunk_docs) {
        const size_t d1 = std::min(doclens.size(), d0 + size_t(u->chunk_docs));
        int64_t n = 0;
        for (size_t d = d0; d < d1; ++d) n += doclens[d];
        cids.resize(n);
        codes.resize(size_t(n) * nb);
        TMS_RETURN_IF_ERROR(enc->Encode(tokens, row, n, cids.data(), codes.data()));
        const int64_t first = u->first_doc + u->info.n_docs, chunk = u->info.n_chunks;
        // Chunks past meta's n_chunks are invisible to readers until Commit.
        rocksdb::WriteBatch b;
        b.Put(u->db().cf[kDocs], be64(chunk),
              encode_chunk(first, doclens.data() + d0, int64_t(d1 - d0), cids.data(), codes.data(), n, nb));
        if (u->info.has_vectors) {
            vecs.resize(size_t(n) * dim);
            ToHalf(tokens, row, n, vecs.data());
            if (u->vec_file.fd >= 0) {
                VectorRef r;
                r.offset = uint64_t(u->info.n_tokens) * dim * sizeof(uint16_t);
                r.bytes = vecs.size() * sizeof(uint16_t);
                r.crc = Crc32(vecs.data(), r.bytes);
                TMS_RETURN_IF_ERROR(pwrite_all(u->vec_file.fd, vecs.data(), r.bytes, r.offset,
                                               (fs::path(u->layout.stores.back()) / kVectorsFile).string()));
                b.Put(u->db().cf[kVectors], be64(chunk), encode_vector_ref(r));
            } else {  // format 3
                std::string v;
                put(&v, vecs.data(), vecs.size());
                seal(&v);
                b.Put(u->db().cf[kVectors], be64(chunk), v);
            }
        }
        b.Put(u->db().cf[kIds], ids_key(chunk), encode_ids(doc_ids.data() + d0, d1 - d0));
        int64_t t = 0;
        for (size_t d = d0; d < d1; ++d) {
            const int64_t doc = first + int64_t(d - d0);
            u->ids[doc_ids[d]] = doc;
            u->deleted_ids.erase(doc_ids[d]);
            for (int64_t j = t; j < t + doclens[d]; ++j) {
                const uint32_t k = cids[j];
                if (!u->ivf_loaded[k]) {  // the committed list (ids below the committed n_docs)
                    TMS_RETURN_IF_ERROR(read_ivf_list(u->db(), u->path, int(k), u->first_doc,
                                                      u->first_doc + u->committed_docs, &u->ivf[k]));
                    u->ivf_loaded[k] = 1;
                }
                auto& l = u->ivf[k];
                if (l.empty() || l.back() != doc) {
                    l.push_back(static_cast<int32_t>(doc));
                    u->ivf_dirty[k] = 1;
                }
            }
            t += doclens[d];
        }
        rocksdb::WriteOptions wo;
        wo.disableWAL = true;  // durable with the commit's flush (open_db)
        TMS_RETURN_IF_ERROR(from_rocks(u->db().db->Write(wo, &b), u->path));
        CrashPoint("update:chunk");
        u->info.n_docs += int64_t(d1 - d0);
        u->info.n_tokens += n;
        u->info.n_chunks += 1;
        u->update_view();
        row += n;
        prog.Add(n);
    }
    return Status::OK();
}

Status UpdaterDelete(IndexUpdaterImpl* u, const std::vector<std::string>& doc_ids, const std::string& what,
                     int64_t* already_deleted) {
    int64_t already = 0;
    for (size_t i = 0; i < doc_ids.size(); ++i) {
        if (u->ids.count(doc_ids[i])) continue;
        if (u->deleted_ids.count(doc_ids[i])) {
            ++already;
            continue;
        }
        return Status::NotFound(what + ": line " + std::to_string(i + 1) + ": no document '" + doc_ids[i] +
                                "' in the index");
    }
    for (const auto& id : doc_ids) {
        auto it = u->ids.find(id);
        if (it == u->ids.end()) continue;  // deleted before, or listed twice
        u->tombstones.push_back(it->second);
        u->deleted_ids.insert(id);
        u->ids.erase(it);
    }
    if (already_deleted) *already_deleted = already;
    return Status::OK();
}

// The rows of the added documents in one durable SQLite transaction (new columns added in it),
// or, in an index without a metadata file, a new file holding a row for every document.
// Readers see only rows below the stores' committed documents, so these stay invisible until
// the stores' commit that follows.
Status commit_metadata(IndexUpdaterImpl* u) {
    u->trim_staged();
    const int64_t committed = u->committed_global();
    // One row for each document added since the last commit, in order.
    bool staged_ok = int64_t(u->meta_staged.size()) == u->view.n_docs - committed;
    for (size_t i = 0; staged_ok && i < u->meta_staged.size(); ++i) {
        staged_ok = u->meta_staged[i].doc == committed + int64_t(i);
    }
    if (!staged_ok) return Status::Internal(u->path + ": the added documents' metadata rows do not match them");
    const std::string meta_path = (u->dir / kMetadataFile).string();
    std::unique_ptr<MetadataWriter> w;
    if (u->meta_exists) {
        TMS_RETURN_IF_ERROR(MetadataWriter::Open(meta_path, &w));
        const size_t have = w->columns().size();
        if (have > u->meta_columns.size()) return Status::Internal(meta_path + ": columns changed under the writer");
        TMS_RETURN_IF_ERROR(w->AddColumns({u->meta_columns.begin() + have, u->meta_columns.end()}));
        TMS_RETURN_IF_ERROR(w->DeleteFrom(committed));
        for (const auto& r : u->meta_staged) TMS_RETURN_IF_ERROR(w->Insert(r.doc, r.id, r.cells));
    } else {
        TMS_RETURN_IF_ERROR(MetadataWriter::Create(meta_path, u->meta_columns, &w));
        static const MetaCells kNone;
        for (size_t s = 0; s < u->dbs.size(); ++s) {
            const bool head = s + 1 == u->dbs.size();
            const std::string sp = u->layout.sharded ? u->layout.stores[s].string() : u->path;
            Status st;
            TMS_RETURN_IF_ERROR(for_each_store_id(u->dbs[s], sp, head ? u->info : u->store_infos[s],
                                                  u->view.shards[s].first_doc, [&](std::string_view id, int64_t g) {
                                                      if (!st.ok()) return;
                                                      const auto& cells =
                                                          g >= committed ? u->meta_staged[size_t(g - committed)].cells
                                                                         : kNone;
                                                      st = w->Insert(g, std::string(id), cells);
                                                  }));
            TMS_RETURN_IF_ERROR(st);
        }
    }
    TMS_RETURN_IF_ERROR(w->Commit());
    if (!u->meta_exists) {
        u->meta_exists = true;
        u->meta_rows = committed;
    }
    return Status::OK();
}

// One atomic batch: IVF lists, tombstones, metadata (the new chunks and their ids were written
// before, past the committed chunk count, so invisible until now), made durable by one atomic
// flush of every column family before Commit returns. Document metadata is committed first.
Status UpdaterCommit(IndexUpdaterImpl* u) {
    rocksdb::WriteBatch b;
    for (int k = 0; k < u->model.n_centroids; ++k) {
        if (u->ivf_dirty[k]) b.Put(u->db().cf[kIvf], be32(static_cast<uint32_t>(k)), encode_ivf(u->ivf[k]));
    }
    std::sort(u->tombstones.begin(), u->tombstones.end());
    u->tombstones.erase(std::unique(u->tombstones.begin(), u->tombstones.end()), u->tombstones.end());
    for (int64_t doc : u->tombstones) b.Put(u->db().cf[kDeleted], be64(doc), "");
    u->info.n_deleted += static_cast<int64_t>(u->tombstones.size());
    u->update_view();
    b.Put(u->db().cf[kMeta], "stats", info_json(u->info, u->model, u->chunk_docs, u->first_doc));
    TMS_RETURN_IF_ERROR(check_free_space(*u, int64_t(b.GetDataSize())));
    // The added vectors are durable before the references to them commit.
    if (u->vec_file.fd >= 0) TMS_RETURN_IF_ERROR(fsync_fd(u->vec_file.fd, u->path + ": " + kVectorsFile));
    CrashPoint("update:commit");
    {
        std::unique_ptr<FileLock> readers;  // the flush replaces logs that a reader may be listing
        TMS_RETURN_IF_ERROR(AcquireMarkerLock(u->dir, true, &readers));
        if (u->meta_given || (u->meta_exists && !u->meta_staged.empty())) {
            TMS_RETURN_IF_ERROR(commit_metadata(u));
            CrashPoint("meta:committed");
        }
        rocksdb::WriteOptions wo;
        wo.disableWAL = true;
        TMS_RETURN_IF_ERROR(from_rocks(u->db().db->Write(wo, &b), u->path));
        CrashPoint("update:written");
        rocksdb::FlushOptions fo;
        fo.wait = true;
        TMS_RETURN_IF_ERROR(from_rocks(u->db().db->Flush(fo, u->db().cf), u->path));
    }
    CrashPoint("update:committed");
    u->tombstones.clear();
    std::fill(u->ivf_dirty.begin(), u->ivf_dirty.end(), 0);
    if (u->meta_exists) u->meta_rows += int64_t(u->meta_staged.size());
    u->meta_staged.clear();
    u->committed_docs = u->info.n_docs;
    u->update_view();
    return Status::OK();
}

const IndexInfo& UpdaterInfo(const IndexUpdaterImpl* u) { return u->view; }

}  // namespace tms::index

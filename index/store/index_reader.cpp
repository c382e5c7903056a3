// Copyright TileMaxSim authors. Reading an index: its layout (stores, manifest), every store's metadata, and its
// shards in parallel with their tombstones applied.

#include <filesystem>
#include <thread>
#include <omp.h>
#include <nlohmann/json.hpp>

#include "base/progress.h"
#include "index/metadata/metadata.h"
#include "index/store/db.h"
#include "index/store/index_dir.h"
#include "index/store/index_reader.h"
#include "index/store/shards.h"
#include "index/store/store_reader.h"
#include "tilemaxsim/version.h"

namespace tms::index {

namespace fs = std::filesystem;

// The stores of the index at `dir`: the directory itself (unsharded), or the shards its
// manifest names, each checked to exist; with `want` (shard numbers), only those and the last;
// count_only: none (n_shards only).
Status read_layout(const fs::path& dir, const std::string& path, Layout* out, const std::vector<int>& want,
                   bool count_only) {
    *out = Layout();
    out->dir = dir;
    std::error_code ec;
    const fs::path mf = dir / kManifestFile;
    if (!fs::exists(fs::symlink_status(mf, ec))) {
        for (int w : want) {
            if (w != 0)
                return Status::InvalidArgument(path + ": has one shard; shard " + std::to_string(w) + " asked for");
        }
        out->stores.push_back(dir);
        out->numbers.push_back(0);
        out->n_shards = 1;
        return Status::OK();
    }
    std::string text;
    {
        std::FILE* f = std::fopen(mf.c_str(), "rb");
        if (!f) return Status::IOError(path + ": cannot read the shard manifest " + mf.string());
        char buf[4096];
        for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) {
            text.append(buf, n);
            if (text.size() > (size_t(1) << 20)) break;
        }
        std::fclose(f);
    }
    out->sharded = true;
    const std::string what = mf.string();
    try {
        const nlohmann::json j = nlohmann::json::parse(text);
        const int fv = j.at("format_version").get<int>();
        if (fv != kShardedFormatVersion) {
            return Status::NotSupported(what + ": sharded index format version " + std::to_string(fv) +
                                        " is not supported by this build (reads " +
                                        std::to_string(kShardedFormatVersion) + "); rebuild the index");
        }
        const auto& shards = j.at("shards");
        if (!shards.is_array() || shards.empty() || shards.size() > size_t(kMaxShards)) {
            return Status::Corruption(what + ": bad shard list");
        }
        out->n_shards = int(shards.size());
        if (count_only) return Status::OK();
        std::vector<char> open(shards.size(), want.empty() ? 1 : 0);
        for (int w : want) {
            if (w < 0 || w >= out->n_shards) {
                return Status::InvalidArgument(path + ": has " + std::to_string(out->n_shards) + " shards; shard " +
                                               std::to_string(w) + " asked for");
            }
            open[size_t(w)] = 1;
        }
        open.back() = 1;
        for (size_t s = 0; s < shards.size(); ++s) {
            // Only the names the writer gives: a manifest never points outside its directory.
            const std::string name = shards[s].get<std::string>();
            if (name != ShardDirName(int(s))) {
                return Status::Corruption(what + ": shard " + std::to_string(s) + " is named '" + name +
                                          "', expected " + ShardDirName(int(s)));
            }
            if (!open[s]) continue;
            const fs::path sd = dir / name;
            if (!fs::is_directory(sd, ec)) {
                return Status::Corruption(path + ": shard " + std::to_string(s) + " (" + sd.string() +
                                          ") is missing: the index is damaged");
            }
            out->stores.push_back(sd);
            out->numbers.push_back(int(s));
        }
        out->model_crc = j.at("model_crc").get<uint32_t>();
    } catch (const nlohmann::json::exception& e) {
        return Status::Corruption(what + ": bad shard manifest (" + e.what() + ")");
    }
    return Status::OK();
}

namespace {

// Opens the index at `path` read-only (every store of it) and runs `read` on the stores,
// holding the marker shared so that no writer replaces the files being loaded. An in-place
// writer's background flushes may still move files under a reader: a failure of RocksDB while a
// writer is active is retried, and if it persists it is reported as what it most likely is.
Status with_read_stores(const std::string& path, const std::function<Status(const Layout&, std::vector<Db>&)>& read,
                        const std::vector<int>& want = {}) {
    fs::path dir;
    TMS_RETURN_IF_ERROR(ResolveTargetPath(path, &dir));
    RecoverLeftovers(dir);  // an interrupted replacement may have left the index aside
    constexpr int kAttempts = 6;
    for (int attempt = 1;; ++attempt) {
        TMS_RETURN_IF_ERROR(check_is_index_dir(path));
        Status st;
        {
            std::unique_ptr<FileLock> shared;
            TMS_RETURN_IF_ERROR(AcquireMarkerLock(dir, false, &shared));
            CrashPoint("read:locked");
            Layout layout;
            st = read_layout(dir, path, &layout, want);
            std::vector<Db> dbs(layout.stores.size());
            for (size_t s = 0; st.ok() && s < dbs.size(); ++s) st = open_db(layout.stores[s].string(), true, &dbs[s]);
            if (st.ok()) st = read(layout, dbs);
        }
        if (st.ok() || st.code() == Status::Code::kInvalidArgument || st.code() == Status::Code::kNotSupported ||
            st.code() == Status::Code::kResourceExhausted || !WriterActive(dir)) {
            return st;
        }
        if (attempt == kAttempts) {
            return Status::IOError(path +
                                   ": another process is updating the index and its files changed while it "
                                   "was being opened; try again (" +
                                   st.message() + ")");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20 << attempt));
    }
}

// Bytes of the files under `dir` (not following links).
int64_t dir_bytes(const fs::path& dir) {
    std::error_code ec;
    int64_t n = 0;
    for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
        if (it->is_regular_file(ec)) n += int64_t(it->file_size(ec));
    }
    return n;
}

}  // namespace

// The metadata of every store, checked to form one index: the shards' first documents follow
// each other, and every shard has the same model shape (and, sharded, the manifest's model).
Status read_shard_metas(const Layout& layout, std::vector<Db>& dbs, const std::string& path,
                        std::vector<IndexInfo>* infos, std::vector<nlohmann::json>* stats) {
    infos->assign(dbs.size(), IndexInfo());
    stats->assign(dbs.size(), nlohmann::json());
    int64_t next = 0;
    for (size_t s = 0; s < dbs.size(); ++s) {
        const std::string sp = layout.sharded ? layout.stores[s].string() : path;
        TMS_RETURN_IF_ERROR(read_meta(dbs[s], sp, &(*infos)[s], &(*stats)[s]));
        const IndexInfo& a = (*infos)[0];
        const IndexInfo& b = (*infos)[s];
        const int64_t first = (*stats)[s].value("first_doc", int64_t{0});
        if (!layout.sharded && first != 0) {
            return Status::InvalidArgument(path +
                                           ": a shard of a sharded index, not an index (open its parent directory)");
        }
        // A partial open sees only some shards: their first documents cannot be checked against
        // the others'.
        if (!layout.partial() && first != next) {
            return Status::Corruption(sp + ": its documents start at " + std::to_string(first) + ", expected " +
                                      std::to_string(next) + " (the index is damaged)");
        }
        if (b.dim != a.dim || b.n_centroids != a.n_centroids || b.codec != a.codec || b.has_vectors != a.has_vectors ||
            (*stats)[s].value("n_code_bytes", 0) != (*stats)[0].value("n_code_bytes", 0)) {
            return Status::Corruption(sp + ": its model differs from shard 0's (the index is damaged)");
        }
        next += b.n_docs;
    }
    if (next > INT32_MAX) return Status::Corruption(path + ": more than 2^31 documents");
    return Status::OK();
}

IndexInfo combine_infos(const Layout& layout, const std::vector<IndexInfo>& infos,
                        const std::vector<nlohmann::json>& stats) {
    IndexInfo info = infos[0];
    info.n_docs = info.n_tokens = info.n_chunks = info.n_deleted = 0;
    for (size_t s = 0; s < infos.size(); ++s) {
        ShardInfo si;
        si.dir = layout.sharded ? layout.stores[s].filename().string() : ".";
        si.first_doc = stats[s].value("first_doc", int64_t{0});
        si.n_docs = infos[s].n_docs;
        si.n_tokens = infos[s].n_tokens;
        si.bytes = dir_bytes(layout.stores[s]);
        info.shards.push_back(si);
        info.n_docs += infos[s].n_docs;
        info.n_tokens += infos[s].n_tokens;
        info.n_chunks += infos[s].n_chunks;
        info.n_deleted += infos[s].n_deleted;
    }
    if (layout.sharded) info.format_version = kShardedFormatVersion;
    return info;
}

namespace {

// Counts d's tombstones (d->deleted) into its info and drops their documents from its IVF lists.
void drop_deleted(IndexData* d) {
    d->info.n_deleted = std::count(d->deleted.begin(), d->deleted.end(), char(1));
    if (d->info.n_deleted == 0) return;
    size_t w = 0;
    int64_t begin = 0;
    for (int k = 0; k < d->model.n_centroids; ++k) {
        const int64_t end = d->ivf_offsets[k + 1];
        for (int64_t e = begin; e < end; ++e) {
            if (!d->deleted[d->ivf_docs[e]]) d->ivf_docs[w++] = d->ivf_docs[e];
        }
        begin = end;
        d->ivf_offsets[k + 1] = static_cast<int64_t>(w);
    }
    d->ivf_docs.resize(w);
}

}  // namespace

// Loads the stores of the layout (in parallel, one thread each), then applies every store's
// tombstones to the shards they name. A partial layout's head store, when not asked for, is
// read for its tombstones only and not returned. *index_docs: the whole index's documents.
Status read_shards(const Layout& layout, std::vector<Db>& dbs, const std::string& path, VectorLoad vectors,
                   bool progress, const std::vector<int>& want, std::vector<IndexData>* shards, int64_t* index_docs) {
    std::vector<IndexInfo> infos;
    std::vector<nlohmann::json> stats;
    TMS_RETURN_IF_ERROR(read_shard_metas(layout, dbs, path, &infos, &stats));
    const IndexInfo total = combine_infos(layout, infos, stats);
    const size_t n = dbs.size();
    // Every document of the index is below the head's last: the bound of tombstones' ids.
    const int64_t limit = total.shards.back().first_doc + total.shards.back().n_docs;
    if (index_docs) *index_docs = limit;
    std::vector<char> wanted(n, want.empty() ? 1 : 0);
    for (size_t s = 0; s < n; ++s) {
        if (std::find(want.begin(), want.end(), layout.numbers[s]) != want.end()) wanted[s] = 1;
    }
    shards->clear();
    shards->resize(n);
    std::vector<std::vector<int64_t>> tomb(n);
    std::vector<Status> sts(n);
    const auto load = [&](size_t s, bool show) {
        const std::string sp = layout.sharded ? layout.stores[s].string() : path;
        return wanted[s]
                   ? read_store(dbs[s], sp, vectors, show, total.shards[s].first_doc, limit, &(*shards)[s], &tomb[s])
                   : read_tombstones(dbs[s], sp, limit, &tomb[s]);
    };
    if (n == 1) {
        sts[0] = load(0, progress);
    } else {
        const int threads = std::max(1, omp_get_max_threads() / int(n));
        Progress prog("loading", total.n_docs, progress, " doc");
        std::vector<std::thread> loaders;
        for (size_t s = 0; s < n; ++s) {
            loaders.emplace_back([&, s] {
                omp_set_num_threads(threads);
                sts[s] = load(s, false);
            });
        }
        for (size_t s = 0; s < n; ++s) {
            loaders[s].join();
            prog.Add(total.shards[s].n_docs);
        }
        prog.Done();
    }
    for (size_t s = 0; s < n; ++s) TMS_RETURN_IF_ERROR(sts[s]);
    for (size_t s = 0; layout.sharded && s < n; ++s) {  // one model: the manifest's
        if (wanted[s] && ModelCrc((*shards)[s].model) != layout.model_crc) {
            return Status::Corruption(layout.stores[s].string() +
                                      ": its model differs from the manifest's (the index is damaged)");
        }
    }
    // Deleted documents leave the IVF lists, so no search path sees them.
    for (size_t s = 0; s < n; ++s) (*shards)[s].deleted.assign(size_t(total.shards[s].n_docs), 0);
    for (size_t s = 0; s < n; ++s) {
        for (int64_t g : tomb[s]) {
            size_t t = n - 1;
            while (t > 0 && g < total.shards[t].first_doc) --t;
            // A partial open holds only some shards: a tombstone may name another's document.
            const int64_t local = g - total.shards[t].first_doc;
            if (local >= 0 && local < total.shards[t].n_docs) (*shards)[t].deleted[size_t(local)] = 1;
        }
    }
#pragma omp parallel for schedule(dynamic, 1) if (n > 1)
    for (size_t s = 0; s < n; ++s) drop_deleted(&(*shards)[s]);
    for (size_t s = 0; s < n; ++s) {
        (*shards)[s].first_doc = total.shards[s].first_doc;
        (*shards)[s].info.shards = {total.shards[s]};
        (*shards)[s].info.format_version = total.format_version;
    }
    if (!want.empty()) {  // only the stores asked for
        size_t w = 0;
        for (size_t s = 0; s < n; ++s) {
            if (!wanted[s]) continue;
            if (w != s) (*shards)[w] = std::move((*shards)[s]);  // (a self-move would empty it)
            ++w;
        }
        shards->resize(w);
    }
    return Status::OK();
}

Status ReadIndexInfo(const std::string& path, IndexInfo* info) {
    return with_read_stores(path, [&](const Layout& layout, std::vector<Db>& dbs) {
        std::vector<IndexInfo> infos;
        std::vector<nlohmann::json> stats;
        TMS_RETURN_IF_ERROR(read_shard_metas(layout, dbs, path, &infos, &stats));
        *info = combine_infos(layout, infos, stats);
        return ReadMetadataInfo((layout.dir / kMetadataFile).string(), info->n_docs, &info->metadata_columns,
                                &info->metadata_rows);
    });
}

Status ReadIndexModel(const std::string& path, IndexModel* model) {
    return with_read_stores(path,
                            [&](const Layout&, std::vector<Db>& dbs) {
                                IndexInfo info;
                                nlohmann::json stats;
                                TMS_RETURN_IF_ERROR(read_meta(dbs[0], path, &info, &stats));
                                return read_model(dbs[0], path, info, stats, model);
                            },
                            {0});
}

void ReadKnownAssignments(const std::string& path, const IndexModel& model, const std::vector<int64_t>& lens,
                          std::vector<uint32_t>* out) {
    out->clear();
    IndexData d;
    if (!ReadIndex(path, false, false, &d).ok() || d.model.centroids != model.centroids ||
        d.info.n_docs != int64_t(lens.size()) || d.doc_offsets.size() != lens.size() + 1) {
        return;
    }
    for (size_t i = 0; i < lens.size(); ++i) {
        if (d.doc_offsets[i + 1] - d.doc_offsets[i] != lens[i] || (!d.deleted.empty() && d.deleted[i])) return;
    }
    if (int64_t(d.token_centroids.size()) != d.doc_offsets.back()) return;
    for (const uint32_t c : d.token_centroids)
        if (c >= uint32_t(model.n_centroids)) return;
    out->assign(d.token_centroids.begin(), d.token_centroids.end());
}

Status ReadIndexShards(const std::string& path, VectorLoad vectors, bool progress, std::vector<IndexData>* shards,
                       const std::vector<int>& want, std::unique_ptr<MetadataSnapshot>* metadata) {
    return with_read_stores(
        path,
        [&](const Layout& layout, std::vector<Db>& dbs) {
            int64_t n_docs = 0;
            TMS_RETURN_IF_ERROR(read_shards(layout, dbs, path, vectors, progress, want, shards, &n_docs));
            // Under the lock the stores were read under: the metadata of the same state.
            return metadata ? MetadataSnapshot::Load(layout.dir.string(), n_docs, metadata) : Status::OK();
        },
        want);
}

Status ReadIndexUpdate(const std::string& path, const std::vector<StoreMark>& loaded,
                       const std::function<StoreStart(int64_t)>& choose_from, bool vectors, IndexUpdate* out,
                       std::unique_ptr<MetadataSnapshot>* metadata) {
    return with_read_stores(path, [&](const Layout& layout, std::vector<Db>& dbs) {
        *out = IndexUpdate();
        const size_t n = dbs.size();
        std::vector<IndexInfo> infos;
        std::vector<nlohmann::json> stats;
        TMS_RETURN_IF_ERROR(read_shard_metas(layout, dbs, path, &infos, &stats));
        out->info = combine_infos(layout, infos, stats);
        out->marks.resize(n);
        for (size_t s = 0; s < n; ++s) {
            const std::string sp = layout.sharded ? layout.stores[s].string() : path;
            TMS_RETURN_IF_ERROR(from_rocks(dbs[s].db->GetDbIdentity(out->marks[s].identity), sp));
            out->marks[s].end = {infos[s].n_docs, infos[s].n_tokens, infos[s].n_chunks};
        }
        // The same stores, each holding what it held (the head: at least that).
        bool same = n == loaded.size();
        for (size_t s = 0; same && s < n; ++s) {
            const StoreMark &a = loaded[s], &b = out->marks[s];
            same = a.identity == b.identity && b.end.doc >= a.end.doc && b.end.token >= a.end.token &&
                   b.end.chunk >= a.end.chunk && (s + 1 == n || b.end.doc == a.end.doc);
        }
        if (!same) {
            out->rewritten = true;
            return Status::OK();
        }
        const StoreStart from = choose_from(out->marks.back().end.doc);
        if (from.doc > loaded.back().end.doc)
            return Status::Internal(path + ": a refresh read from past what it loaded");
        const int64_t limit = out->info.n_docs, head_first = out->info.shards.back().first_doc;
        std::vector<int64_t> tomb;
        for (size_t s = 0; s < n; ++s) {
            const std::string sp = layout.sharded ? layout.stores[s].string() : path;
            TMS_RETURN_IF_ERROR(s + 1 < n ? read_tombstones(dbs[s], sp, limit, &tomb)
                                          : read_store(dbs[s], sp, vectors ? VectorLoad::kMemory : VectorLoad::kNone,
                                                       false, head_first, limit, &out->added, &tomb, from));
            out->tombstones.insert(out->tombstones.end(), tomb.begin(), tomb.end());
        }
        std::sort(out->tombstones.begin(), out->tombstones.end());
        out->tombstones.erase(std::unique(out->tombstones.begin(), out->tombstones.end()), out->tombstones.end());
        out->info.n_deleted = int64_t(out->tombstones.size());
        IndexData& a = out->added;
        a.first_doc = head_first + from.doc;
        a.info.format_version = out->info.format_version;
        a.info.shards = {out->info.shards.back()};
        a.deleted.assign(size_t(a.info.n_docs), 0);
        for (auto it = std::lower_bound(out->tombstones.begin(), out->tombstones.end(), a.first_doc);
             it != out->tombstones.end() && *it < a.first_doc + a.info.n_docs; ++it)
            a.deleted[size_t(*it - a.first_doc)] = 1;
        drop_deleted(&a);
        return metadata ? MetadataSnapshot::Load(layout.dir.string(), limit, metadata) : Status::OK();
    });
}

Status ReadShardCount(const std::string& path, int* n) {
    fs::path dir;
    TMS_RETURN_IF_ERROR(ResolveTargetPath(path, &dir));
    TMS_RETURN_IF_ERROR(check_is_index_dir(path));
    Layout layout;
    TMS_RETURN_IF_ERROR(read_layout(dir, path, &layout, {}, /*count_only=*/true));
    *n = layout.n_shards;
    return Status::OK();
}

Status ReadIndex(const std::string& path, bool load_vectors, bool progress, IndexData* d) {
    std::vector<IndexData> shards;
    TMS_RETURN_IF_ERROR(
        ReadIndexShards(path, load_vectors ? VectorLoad::kMemory : VectorLoad::kNone, progress, &shards));
    ConcatShards(&shards, d);
    return Status::OK();
}

}  // namespace tms::index

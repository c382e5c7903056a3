// Copyright TileMaxSim authors. A store's RocksDB database: opening it and reading what it holds.

#include <rocksdb/options.h>
#include <cstdlib>
#include <filesystem>

#include "index/store/db.h"
#include "index/store/format.h"
#include "index/store/index_dir.h"
#include "index/store/shards.h"
#include "tilemaxsim/version.h"

namespace tms::index {

namespace fs = std::filesystem;

Status from_rocks(const rocksdb::Status& s, const std::string& path) {
    if (s.ok()) return Status::OK();
    std::string m = s.ToString();
    while (!m.empty() && (m.back() == ' ' || m.back() == ':')) m.pop_back();  // "NotFound: " alone
    if (s.IsCorruption()) return Status::Corruption(path + ": damaged index file (" + m + ")");
    if (s.IsNotFound()) return Status::NotFound(path + ": " + m);
    if (s.IsNoSpace()) return Status::IOError(path + ": disk full: " + m);
    return Status::IOError(path + ": " + m);
}

// `updating`: an in-place update of an index that searchers may be opening at the same time:
// no automatic compaction, so no file a reader is loading is deleted under it.
Status open_db(const std::string& path, bool read_only, Db* out, bool updating) {
    rocksdb::DBOptions dbo;
    dbo.create_if_missing = !read_only;
    dbo.create_missing_column_families = !read_only;
    dbo.paranoid_checks = true;
    dbo.info_log_level = rocksdb::InfoLogLevel::ERROR_LEVEL;
    dbo.keep_log_file_num = 1;
    dbo.max_background_jobs = 4;  // memtable flushes (blob writes) keep up with a GPU build
    // RocksDB aborts when it cannot start a table-opening thread (an address-space limit); the
    // tables are few (the bulk lives in blob files), so one thread opens them.
    dbo.max_file_opening_threads = 1;
    if (updating) {
        // An update writes no WAL (every write has disableWAL): it is durable exactly when the
        // commit's flush of every column family, atomic across them, returns. A damaged or lost
        // *.log therefore never takes a committed update with it, and a crash before the flush
        // leaves the old state.
        dbo.atomic_flush = true;
        dbo.allow_fallocate = false;  // no 100+ MB preallocated log on a nearly full disk
    }
    std::vector<rocksdb::ColumnFamilyDescriptor> cfs;
    for (const auto& n : kColumnFamilies) {
        rocksdb::ColumnFamilyOptions co;
        co.disable_auto_compactions = updating;
        if (updating) co.write_buffer_size = size_t(64) << 20;
        if (n == "docs" || n == "vectors") {
            co.enable_blob_files = true;
            co.min_blob_size = 4096;
            co.write_buffer_size = size_t(128) << 20;
        }
        cfs.emplace_back(n, co);
    }
    rocksdb::DB* raw = nullptr;
    rocksdb::Status s = read_only ? rocksdb::DB::OpenForReadOnly(dbo, path, cfs, &out->cf, &raw)
                                  : rocksdb::DB::Open(dbo, path, cfs, &out->cf, &raw);
    if (!s.ok()) {
        if (read_only && s.IsInvalidArgument()) {
            return Status::InvalidArgument(path + ": not a TileMaxSim index (" + s.ToString() + ")");
        }
        if (s.IsIOError() && s.ToString().find("lock") != std::string::npos) {
            return Status::IOError(path + ": locked by another writer (" + s.ToString() + ")");
        }
        return from_rocks(s, path);
    }
    out->db.reset(raw);
    return Status::OK();
}

Status read_meta(Db& db, const std::string& path, IndexInfo* info, nlohmann::json* stats) {
    std::string v;
    rocksdb::Status s = db.db->Get(rocksdb::ReadOptions(), db.cf[kMeta], "complete", &v);
    if (s.IsNotFound() || v != "1") {
        return Status::InvalidArgument(path + ": incomplete index (the build that wrote it did not finish)");
    }
    TMS_RETURN_IF_ERROR(from_rocks(s, path));
    TMS_RETURN_IF_ERROR(from_rocks(db.db->Get(rocksdb::ReadOptions(), db.cf[kMeta], "format_version", &v), path));
    const int fv = std::atoi(v.c_str());
    if (fv != kIndexFormatVersion && fv != kInlineVectorsFormat) {
        return Status::NotSupported(path + ": index format version " + v + " is not supported by this build (reads " +
                                    std::to_string(kInlineVectorsFormat) + " and " +
                                    std::to_string(kIndexFormatVersion) + "); rebuild the index");
    }
    std::string js, cfg;
    TMS_RETURN_IF_ERROR(from_rocks(db.db->Get(rocksdb::ReadOptions(), db.cf[kMeta], "stats", &js), path));
    TMS_RETURN_IF_ERROR(from_rocks(db.db->Get(rocksdb::ReadOptions(), db.cf[kMeta], "config", &cfg), path));
    try {
        *stats = nlohmann::json::parse(js);
        info->format_version = fv;
        info->n_docs = stats->at("n_docs");
        info->n_tokens = stats->at("n_tokens");
        info->dim = stats->at("dim");
        info->n_centroids = stats->at("n_centroids");
        info->codec = stats->at("codec");
        info->pq_m = stats->at("pq_m");
        info->pq_nbits = stats->at("pq_nbits");
        info->residual_nbits = stats->at("residual_nbits");
        info->has_vectors = stats->at("has_vectors");
        info->unit_norm = stats->value("unit_norm", false);
        info->n_chunks = stats->at("n_chunks");
        info->n_deleted = stats->value("n_deleted", int64_t{0});
        const int ncb = stats->at("n_code_bytes");
        info->code_bytes_per_token = 4.0 + ncb;
        info->vector_bytes_per_token = info->has_vectors ? 2.0 * info->dim : 0.0;
        info->build_config_json = cfg;
    } catch (const std::exception& e) {
        return Status::Corruption(path + ": bad index metadata: " + e.what());
    }
    return Status::OK();
}

Status check_is_index_dir(const std::string& path) {
    std::error_code ec;
    if (!fs::exists(path, ec)) return Status::NotFound(path + ": no such index");
    if (!fs::is_directory(path, ec))
        return Status::InvalidArgument(path + ": not a directory (expected an index directory)");
    if (!IsIndexDir(path)) {
        fs::path self = fs::path(path).lexically_normal();
        if (self.filename().empty()) self = self.parent_path();  // "DIR/"
        const fs::path parent = self.parent_path().empty() ? fs::path(".") : self.parent_path();
        if (fs::exists(parent / kManifestFile, ec)) {
            return Status::InvalidArgument(path + ": a shard of the index " + parent.string() +
                                           ", not an index (open " + parent.string() + ")");
        }
        return Status::InvalidArgument(path + ": not a TileMaxSim index");
    }
    return Status::OK();
}

bool IsUnmarkedIndex(const fs::path& dir) {
    std::error_code ec;
    if (!fs::is_regular_file(dir / "CURRENT", ec)) return false;
    Db db;
    if (!open_db(dir.string(), true, &db).ok()) return false;  // another program's database
    std::string v;
    // A shard's store is part of its index, never an index of its own.
    return db.db->Get(rocksdb::ReadOptions(), db.cf[kMeta], "format_version", &v).ok() &&
           db.db->Get(rocksdb::ReadOptions(), db.cf[kMeta], "shard", &v).IsNotFound();
}

// IVF list k: global ids in [lo, hi).
Status read_ivf_list(Db& db, const std::string& path, int k, int64_t lo, int64_t hi, std::vector<int32_t>* out) {
    const std::string what = path + ": ivf list " + std::to_string(k);
    rocksdb::ReadOptions ro;
    ro.verify_checksums = true;  // a damaged block must not read as a missing key
    ro.fill_cache = false;
    std::string v;
    const rocksdb::Status s = db.db->Get(ro, db.cf[kIvf], be32(static_cast<uint32_t>(k)), &v);
    if (s.IsNotFound()) return Status::Corruption(what + ": missing (the index is damaged)");
    TMS_RETURN_IF_ERROR(from_rocks(s, what));
    TMS_RETURN_IF_ERROR(unseal(what, &v));
    out->clear();
    return decode_ivf(what, v, lo, hi, out);
}

// The tombstones a store holds: global ids, each below `limit` (those of an updated shard's
// store may name documents of any shard: an update commits to one store).
Status read_tombstones(Db& db, const std::string& path, int64_t limit, std::vector<int64_t>* ids) {
    ids->clear();
    rocksdb::ReadOptions ro;
    ro.verify_checksums = true;
    std::unique_ptr<rocksdb::Iterator> it(db.db->NewIterator(ro, db.cf[kDeleted]));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
        const rocksdb::Slice k = it->key();
        uint64_t id = 0;
        for (size_t i = 0; i < k.size(); ++i) id = (id << 8) | static_cast<uint8_t>(k[i]);
        if (k.size() != 8 || id >= uint64_t(limit)) return Status::Corruption(path + ": bad tombstone key");
        ids->push_back(int64_t(id));
    }
    return from_rocks(it->status(), path);
}

Status read_floats(Db& db, const std::string& path, const char* key, std::vector<float>* out) {
    std::string v;
    TMS_RETURN_IF_ERROR(from_rocks(db.db->Get(rocksdb::ReadOptions(), db.cf[kModel], key, &v), path));
    TMS_RETURN_IF_ERROR(unseal(path + ": model/" + key, &v));
    if (v.size() % 4) return Status::Corruption(path + ": model/" + key + ": bad size");
    out->resize(v.size() / 4);
    if (!v.empty()) std::memcpy(out->data(), v.data(), v.size());
    return Status::OK();
}

// A store's model (centroids, codec parameters), its shape from the store's metadata.
Status read_model(Db& db, const std::string& path, const IndexInfo& info, const nlohmann::json& stats, IndexModel* m) {
    m->dim = info.dim;
    m->n_centroids = info.n_centroids;
    m->codec = info.codec;
    m->pq_m = info.pq_m;
    m->pq_nbits = info.pq_nbits;
    m->residual_nbits = info.residual_nbits;
    m->n_code_bytes = stats.value("n_code_bytes", 0);
    m->unit_norm = info.unit_norm;
    TMS_RETURN_IF_ERROR(read_floats(db, path, "centroids", &m->centroids));
    TMS_RETURN_IF_ERROR(read_floats(db, path, "codebook", &m->codebook));
    TMS_RETURN_IF_ERROR(read_floats(db, path, "residual_cutoffs", &m->residual_cutoffs));
    TMS_RETURN_IF_ERROR(read_floats(db, path, "residual_weights", &m->residual_weights));
    if (m->centroids.size() != size_t(m->n_centroids) * m->dim ||
        (m->n_code_bytes > 0 && m->codebook.size() != size_t(m->n_code_bytes) * 256 * (m->dim / m->n_code_bytes))) {
        return Status::Corruption(path + ": model sizes do not match the metadata");
    }
    return Status::OK();
}

}  // namespace tms::index

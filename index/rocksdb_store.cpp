// Copyright TileMaxSim authors. The RocksDB adapter: the on-disk index format.
// Column families (see DESIGN.md): meta, model, ivf, docs, vectors, ids, deleted.
// Chunk values end with a CRC-32 of their payload, checked on every read.
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <omp.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <functional>
#include <thread>
#include <cstring>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "index/index_data.h"
#include "index/index_dir.h"
#include "index/progress.h"
#include "tilemaxsim/version.h"

namespace fs = std::filesystem;

namespace tms::index {
namespace {

const std::vector<std::string> kColumnFamilies = {"default", "meta", "model", "ivf",
                                                  "docs", "vectors", "ids", "deleted"};
enum Cf { kDefault = 0, kMeta, kModel, kIvf, kDocs, kVectors, kIds, kDeleted };
constexpr uint32_t kChunkMagic = 0x544d5331;  // "TMS1"

std::string be64(uint64_t v) {
    std::string s(8, '\0');
    for (int i = 7; i >= 0; --i, v >>= 8) s[i] = static_cast<char>(v & 0xff);
    return s;
}
std::string be32(uint32_t v) {
    std::string s(4, '\0');
    for (int i = 3; i >= 0; --i, v >>= 8) s[i] = static_cast<char>(v & 0xff);
    return s;
}

template <typename T>
void put(std::string* s, const T* p, size_t n) {
    s->append(reinterpret_cast<const char*>(p), n * sizeof(T));
}
template <typename T>
void put1(std::string* s, T v) {
    put(s, &v, 1);
}

void put_varint(std::string* s, uint64_t v) {
    while (v >= 0x80) {
        s->push_back(static_cast<char>((v & 0x7f) | 0x80));
        v >>= 7;
    }
    s->push_back(static_cast<char>(v));
}

void seal(std::string* s) { put1<uint32_t>(s, Crc32(s->data(), s->size())); }

// Checks and strips the CRC trailer.
Status unseal(const std::string& what, std::string* s) {
    if (s->size() < 4) return Status::Corruption(what + ": value too short");
    uint32_t crc;
    std::memcpy(&crc, s->data() + s->size() - 4, 4);
    s->resize(s->size() - 4);
    if (Crc32(s->data(), s->size()) != crc) return Status::Corruption(what + ": checksum mismatch");
    return Status::OK();
}

// Checks the CRC trailer of a value in place (the payload is the first size() - 4 bytes).
Status check_seal(const std::string& what, const rocksdb::Slice& s) {
    if (s.size() < 4) return Status::Corruption(what + ": value too short");
    uint32_t crc;
    std::memcpy(&crc, s.data() + s.size() - 4, 4);
    if (Crc32(s.data(), s.size() - 4) != crc) return Status::Corruption(what + ": checksum mismatch");
    return Status::OK();
}

class Reader {
public:
    Reader(const std::string& what, const std::string& s) : what_(what), p_(s.data()), end_(s.data() + s.size()) {}
    Reader(const std::string& what, const char* p, size_t n) : what_(what), p_(p), end_(p + n) {}
    const char* pos() const { return p_; }
    Status skip(size_t n) {
        if (size_t(end_ - p_) < n) return Status::Corruption(what_ + ": value truncated");
        p_ += n;
        return Status::OK();
    }
    template <typename T>
    Status get(T* out, size_t n) {
        if (size_t(end_ - p_) < n * sizeof(T)) return Status::Corruption(what_ + ": value truncated");
        std::memcpy(out, p_, n * sizeof(T));
        p_ += n * sizeof(T);
        return Status::OK();
    }
    Status varint(uint64_t* v) {
        *v = 0;
        for (int shift = 0; shift < 64; shift += 7) {
            if (p_ >= end_) return Status::Corruption(what_ + ": varint truncated");
            const uint8_t b = static_cast<uint8_t>(*p_++);
            *v |= uint64_t(b & 0x7f) << shift;
            if (!(b & 0x80)) return Status::OK();
        }
        return Status::Corruption(what_ + ": bad varint");
    }
    bool done() const { return p_ == end_; }

private:
    std::string what_;
    const char* p_;
    const char* end_;
};

// Calls emit(id) for each id of a sealed ids value (payload already checked), in order.
template <typename Emit>
Status for_each_id(const std::string& what, const rocksdb::Slice& v, Emit emit) {
    Reader r(what, v.data(), v.size() - 4);
    while (!r.done()) {
        uint64_t len = 0;
        TMS_RETURN_IF_ERROR(r.varint(&len));
        const char* p = r.pos();
        TMS_RETURN_IF_ERROR(r.skip(len));
        TMS_RETURN_IF_ERROR(emit(std::string_view(p, len)));
    }
    return Status::OK();
}

// A sealed ids value -> exactly `n` ids into out[0..n).
Status decode_ids(const std::string& what, const rocksdb::Slice& v, size_t n, std::string* out) {
    size_t i = 0;
    TMS_RETURN_IF_ERROR(for_each_id(what, v, [&](std::string_view id) {
        if (i == n) return Status::Corruption(what + ": more ids than documents");
        out[i++].assign(id);
        return Status::OK();
    }));
    if (i != n) return Status::Corruption(what + ": value truncated");
    return Status::OK();
}

Status from_rocks(const rocksdb::Status& s, const std::string& path) {
    if (s.ok()) return Status::OK();
    std::string m = s.ToString();
    while (!m.empty() && (m.back() == ' ' || m.back() == ':')) m.pop_back();  // "NotFound: " alone
    if (s.IsCorruption()) return Status::Corruption(path + ": damaged index file (" + m + ")");
    if (s.IsNotFound()) return Status::NotFound(path + ": " + m);
    if (s.IsNoSpace()) return Status::IOError(path + ": disk full: " + m);
    return Status::IOError(path + ": " + m);
}

std::string info_json(const IndexInfo& info, const IndexModel& m, int chunk_docs) {
    nlohmann::json j;
    j["n_docs"] = info.n_docs;
    j["n_tokens"] = info.n_tokens;
    j["dim"] = info.dim;
    j["n_centroids"] = info.n_centroids;
    j["codec"] = info.codec;
    j["pq_m"] = m.pq_m;
    j["pq_nbits"] = m.pq_nbits;
    j["residual_nbits"] = m.residual_nbits;
    j["n_code_bytes"] = m.n_code_bytes;
    j["has_vectors"] = info.has_vectors;
    j["n_chunks"] = info.n_chunks;
    j["n_deleted"] = info.n_deleted;
    j["chunk_docs"] = chunk_docs;
    return j.dump();
}

struct Db {
    std::unique_ptr<rocksdb::DB> db;
    std::vector<rocksdb::ColumnFamilyHandle*> cf;
    void Close() {
        if (!db) return;
        for (auto* h : cf) db->DestroyColumnFamilyHandle(h);
        cf.clear();
        db->Close();
        db.reset();
    }
    ~Db() { Close(); }
};

// `updating`: an in-place update of an index that searchers may be opening at the same time:
// no automatic compaction, so no file a reader is loading is deleted under it.
Status open_db(const std::string& path, bool read_only, Db* out, bool updating = false) {
    rocksdb::DBOptions dbo;
    dbo.create_if_missing = !read_only;
    dbo.create_missing_column_families = !read_only;
    dbo.paranoid_checks = true;
    dbo.info_log_level = rocksdb::InfoLogLevel::ERROR_LEVEL;
    dbo.keep_log_file_num = 1;
    dbo.max_background_jobs = 4;  // memtable flushes (blob writes) keep up with a GPU build
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

std::string encode_ivf(const std::vector<int32_t>& list) {
    std::string s;
    int64_t prev = 0;
    put_varint(&s, static_cast<uint64_t>(list.size()));
    for (int32_t d : list) {
        put_varint(&s, static_cast<uint64_t>(d - prev));
        prev = d;
    }
    seal(&s);
    return s;
}

std::string encode_floats(const std::vector<float>& v) {
    std::string s;
    put(&s, v.data(), v.size());
    seal(&s);
    return s;
}

// Key of a chunk's external ids in the ids family.
std::string ids_key(int64_t chunk) { return "c:" + be64(static_cast<uint64_t>(chunk)); }

// The external ids of one chunk's documents: varint length + bytes each (CRC-sealed).
std::string encode_ids(const std::string* ids, size_t n) {
    std::string s;
    size_t bytes = 0;
    for (size_t i = 0; i < n; ++i) bytes += ids[i].size() + 2;
    s.reserve(bytes + 4);
    for (size_t i = 0; i < n; ++i) {
        put_varint(&s, ids[i].size());
        s += ids[i];
    }
    seal(&s);
    return s;
}

// One stored chunk: header, doc lengths, token centroids, codes (CRC-sealed).
std::string encode_chunk(int64_t first_doc, const int64_t* lens, int64_t n, const uint32_t* cids, const uint8_t* codes,
                         int64_t n_tok, int n_code_bytes) {
    std::string s;
    put1<uint32_t>(&s, kChunkMagic);
    put1<uint64_t>(&s, static_cast<uint64_t>(first_doc));
    put1<uint32_t>(&s, static_cast<uint32_t>(n));
    for (int64_t i = 0; i < n; ++i) put1<uint32_t>(&s, static_cast<uint32_t>(lens[i]));
    put(&s, cids, n_tok);
    put(&s, codes, size_t(n_tok) * n_code_bytes);
    seal(&s);
    return s;
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
    if (fv != kIndexFormatVersion) {
        return Status::NotSupported(path + ": index format version " + v + " is not supported by this build (reads " +
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
    if (!fs::is_directory(path, ec)) return Status::InvalidArgument(path + ": not a directory (expected an index directory)");
    if (!IsIndexDir(path)) return Status::InvalidArgument(path + ": not a TileMaxSim index");
    return Status::OK();
}

}  // namespace

bool IsUnmarkedIndex(const fs::path& dir) {
    std::error_code ec;
    if (!fs::is_regular_file(dir / "CURRENT", ec)) return false;
    Db db;
    if (!open_db(dir.string(), true, &db).ok()) return false;  // another program's database
    std::string v;
    return db.db->Get(rocksdb::ReadOptions(), db.cf[kMeta], "format_version", &v).ok();
}

namespace {

// A delta + varint doc-id list (encode_ivf), checked against n_docs; appended to *out.
Status decode_ivf(const std::string& what, const std::string& v, int64_t n_docs, std::vector<int32_t>* out) {
    Reader r(what, v);
    uint64_t n;
    TMS_RETURN_IF_ERROR(r.varint(&n));
    if (n > v.size()) return Status::Corruption(what + ": bad list length");  // >= 1 byte an entry
    const size_t base = out->size();
    out->resize(base + n);
    int32_t* dst = out->data() + base;
    const auto* p = reinterpret_cast<const uint8_t*>(r.pos());
    const auto* end = reinterpret_cast<const uint8_t*>(v.data() + v.size());
    int64_t prev = 0;
    for (uint64_t i = 0; i < n; ++i) {
        uint64_t delta = 0;
        int shift = 0;
        for (;;) {
            if (p == end || shift > 63) return Status::Corruption(what + ": varint truncated");
            const uint8_t b = *p++;
            delta |= uint64_t(b & 0x7f) << shift;
            if (!(b & 0x80)) break;
            shift += 7;
        }
        prev += static_cast<int64_t>(delta);
        if (prev >= n_docs) return Status::Corruption(what + ": document id out of range");
        dst[i] = static_cast<int32_t>(prev);
    }
    if (p != end) return Status::Corruption(what + ": trailing bytes");
    return Status::OK();
}

// IVF list k.
Status read_ivf_list(Db& db, const std::string& path, int k, int64_t n_docs, std::vector<int32_t>* out) {
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
    return decode_ivf(what, v, n_docs, out);
}

// deleted[doc] = 1 for every tombstone.
Status read_tombstones(Db& db, const std::string& path, int64_t n_docs, std::vector<char>* deleted) {
    deleted->assign(size_t(n_docs), 0);
    rocksdb::ReadOptions ro;
    ro.verify_checksums = true;
    std::unique_ptr<rocksdb::Iterator> it(db.db->NewIterator(ro, db.cf[kDeleted]));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
        const rocksdb::Slice k = it->key();
        uint64_t id = 0;
        for (size_t i = 0; i < k.size(); ++i) id = (id << 8) | static_cast<uint8_t>(k[i]);
        if (k.size() != 8 || int64_t(id) >= n_docs) return Status::Corruption(path + ": bad tombstone key");
        (*deleted)[id] = 1;
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

}  // namespace


// ---- updates ---------------------------------------------------------------------------

Status read_index_db(Db& db, const std::string& path, bool load_vectors, bool progress, IndexData* d);

struct IndexUpdaterImpl {
    std::string path;
    fs::path dir;
    std::unique_ptr<FileLock> writer;  // the whole command; declared first, released last
    Db db;
    IndexInfo info;
    nlohmann::json stats;
    IndexModel model;
    int chunk_docs = 2048;
    std::unordered_map<std::string, int64_t> ids;  // live external id -> internal id
    std::unordered_set<std::string> deleted_ids;    // external ids with no live document
    // IVF lists are read when an added token first touches them (ivf_loaded), not at open:
    // adding a few documents to a large index reads a few lists, not every posting.
    std::vector<std::vector<int32_t>> ivf;
    std::vector<char> ivf_loaded;
    int64_t committed_docs = 0;  // documents the stored lists may name
    std::vector<char> ivf_dirty;
    std::vector<int64_t> tombstones;
};

// Closing a read-write database replaces files (a new MANIFEST, logs): not while a reader loads.
void close_updating(Db* db, const fs::path& dir) {
    if (!db->db) return;
    std::unique_ptr<FileLock> readers;
    (void)AcquireMarkerLock(dir, true, &readers);
    db->Close();
}

void UpdaterDeleter::operator()(IndexUpdaterImpl* u) const {
    close_updating(&u->db, u->dir);
    delete u;
}

// Space an update needs on the index's file system before it starts: RocksDB aborts, rather
// than failing, on some write paths that run out of space.
Status check_free_space(const IndexUpdaterImpl& u, int64_t need_bytes) {
    constexpr int64_t kMargin = int64_t(16) << 20;
    const int64_t free = FreeBytes(u.dir);
    if (free >= 0 && free < need_bytes + kMargin) {
        return Status::IOError(u.path + ": disk full: " + std::to_string(free >> 20) + " MB free on its file system, the " +
                               "update needs about " + std::to_string((need_bytes + kMargin + (1 << 20) - 1) >> 20) + " MB");
    }
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
    {
        std::unique_ptr<FileLock> readers;
        TMS_RETURN_IF_ERROR(AcquireMarkerLock(u->dir, true, &readers));
        TMS_RETURN_IF_ERROR(open_db(u->dir.string(), false, &u->db, /*updating=*/true));
    }
    CrashPoint("update:opened");
    TMS_RETURN_IF_ERROR(read_meta(u->db, path, &u->info, &u->stats));
    IndexModel& m = u->model;
    m.dim = u->info.dim;
    m.n_centroids = u->info.n_centroids;
    m.codec = u->info.codec;
    m.pq_m = u->info.pq_m;
    m.pq_nbits = u->info.pq_nbits;
    m.residual_nbits = u->info.residual_nbits;
    m.n_code_bytes = u->stats.value("n_code_bytes", 0);
    u->chunk_docs = u->stats.value("chunk_docs", 2048);
    TMS_RETURN_IF_ERROR(read_floats(u->db, path, "centroids", &m.centroids));
    TMS_RETURN_IF_ERROR(read_floats(u->db, path, "codebook", &m.codebook));
    TMS_RETURN_IF_ERROR(read_floats(u->db, path, "residual_cutoffs", &m.residual_cutoffs));
    TMS_RETURN_IF_ERROR(read_floats(u->db, path, "residual_weights", &m.residual_weights));
    // Live external ids: every chunk's ids, less the tombstoned documents.
    std::vector<char> deleted;
    TMS_RETURN_IF_ERROR(read_tombstones(u->db, path, u->info.n_docs, &deleted));
    {
        rocksdb::ReadOptions ro;
        ro.verify_checksums = false;  // sealed
        rocksdb::PinnableSlice v;
        int64_t doc = 0;
        u->ids.reserve(size_t(u->info.n_docs));
        for (int64_t c = 0; c < u->info.n_chunks; ++c) {
            const std::string what = path + ": ids of chunk " + std::to_string(c);
            v.Reset();
            TMS_RETURN_IF_ERROR(from_rocks(u->db.db->Get(ro, u->db.cf[kIds], ids_key(c), &v), what));
            TMS_RETURN_IF_ERROR(check_seal(what, v));
            // Documents per chunk: chunk_docs, except for the last chunk of a build or an add.
            TMS_RETURN_IF_ERROR(for_each_id(what, v, [&](std::string_view id) {
                if (doc >= u->info.n_docs) return Status::Corruption(what + ": more documents than the metadata says");
                if (!deleted[doc]) u->ids.emplace(std::string(id), doc);
                else u->deleted_ids.emplace(id);
                ++doc;
                return Status::OK();
            }));
        }
        if (doc != u->info.n_docs) return Status::Corruption(path + ": document ids missing");
        for (const auto& [id, d] : u->ids) u->deleted_ids.erase(id);  // replaced: live again
    }
    u->ivf.resize(m.n_centroids);
    u->ivf_loaded.assign(m.n_centroids, 0);
    u->ivf_dirty.assign(m.n_centroids, 0);
    u->committed_docs = u->info.n_docs;
    *out = std::move(u);
    return Status::OK();
}

Status UpdaterAdd(IndexUpdaterImpl* u, const EmbeddingView& tokens, const std::vector<int64_t>& doclens,
                  std::vector<std::string> doc_ids, bool replace, bool progress) {
    if (tokens.dim != u->info.dim) {
        return Status::InvalidArgument("docs: dimension " + std::to_string(tokens.dim) + " differs from the index's " +
                                       std::to_string(u->info.dim));
    }
    if (doc_ids.empty()) return Status::InvalidArgument("doc-ids: adding documents needs explicit ids (--doc-ids)");
    TMS_RETURN_IF_ERROR(ValidateInput(tokens, doclens, &doc_ids));
    if (u->info.n_docs + int64_t(doclens.size()) > INT32_MAX) return Status::NotSupported("index would exceed 2^31 documents");
    for (size_t i = 0; i < doc_ids.size(); ++i) {
        auto it = u->ids.find(doc_ids[i]);
        if (it != u->ids.end() && !replace) {
            return Status::AlreadyExists("doc-ids: line " + std::to_string(i + 1) + ": id '" + doc_ids[i] +
                                         "' is already in the index (use --replace to replace it)");
        }
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
    TMS_RETURN_IF_ERROR(check_free_space(*u, 2 * tokens.rows * (4 + nb + (u->info.has_vectors ? 2 * dim : 0)) +
                                                 8 * tokens.rows));
    std::unique_ptr<Encoder> enc;
    TMS_RETURN_IF_ERROR(Encoder::Create(u->model, Device::kAuto, &enc));
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
        const int64_t first = u->info.n_docs, chunk = u->info.n_chunks;
        // Chunks past meta's n_chunks are invisible to readers until Commit.
        rocksdb::WriteBatch b;
        b.Put(u->db.cf[kDocs], be64(chunk), encode_chunk(first, doclens.data() + d0, int64_t(d1 - d0), cids.data(),
                                                          codes.data(), n, nb));
        if (u->info.has_vectors) {
            vecs.resize(size_t(n) * dim);
            ToHalf(tokens, row, n, vecs.data());
            std::string v;
            put(&v, vecs.data(), vecs.size());
            seal(&v);
            b.Put(u->db.cf[kVectors], be64(chunk), v);
        }
        b.Put(u->db.cf[kIds], ids_key(chunk), encode_ids(doc_ids.data() + d0, d1 - d0));
        int64_t t = 0;
        for (size_t d = d0; d < d1; ++d) {
            const int64_t doc = first + int64_t(d - d0);
            u->ids[doc_ids[d]] = doc;
            u->deleted_ids.erase(doc_ids[d]);
            for (int64_t j = t; j < t + doclens[d]; ++j) {
                const uint32_t k = cids[j];
                if (!u->ivf_loaded[k]) {  // the committed list (ids below the committed n_docs)
                    TMS_RETURN_IF_ERROR(read_ivf_list(u->db, u->path, int(k), u->committed_docs, &u->ivf[k]));
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
        TMS_RETURN_IF_ERROR(from_rocks(u->db.db->Write(wo, &b), u->path));
        CrashPoint("update:chunk");
        u->info.n_docs += int64_t(d1 - d0);
        u->info.n_tokens += n;
        u->info.n_chunks += 1;
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

// One atomic batch: IVF lists, tombstones, metadata (the new chunks and their ids were written
// before, past the committed chunk count, so invisible until now), made durable by one atomic
// flush of every column family before Commit returns.
Status UpdaterCommit(IndexUpdaterImpl* u) {
    rocksdb::WriteBatch b;
    for (int k = 0; k < u->model.n_centroids; ++k) {
        if (u->ivf_dirty[k]) b.Put(u->db.cf[kIvf], be32(static_cast<uint32_t>(k)), encode_ivf(u->ivf[k]));
    }
    std::sort(u->tombstones.begin(), u->tombstones.end());
    u->tombstones.erase(std::unique(u->tombstones.begin(), u->tombstones.end()), u->tombstones.end());
    for (int64_t doc : u->tombstones) b.Put(u->db.cf[kDeleted], be64(doc), "");
    u->info.n_deleted += static_cast<int64_t>(u->tombstones.size());
    b.Put(u->db.cf[kMeta], "stats", info_json(u->info, u->model, u->chunk_docs));
    TMS_RETURN_IF_ERROR(check_free_space(*u, int64_t(b.GetDataSize())));
    CrashPoint("update:commit");
    {
        std::unique_ptr<FileLock> readers;  // the flush replaces logs that a reader may be listing
        TMS_RETURN_IF_ERROR(AcquireMarkerLock(u->dir, true, &readers));
        rocksdb::WriteOptions wo;
        wo.disableWAL = true;
        TMS_RETURN_IF_ERROR(from_rocks(u->db.db->Write(wo, &b), u->path));
        CrashPoint("update:written");
        rocksdb::FlushOptions fo;
        fo.wait = true;
        TMS_RETURN_IF_ERROR(from_rocks(u->db.db->Flush(fo, u->db.cf), u->path));
    }
    CrashPoint("update:committed");
    u->tombstones.clear();
    std::fill(u->ivf_dirty.begin(), u->ivf_dirty.end(), 0);
    u->committed_docs = u->info.n_docs;
    return Status::OK();
}

const IndexInfo& UpdaterInfo(const IndexUpdaterImpl* u) { return u->info; }

Status CompactIndex(const std::string& path, bool progress) {
    UpdaterPtr lock;  // its writer lock is held until the new copy has replaced the old one
    TMS_RETURN_IF_ERROR(OpenUpdater(path, &lock));
    CrashPoint("compact:opened");
    const int chunk_docs = lock->chunk_docs;
    IndexBuildOptions opts;
    TMS_RETURN_IF_ERROR(ParseBuildOptionsJson(lock->info.build_config_json, &opts).WithContext(path + ": stored config"));
    IndexData d;
    TMS_RETURN_IF_ERROR(read_index_db(lock->db, path, true, progress, &d));
    const int64_t n = d.info.n_docs;
    const int nb = d.model.n_code_bytes, dim = d.model.dim;
    IndexData c;
    c.model = d.model;
    c.doc_offsets.assign(1, 0);
    for (int64_t doc = 0; doc < n; ++doc) {
        if (d.deleted[doc]) continue;
        const int64_t t0 = d.doc_offsets[doc], t1 = d.doc_offsets[doc + 1];
        c.doc_offsets.push_back(c.doc_offsets.back() + (t1 - t0));
        c.token_centroids.insert(c.token_centroids.end(), d.token_centroids.begin() + t0, d.token_centroids.begin() + t1);
        c.codes.insert(c.codes.end(), d.codes.begin() + t0 * nb, d.codes.begin() + t1 * nb);
        if (!d.vectors.empty()) c.vectors.insert(c.vectors.end(), d.vectors.begin() + t0 * dim, d.vectors.begin() + t1 * dim);
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
    close_updating(&lock->db, lock->dir);
    return WriteIndex(lock->dir.string(), c, opts, std::move(lock->writer));
}

namespace {

// CRC-32C (Castagnoli): the SSE4.2 crc32 instruction, 8 bytes a step, where the CPU has it;
// a table otherwise. Same values either way.
uint32_t crc32c_table(uint32_t c, const uint8_t* p, size_t n) {
    static const auto table = [] {
        std::array<uint32_t, 256> t{};
        for (uint32_t i = 0; i < 256; ++i) {
            uint32_t x = i;
            for (int k = 0; k < 8; ++k) x = (x & 1) ? 0x82f63b78u ^ (x >> 1) : x >> 1;
            t[i] = x;
        }
        return t;
    }();
    for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("sse4.2"))) uint32_t crc32c_hw(uint32_t c, const uint8_t* p, size_t n) {
    uint64_t c64 = c;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t v;
        std::memcpy(&v, p, 8);
        c64 = __builtin_ia32_crc32di(c64, v);
    }
    c = static_cast<uint32_t>(c64);
    for (; n > 0; --n, ++p) c = __builtin_ia32_crc32qi(c, *p);
    return c;
}
#endif

}  // namespace

uint32_t Crc32(const void* data, size_t n, uint32_t seed) {
    const auto* p = static_cast<const uint8_t*>(data);
    uint32_t c = ~seed;
#if defined(__x86_64__) && defined(__GNUC__)
    static const bool hw = __builtin_cpu_supports("sse4.2");
    c = hw ? crc32c_hw(c, p, n) : crc32c_table(c, p, n);
#else
    c = crc32c_table(c, p, n);
#endif
    return ~c;
}

struct IndexWriter::Impl {
    std::string path;
    fs::path target, tmp;
    std::unique_ptr<FileLock> target_lock;  // writer lock of an index being replaced
    std::unique_ptr<FileLock> tmp_lock;     // marks tmp as alive for RecoverLeftovers
    IndexBuildOptions opts;
    const IndexModel* model = nullptr;
    Db db;
    bool finished = false;
    int64_t n_docs = 0, n_tokens = 0, n_chunks = 0;
    std::vector<std::vector<int32_t>> ivf;
    int64_t ivf_entries = 0;  // held in `ivf`
    uint32_t ivf_runs = 0;    // spilled runs, keys be32(centroid) + be32(run) in the ivf family

    // Spill the in-memory lists as one sorted run (documents only grow, so runs concatenate).
    Status spill_ivf() {
        rocksdb::WriteBatch b;
        for (size_t k = 0; k < ivf.size(); ++k) {
            if (ivf[k].empty()) continue;
            b.Put(db.cf[kIvf], be32(static_cast<uint32_t>(k)) + be32(ivf_runs), encode_ivf(ivf[k]));
            std::vector<int32_t>().swap(ivf[k]);
        }
        TMS_RETURN_IF_ERROR(write(b));
        ivf_entries = 0;
        ++ivf_runs;
        return Status::OK();
    }

    // Final lists: the in-memory ones, or (after spills) each centroid's runs concatenated. Blocks
    // of centroids: their runs are read in key order, decoded, concatenated and re-encoded in
    // parallel, then written (and the runs deleted) in one batch per block.
    Status write_ivf() {
        constexpr int kBlock = 4096;
        const int K = static_cast<int>(ivf.size());
        std::vector<std::string> enc(std::min(K, kBlock));
        if (ivf_runs == 0) {
            for (int k0 = 0; k0 < K; k0 += kBlock) {
                const int nk = std::min(kBlock, K - k0);
#pragma omp parallel for schedule(dynamic, 64)
                for (int i = 0; i < nk; ++i) enc[i] = encode_ivf(ivf[k0 + i]);
                rocksdb::WriteBatch b;
                for (int i = 0; i < nk; ++i) b.Put(db.cf[kIvf], be32(static_cast<uint32_t>(k0 + i)), enc[i]);
                TMS_RETURN_IF_ERROR(write(b));
            }
            return Status::OK();
        }
        TMS_RETURN_IF_ERROR(spill_ivf());
        rocksdb::ReadOptions ro;
        ro.verify_checksums = false;  // every run is sealed with our CRC-32C, checked below
        ro.fill_cache = false;
        ro.readahead_size = size_t(8) << 20;
        std::unique_ptr<rocksdb::Iterator> it(db.db->NewIterator(ro, db.cf[kIvf]));
        it->SeekToFirst();
        std::vector<std::vector<std::string>> runs(std::min(K, kBlock));
        std::vector<Status> sts(std::min(K, kBlock));
        for (int k0 = 0; k0 < K; k0 += kBlock) {
            const int nk = std::min(kBlock, K - k0);
            rocksdb::WriteBatch b;
            for (int i = 0; i < nk; ++i) {
                const std::string prefix = be32(static_cast<uint32_t>(k0 + i));
                runs[i].clear();
                for (; it->Valid() && it->key().starts_with(prefix); it->Next()) {
                    runs[i].push_back(it->value().ToString());
                    b.Delete(db.cf[kIvf], it->key());
                }
            }
            TMS_RETURN_IF_ERROR(from_rocks(it->status(), path));
#pragma omp parallel for schedule(dynamic, 64)
            for (int i = 0; i < nk; ++i) {
                std::vector<int32_t> list;
                Status st;
                for (std::string& v : runs[i]) {
                    const std::string what = path + ": ivf run of centroid " + std::to_string(k0 + i);
                    st = unseal(what, &v);
                    if (st.ok()) st = decode_ivf(what, v, n_docs, &list);
                    if (!st.ok()) break;
                }
                sts[i] = st;
                if (st.ok()) enc[i] = encode_ivf(list);
            }
            for (int i = 0; i < nk; ++i) {
                TMS_RETURN_IF_ERROR(sts[i]);
                b.Put(db.cf[kIvf], be32(static_cast<uint32_t>(k0 + i)), enc[i]);
            }
            TMS_RETURN_IF_ERROR(write(b));
        }
        return Status::OK();
    }
    // The chunk being filled.
    std::vector<int64_t> lens;
    std::vector<uint32_t> cids;
    std::vector<uint8_t> codes;
    std::vector<uint16_t> vectors;
    std::vector<std::string> ids;

    Status write(rocksdb::WriteBatch& b) {
        rocksdb::WriteOptions wo;
        wo.disableWAL = true;  // the whole DB is flushed before it is marked complete
        return from_rocks(db.db->Write(wo, &b), path);
    }

    Status flush_chunk() {
        if (lens.empty()) return Status::OK();
        const int64_t first = n_docs - static_cast<int64_t>(lens.size());
        rocksdb::WriteBatch b;
        b.Put(db.cf[kDocs], be64(n_chunks),
              encode_chunk(first, lens.data(), static_cast<int64_t>(lens.size()), cids.data(), codes.data(),
                           static_cast<int64_t>(cids.size()), model->n_code_bytes));
        if (opts.keep_vectors) {
            std::string v;
            put(&v, vectors.data(), vectors.size());
            seal(&v);
            b.Put(db.cf[kVectors], be64(n_chunks), v);
        }
        b.Put(db.cf[kIds], ids_key(n_chunks), encode_ids(ids.data(), ids.size()));
        TMS_RETURN_IF_ERROR(write(b));
        ++n_chunks;
        lens.clear();
        cids.clear();
        codes.clear();
        vectors.clear();
        ids.clear();
        return Status::OK();
    }
};

IndexWriter::IndexWriter() : impl_(std::make_unique<Impl>()) {}

IndexWriter::~IndexWriter() {
    if (!impl_->finished) {
        impl_->db.Close();
        std::error_code ec;
        if (!impl_->tmp.empty()) fs::remove_all(impl_->tmp, ec);  // created by Create, ours
    }
}

Status IndexWriter::Create(const std::string& path, const IndexBuildOptions& opts, const IndexModel& model,
                           std::unique_ptr<IndexWriter>* out, std::unique_ptr<FileLock> target_lock) {
    fs::path target;
    TMS_RETURN_IF_ERROR(ResolveTargetPath(path, &target));
    RecoverLeftovers(target);
    std::error_code ec;
    const bool exists = fs::exists(fs::symlink_status(target, ec));
    if (exists) {
        if (!opts.overwrite) {
            return Status::AlreadyExists(path + ": already exists (pass --overwrite to replace it)");
        }
        // Only ever replace an index this project wrote, or an empty directory.
        const bool empty_dir = fs::is_directory(target, ec) && fs::is_empty(target, ec);
        if (!empty_dir && !IsIndexDir(target)) {
            return Status::InvalidArgument(path + ": exists and is not an index written by tms; refusing to overwrite it");
        }
        // No other writer may change the old index while the new one is built: it would be lost.
        if (!target_lock && !empty_dir) TMS_RETURN_IF_ERROR(AcquireWriterLock(target, &target_lock));
    }
    const fs::path parent = target.parent_path();
    if (!fs::exists(parent, ec)) {
        fs::create_directories(parent, ec);
        if (ec) return Status::IOError(parent.string() + ": cannot create: " + ec.message());
    }
    std::unique_ptr<IndexWriter> w(new IndexWriter());
    Impl& im = *w->impl_;
    im.path = path;
    im.target = target;
    im.target_lock = std::move(target_lock);
    TMS_RETURN_IF_ERROR(MakeBuildDir(target, &im.tmp));
    // Locked before it carries the marker: RecoverLeftovers never takes it for a dead build's.
    TMS_RETURN_IF_ERROR(FileLock::Acquire(im.tmp / kWriterLockFile, true, 0, true, im.tmp.string() + ": locked", &im.tmp_lock));
    TMS_RETURN_IF_ERROR(WriteMarker(im.tmp));
    im.opts = opts;
    im.model = &model;
    im.ivf.resize(model.n_centroids);
    CrashPoint("build:created");
    TMS_RETURN_IF_ERROR(open_db(im.tmp.string(), false, &im.db));
    rocksdb::WriteBatch b;
    b.Put(im.db.cf[kModel], "centroids", encode_floats(model.centroids));
    b.Put(im.db.cf[kModel], "codebook", encode_floats(model.codebook));
    b.Put(im.db.cf[kModel], "residual_cutoffs", encode_floats(model.residual_cutoffs));
    b.Put(im.db.cf[kModel], "residual_weights", encode_floats(model.residual_weights));
    TMS_RETURN_IF_ERROR(im.write(b));
    *out = std::move(w);
    return Status::OK();
}

Status IndexWriter::AppendDocs(const int64_t* doclens, int64_t n, const uint32_t* token_centroids, const uint8_t* codes,
                               const uint16_t* vectors, const std::string* ids) {
    Impl& im = *impl_;
    const int nb = im.model->n_code_bytes, dim = im.model->dim;
    const int chunk = std::max(1, im.opts.chunk_docs);
    int64_t t = 0;
    for (int64_t i = 0; i < n; ++i) {
        const int64_t len = doclens[i];
        const int32_t doc = static_cast<int32_t>(im.n_docs);
        for (int64_t j = t; j < t + len; ++j) {
            auto& l = im.ivf[token_centroids[j]];
            if (l.empty() || l.back() != doc) {
                l.push_back(doc);
                ++im.ivf_entries;
            }
        }
        im.lens.push_back(len);
        im.cids.insert(im.cids.end(), token_centroids + t, token_centroids + t + len);
        im.codes.insert(im.codes.end(), codes + t * nb, codes + (t + len) * nb);
        if (im.opts.keep_vectors) im.vectors.insert(im.vectors.end(), vectors + t * dim, vectors + (t + len) * dim);
        im.ids.push_back(ids[i]);
        ++im.n_docs;
        im.n_tokens += len;
        t += len;
        if (static_cast<int>(im.lens.size()) == chunk) TMS_RETURN_IF_ERROR(im.flush_chunk());
        if (im.ivf_entries >= im.opts.ivf_memory_entries) TMS_RETURN_IF_ERROR(im.spill_ivf());
    }
    return Status::OK();
}

Status IndexWriter::Finish(IndexInfo info) {
    Impl& im = *impl_;
    PhaseTrace tr;  // TMS_TRACE_LOAD=1 also times the end of a build
    TMS_RETURN_IF_ERROR(im.flush_chunk());
    TMS_RETURN_IF_ERROR(im.write_ivf());
    tr.Mark("finish: ivf lists");
    info.n_docs = im.n_docs;
    info.n_tokens = im.n_tokens;
    info.n_chunks = im.n_chunks;
    {
        rocksdb::WriteBatch b;
        b.Put(im.db.cf[kMeta], "format_version", std::to_string(kIndexFormatVersion));
        b.Put(im.db.cf[kMeta], "config", BuildOptionsToJson(im.opts));
        b.Put(im.db.cf[kMeta], "stats", info_json(info, *im.model, std::max(1, im.opts.chunk_docs)));
        TMS_RETURN_IF_ERROR(im.write(b));
    }
    rocksdb::FlushOptions fo;
    fo.wait = true;
    TMS_RETURN_IF_ERROR(from_rocks(im.db.db->Flush(fo, im.db.cf), im.path));
    tr.Mark("finish: flush");
    // Marked complete last, durably (WAL on, synced).
    rocksdb::WriteOptions sync;
    sync.sync = true;
    TMS_RETURN_IF_ERROR(from_rocks(im.db.db->Put(sync, im.db.cf[kMeta], "complete", "1"), im.path));
    TMS_RETURN_IF_ERROR(from_rocks(im.db.db->Flush(fo, im.db.cf), im.path));
    im.db.Close();  // before the rename
    CrashPoint("build:complete");
    TMS_RETURN_IF_ERROR(ReplaceIndexDir(im.tmp, im.target));
    im.finished = true;
    return Status::OK();
}

Status WriteIndex(const std::string& path, const IndexData& d, const IndexBuildOptions& opts,
                  std::unique_ptr<FileLock> target_lock) {
    IndexBuildOptions o = opts;
    o.keep_vectors = !d.vectors.empty();
    std::unique_ptr<IndexWriter> w;
    TMS_RETURN_IF_ERROR(IndexWriter::Create(path, o, d.model, &w, std::move(target_lock)));
    const int64_t n = d.info.n_docs;
    std::vector<int64_t> lens(n);
    for (int64_t i = 0; i < n; ++i) lens[i] = d.doc_offsets[i + 1] - d.doc_offsets[i];
    TMS_RETURN_IF_ERROR(w->AppendDocs(lens.data(), n, d.token_centroids.data(), d.codes.data(),
                                      d.vectors.empty() ? nullptr : d.vectors.data(), d.doc_ids.data()));
    return w->Finish(d.info);
}

namespace {

// Opens the index at `path` read-only and runs `read` on it, holding the marker shared so that
// no writer replaces the files being loaded. An in-place writer's background flushes may still
// move files under a reader: a failure of RocksDB while a writer is active is retried, and if it
// persists it is reported as what it most likely is.
Status with_read_db(const std::string& path, const std::function<Status(Db&)>& read) {
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
            Db db;
            st = open_db(dir.string(), true, &db);
            if (st.ok()) st = read(db);
        }
        if (st.ok() || st.code() == Status::Code::kInvalidArgument || st.code() == Status::Code::kNotSupported ||
            st.code() == Status::Code::kResourceExhausted || !WriterActive(dir)) {
            return st;
        }
        if (attempt == kAttempts) {
            return Status::IOError(path + ": another process is updating the index and its files changed while it "
                                   "was being opened; try again (" + st.message() + ")");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20 << attempt));
    }
}

}  // namespace

Status ReadIndexInfo(const std::string& path, IndexInfo* info) {
    return with_read_db(path, [&](Db& db) {
        nlohmann::json stats;
        return read_meta(db, path, info, &stats);
    });
}

Status ReadIndex(const std::string& path, bool load_vectors, bool progress, IndexData* d) {
    return with_read_db(path, [&](Db& db) { return read_index_db(db, path, load_vectors, progress, d); });
}

Status read_index_db(Db& db, const std::string& path, bool load_vectors, bool progress, IndexData* d) {
    nlohmann::json stats;
    TMS_RETURN_IF_ERROR(read_meta(db, path, &d->info, &stats));
    IndexModel& m = d->model;
    const IndexInfo& info = d->info;
    m.dim = info.dim;
    m.n_centroids = info.n_centroids;
    m.codec = info.codec;
    m.pq_m = info.pq_m;
    m.pq_nbits = info.pq_nbits;
    m.residual_nbits = info.residual_nbits;
    m.n_code_bytes = stats.value("n_code_bytes", 0);
    TMS_RETURN_IF_ERROR(read_floats(db, path, "centroids", &m.centroids));
    TMS_RETURN_IF_ERROR(read_floats(db, path, "codebook", &m.codebook));
    TMS_RETURN_IF_ERROR(read_floats(db, path, "residual_cutoffs", &m.residual_cutoffs));
    TMS_RETURN_IF_ERROR(read_floats(db, path, "residual_weights", &m.residual_weights));
    if (m.centroids.size() != size_t(m.n_centroids) * m.dim ||
        (m.n_code_bytes > 0 && m.codebook.size() != size_t(m.n_code_bytes) * 256 * (m.dim / m.n_code_bytes))) {
        return Status::Corruption(path + ": model sizes do not match the metadata");
    }
    PhaseTrace trace;
    const int64_t n_docs = info.n_docs, n_tokens = info.n_tokens;
    const int ncb = m.n_code_bytes;
    const bool vec = load_vectors && info.has_vectors;
    try {
        d->doc_offsets.assign(size_t(n_docs) + 1, 0);
        d->token_centroids.resize(n_tokens);
        d->codes.resize(size_t(n_tokens) * ncb);
        d->vectors.clear();
        if (vec) d->vectors.resize(size_t(n_tokens) * m.dim);
        d->doc_ids.assign(size_t(n_docs), std::string());
    } catch (const std::bad_alloc&) {
        return Status::ResourceExhausted(path + ": not enough host memory to load " + std::to_string(n_tokens) + " tokens");
    }
    // Chunk values carry their own CRC-32C (hardware instruction); RocksDB's block checksum of
    // the same bytes is a portable table-driven CRC in Debian's build, 5x slower, so chunk reads
    // skip it and check ours.
    rocksdb::ReadOptions ro_chunks;
    ro_chunks.verify_checksums = false;
    ro_chunks.fill_cache = false;
    Progress prog("loading", n_docs, progress, " doc");
    // A window of chunks at a time (bounded memory): fetched and checksummed in parallel, headers
    // parsed in order (document and token offsets), then payloads copied in parallel straight
    // into the preallocated arrays.
    const int64_t window = int64_t(4) * omp_get_max_threads();
    std::vector<rocksdb::PinnableSlice> docs_v(window), vecs_v(window), ids_v(window);
    std::vector<Status> sts(window);
    struct Part {
        const char* cids = nullptr;  // payload pointers into docs_v
        const char* codes = nullptr;
        int64_t t0 = 0, ntok = 0;
        int64_t d0 = 0, ndocs = 0;
    };
    std::vector<Part> parts(window);
    int64_t next_doc = 0, next_tok = 0, reported = 0;
    for (int64_t w0 = 0; w0 < info.n_chunks; w0 += window) {
        const int64_t nw = std::min(window, info.n_chunks - w0);
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t i = 0; i < nw; ++i) {
            const int64_t c = w0 + i;
            docs_v[i].Reset();
            vecs_v[i].Reset();
            ids_v[i].Reset();
            Status st = from_rocks(db.db->Get(ro_chunks, db.cf[kDocs], be64(c), &docs_v[i]), path);
            if (st.ok()) st = check_seal(path + ": docs chunk " + std::to_string(c), docs_v[i]);
            if (st.ok()) st = from_rocks(db.db->Get(ro_chunks, db.cf[kIds], ids_key(c), &ids_v[i]), path);
            if (st.ok()) st = check_seal(path + ": ids of chunk " + std::to_string(c), ids_v[i]);
            if (st.ok() && vec) {
                st = from_rocks(db.db->Get(ro_chunks, db.cf[kVectors], be64(c), &vecs_v[i]), path);
                if (st.ok()) st = check_seal(path + ": vectors chunk " + std::to_string(c), vecs_v[i]);
            }
            sts[i] = st;
        }
        for (int64_t i = 0; i < nw; ++i) {
            TMS_RETURN_IF_ERROR(sts[i]);
            const int64_t c = w0 + i;
            const std::string what = path + ": docs chunk " + std::to_string(c);
            Reader r(what, docs_v[i].data(), docs_v[i].size() - 4);
            uint32_t magic = 0, cnt = 0;
            uint64_t first = 0;
            TMS_RETURN_IF_ERROR(r.get(&magic, 1));
            TMS_RETURN_IF_ERROR(r.get(&first, 1));
            TMS_RETURN_IF_ERROR(r.get(&cnt, 1));
            if (magic != kChunkMagic || int64_t(first) != next_doc || next_doc + int64_t(cnt) > n_docs) {
                return Status::Corruption(what + ": bad chunk header");
            }
            std::vector<uint32_t> lens(cnt);
            TMS_RETURN_IF_ERROR(r.get(lens.data(), cnt));
            int64_t ntok = 0;
            for (uint32_t l : lens) {
                ntok += l;
                d->doc_offsets[next_doc + 1] = d->doc_offsets[next_doc] + l;
                ++next_doc;
            }
            if (next_tok + ntok > n_tokens) return Status::Corruption(what + ": more tokens than the metadata says");
            parts[i].t0 = next_tok;
            parts[i].ntok = ntok;
            parts[i].d0 = next_doc - int64_t(cnt);
            parts[i].ndocs = cnt;
            parts[i].cids = r.pos();
            TMS_RETURN_IF_ERROR(r.skip(size_t(ntok) * sizeof(uint32_t)));
            parts[i].codes = r.pos();
            TMS_RETURN_IF_ERROR(r.skip(size_t(ntok) * ncb));
            if (!r.done()) return Status::Corruption(what + ": trailing bytes");
            if (vec && vecs_v[i].size() != size_t(ntok) * m.dim * 2 + 4) {
                return Status::Corruption(path + ": vectors chunk " + std::to_string(c) + ": wrong size");
            }
            next_tok += ntok;
        }
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t i = 0; i < nw; ++i) {
            const Part& p = parts[i];
            uint32_t* cid = d->token_centroids.data() + p.t0;
            std::memcpy(cid, p.cids, size_t(p.ntok) * sizeof(uint32_t));
            std::memcpy(d->codes.data() + size_t(p.t0) * ncb, p.codes, size_t(p.ntok) * ncb);
            if (vec) std::memcpy(d->vectors.data() + size_t(p.t0) * m.dim, vecs_v[i].data(), size_t(p.ntok) * m.dim * 2);
            uint32_t bad = 0;
            for (int64_t t = 0; t < p.ntok; ++t) bad |= cid[t] >= uint32_t(m.n_centroids) ? 1u : 0u;
            sts[i] = bad ? Status::Corruption(path + ": docs chunk " + std::to_string(w0 + i) + ": centroid id out of range")
                         : decode_ids(path + ": ids of chunk " + std::to_string(w0 + i), ids_v[i], size_t(p.ndocs),
                                      d->doc_ids.data() + p.d0);
        }
        for (int64_t i = 0; i < nw; ++i) TMS_RETURN_IF_ERROR(sts[i]);
        prog.Add(next_doc - reported);
        reported = next_doc;
    }
    prog.Done();
    if (next_doc != n_docs || next_tok != n_tokens) {
        return Status::Corruption(path + ": documents or tokens missing (metadata says " + std::to_string(n_docs) +
                                  " documents)");
    }
    trace.Mark("chunks");
    // IVF lists: fetched and decoded in parallel, then concatenated.
    {
        std::vector<std::vector<int32_t>> lists(m.n_centroids);
        std::vector<Status> lst(m.n_centroids);
#pragma omp parallel for schedule(dynamic, 64)
        for (int k = 0; k < m.n_centroids; ++k) lst[k] = read_ivf_list(db, path, k, n_docs, &lists[k]);
        d->ivf_offsets.assign(m.n_centroids + 1, 0);
        for (int k = 0; k < m.n_centroids; ++k) {
            TMS_RETURN_IF_ERROR(lst[k]);
            d->ivf_offsets[k + 1] = d->ivf_offsets[k] + static_cast<int64_t>(lists[k].size());
        }
        d->ivf_docs.resize(d->ivf_offsets.back());
#pragma omp parallel for schedule(dynamic, 64)
        for (int k = 0; k < m.n_centroids; ++k) {
            std::copy(lists[k].begin(), lists[k].end(), d->ivf_docs.begin() + d->ivf_offsets[k]);
        }
    }
    trace.Mark("ivf");
    // Tombstones: deleted documents leave the IVF lists, so no search path sees them.
    TMS_RETURN_IF_ERROR(read_tombstones(db, path, n_docs, &d->deleted));
    trace.Mark("tombstones");
    if (info.n_deleted > 0) {
        size_t w = 0;
        int64_t begin = 0;
        for (int k = 0; k < m.n_centroids; ++k) {
            const int64_t end = d->ivf_offsets[k + 1];
            for (int64_t e = begin; e < end; ++e) {
                if (!d->deleted[d->ivf_docs[e]]) d->ivf_docs[w++] = d->ivf_docs[e];
            }
            begin = end;
            d->ivf_offsets[k + 1] = static_cast<int64_t>(w);
        }
        d->ivf_docs.resize(w);
    }
    return Status::OK();
}

}  // namespace tms::index

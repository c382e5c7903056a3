// Copyright TileMaxSim authors. The RocksDB adapter: the on-disk index format.
// Column families (see DESIGN.md): meta, model, ivf, docs, vectors, ids, deleted.
// Chunk values end with a CRC-32 of their payload, checked on every read.
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <fcntl.h>
#include <omp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <cstring>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "index/index_data.h"
#include "index/index_dir.h"
#include "index/metadata.h"
#include "kernels/cpu/parallel_copy.h"
#include "base/progress.h"
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

// The fp16 vectors of a store (format 5) live beside its RocksDB files in one flat file, in
// token order; each chunk's entry in the vectors family is a sealed reference to its bytes there
// (magic, offset, length, CRC-32C of the bytes). The bulk of an index's bytes thus bypasses
// RocksDB's memtables and blob files, and is read straight into place.
constexpr const char* kVectorsFile = "vectors.f16";
constexpr uint32_t kVectorRefMagic = 0x544d5652;  // "TMVR"
constexpr int kInlineVectorsFormat = 3;           // vectors inside the vectors family, read only

struct VectorRef {
    uint64_t offset = 0, bytes = 0;
    uint32_t crc = 0;
};

std::string encode_vector_ref(const VectorRef& r) {
    std::string v;
    put1<uint32_t>(&v, kVectorRefMagic);
    put1<uint64_t>(&v, r.offset);
    put1<uint64_t>(&v, r.bytes);
    put1<uint32_t>(&v, r.crc);
    seal(&v);
    return v;
}

// Asks for transparent huge pages on a large array before it is first written: reading an
// index faults in gigabytes of fresh memory, 512 times fewer faults with 2 MB pages.
void advise_huge_pages(void* p, size_t bytes) {
    constexpr uintptr_t kHuge = uintptr_t(2) << 20;
    const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
    const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
    if (e > a) (void)::madvise(reinterpret_cast<void*>(a), e - a, MADV_HUGEPAGE);
}

// A file descriptor, closed with its owner.
struct Fd {
    int fd = -1;
    Fd() = default;
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
    Fd& operator=(Fd&& o) noexcept {
        if (this != &o) {
            reset();
            fd = std::exchange(o.fd, -1);
        }
        return *this;
    }
    ~Fd() { reset(); }
    void reset() {
        if (fd >= 0) ::close(fd);
        fd = -1;
    }
};

Status io_error(const std::string& what, int err) {
    if (err == ENOSPC) return Status::IOError(what + ": disk full");
    return Status::IOError(what + ": " + std::strerror(err));
}

Status pwrite_all(int fd, const void* p, size_t n, uint64_t at, const std::string& what) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
        const ssize_t w = ::pwrite(fd, c, std::min<size_t>(n, size_t(1) << 30), off_t(at));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return io_error(what + ": write failed", w < 0 ? errno : EIO);
        c += w;
        n -= size_t(w);
        at += uint64_t(w);
    }
    return Status::OK();
}

Status pread_all(int fd, void* p, size_t n, uint64_t at, const std::string& what) {
    char* c = static_cast<char*>(p);
    while (n > 0) {
        const ssize_t r = ::pread(fd, c, std::min<size_t>(n, size_t(1) << 30), off_t(at));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return io_error(what + ": read failed", errno);
        if (r == 0) return Status::Corruption(what + ": truncated");
        c += r;
        n -= size_t(r);
        at += uint64_t(r);
    }
    return Status::OK();
}

// Opens the vectors file `vp` of a store that has one (a missing one: the index is damaged).
Status open_vectors_file(const std::string& vp, int flags, Fd* out) {
    out->reset();
    out->fd = ::open(vp.c_str(), flags | O_CLOEXEC);
    if (out->fd >= 0) return Status::OK();
    return errno == ENOENT ? Status::Corruption(vp + ": missing (the index is damaged)")
                           : io_error(vp + ": cannot open", errno);
}

}  // namespace

struct VectorFile::State {
    explicit State(size_t n) : checked(new std::atomic<uint8_t>[n]) {
        for (size_t i = 0; i < n; ++i) checked[i].store(0, std::memory_order_relaxed);
    }
    std::unique_ptr<std::atomic<uint8_t>[]> checked;  // 0 unchecked, 1 good, 2 bad
    std::array<std::mutex, 64> mu;                     // one checker per chunk (striped)
};

// Fills a VectorFile from read_store's chunk references.
struct VectorFileBuilder {
    static std::shared_ptr<VectorFile> Make(std::string path, Fd* fd, int dim, std::vector<int64_t> chunk_t0,
                                            std::vector<uint32_t> crc) {
        std::shared_ptr<VectorFile> f(new VectorFile());
        f->path_ = std::move(path);
        f->fd_ = std::exchange(fd->fd, -1);
        f->dim_ = dim;
        f->chunk_t0_ = std::move(chunk_t0);
        f->crc_ = std::move(crc);
        f->state_ = std::make_unique<VectorFile::State>(f->crc_.size());
        return f;
    }
};

VectorFile::~VectorFile() {
    if (fd_ >= 0) ::close(fd_);
}

Status VectorFile::Check(size_t c) const {
    std::atomic<uint8_t>& st = state_->checked[c];
    if (st.load(std::memory_order_acquire) == 0) {
        std::lock_guard<std::mutex> g(state_->mu[c % state_->mu.size()]);
        if (st.load(std::memory_order_acquire) == 0) {
            const int64_t n = chunk_t0_[c + 1] - chunk_t0_[c];
            std::unique_ptr<uint16_t[]> buf;
            try {
                buf.reset(new uint16_t[std::max<size_t>(size_t(n) * dim_, 1)]);
            } catch (const std::bad_alloc&) {
                return Status::ResourceExhausted(path_ + ": no memory to check chunk " + std::to_string(c));
            }
            uint32_t crc = 0;
            const Status r = ReadInChunk(chunk_t0_[c], n, buf.get(), &crc);
            if (!r.ok() && r.code() != Status::Code::kCorruption) return r;  // an I/O error may pass
        }
    }
    if (st.load(std::memory_order_acquire) == 2) {
        return Status::Corruption(path_ + ": chunk " + std::to_string(c) + ": checksum mismatch or truncated");
    }
    return Status::OK();
}

Status VectorFile::ReadInChunk(int64_t t0, int64_t n, uint16_t* dst, uint32_t* crc) const {
    const size_t c = size_t(std::upper_bound(chunk_t0_.begin(), chunk_t0_.end(), t0) - chunk_t0_.begin()) - 1;
    if (t0 < 0 || n < 0 || c + 1 >= chunk_t0_.size() || t0 + n > chunk_t0_[c + 1]) {
        return Status::InvalidArgument(path_ + ": rows [" + std::to_string(t0) + ", " + std::to_string(t0 + n) +
                                       ") not inside one chunk");
    }
    std::atomic<uint8_t>& st = state_->checked[c];
    const auto bad = [&] {
        st.store(2, std::memory_order_release);
        return Status::Corruption(path_ + ": chunk " + std::to_string(c) + ": checksum mismatch or truncated");
    };
    const uint8_t was = st.load(std::memory_order_acquire);
    if (was == 2) return bad();
    const size_t row = size_t(dim_) * 2;
    const Status r = pread_all(fd_, dst, size_t(n) * row, uint64_t(t0) * row, path_ + ": chunk " + std::to_string(c));
    if (!r.ok()) return r.code() == Status::Code::kCorruption ? bad() : r;
    if (was == 1) return Status::OK();  // checked before (once good, always good)
    *crc = Crc32(dst, size_t(n) * row, *crc);
    if (t0 + n < chunk_t0_[c + 1]) return Status::OK();
    if (*crc != crc_[c]) return bad();
    st.store(1, std::memory_order_release);
    return Status::OK();
}

Status VectorFile::Read(int64_t t0, int64_t n, uint16_t* dst) const {
    if (n <= 0) return Status::OK();
    if (t0 < 0 || t0 + n > n_tokens()) {
        return Status::InvalidArgument(path_ + ": rows [" + std::to_string(t0) + ", " + std::to_string(t0 + n) +
                                       ") outside the store's " + std::to_string(n_tokens()));
    }
    size_t c = size_t(std::upper_bound(chunk_t0_.begin(), chunk_t0_.end(), t0) - chunk_t0_.begin()) - 1;
    for (; c + 1 < chunk_t0_.size() && chunk_t0_[c] < t0 + n; ++c) TMS_RETURN_IF_ERROR(Check(c));
    const size_t row = size_t(dim_) * 2;
    return pread_all(fd_, dst, size_t(n) * row, uint64_t(t0) * row, path_);
}

namespace {

Status fsync_fd(int fd, const std::string& what) {
    if (::fsync(fd) != 0) return io_error(what + ": fsync failed", errno);
    return Status::OK();
}

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

// `first_doc`: the global id of a shard's first document (0 for an unsharded index).
std::string info_json(const IndexInfo& info, const IndexModel& m, int chunk_docs, int64_t first_doc) {
    nlohmann::json j;
    if (first_doc != 0) j["first_doc"] = first_doc;
    j["n_docs"] = info.n_docs;
    j["n_tokens"] = info.n_tokens;
    j["dim"] = info.dim;
    j["n_centroids"] = info.n_centroids;
    j["codec"] = info.codec;
    j["pq_m"] = m.pq_m;
    j["pq_nbits"] = m.pq_nbits;
    j["residual_nbits"] = m.residual_nbits;
    j["n_code_bytes"] = m.n_code_bytes;
    if (m.unit_norm) j["unit_norm"] = true;
    j["has_vectors"] = info.has_vectors;
    j["n_chunks"] = info.n_chunks;
    j["n_deleted"] = info.n_deleted;
    j["chunk_docs"] = chunk_docs;
    return j.dump();
}

// Where an index's stores are: the index directory itself, or the shards of its manifest.
struct Layout {
    fs::path dir;  // the index directory
    bool sharded = false;
    std::vector<fs::path> stores;
    uint32_t model_crc = 0;  // the manifest's
    // A partial open (read_layout's `want`): the shard number of each store and the index's
    // shard count. The last shard (the head, which holds every shard's tombstones) is always in.
    std::vector<int> numbers;
    int n_shards = 0;
    bool partial() const { return int(stores.size()) < n_shards; }
};

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
    if (fv != kIndexFormatVersion && fv != kInlineVectorsFormat) {
        return Status::NotSupported(path + ": index format version " + v + " is not supported by this build (reads " +
                                    std::to_string(kInlineVectorsFormat) + " and " + std::to_string(kIndexFormatVersion) +
                                    "); rebuild the index");
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
    if (!fs::is_directory(path, ec)) return Status::InvalidArgument(path + ": not a directory (expected an index directory)");
    if (!IsIndexDir(path)) {
        fs::path self = fs::path(path).lexically_normal();
        if (self.filename().empty()) self = self.parent_path();  // "DIR/"
        const fs::path parent = self.parent_path().empty() ? fs::path(".") : self.parent_path();
        if (fs::exists(parent / kManifestFile, ec)) {
            return Status::InvalidArgument(path + ": a shard of the index " + parent.string() + ", not an index (open " +
                                           parent.string() + ")");
        }
        return Status::InvalidArgument(path + ": not a TileMaxSim index");
    }
    return Status::OK();
}

}  // namespace

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

namespace {

// A delta + varint doc-id list (encode_ivf), every id checked to be in [lo, hi); appended to *out.
Status decode_ivf(const std::string& what, const std::string& v, int64_t lo, int64_t hi, std::vector<int32_t>* out) {
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
        if (prev < lo || prev >= hi) return Status::Corruption(what + ": document id out of range");
        dst[i] = static_cast<int32_t>(prev);
    }
    if (p != end) return Status::Corruption(what + ": trailing bytes");
    return Status::OK();
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

}  // namespace


// ---- updates ---------------------------------------------------------------------------

namespace {  // the reading side, defined below
Status read_shard_metas(const Layout& layout, std::vector<Db>& dbs, const std::string& path,
                        std::vector<IndexInfo>* infos, std::vector<nlohmann::json>* stats);
Status read_shards(const Layout& layout, std::vector<Db>& dbs, const std::string& path, VectorLoad vectors,
                   bool progress, const std::vector<int>& want, std::vector<IndexData>* shards,
                   int64_t* index_docs = nullptr);
Status read_layout(const fs::path& dir, const std::string& path, Layout* out, const std::vector<int>& want = {},
                   bool count_only = false);
IndexInfo combine_infos(const Layout& layout, const std::vector<IndexInfo>& infos,
                        const std::vector<nlohmann::json>& stats);
}  // namespace

// An update writes to one store only, the last shard's (the head): new documents get the next
// global ids there, and tombstones of any shard's documents go there too, so that one commit
// applies all of it.
struct IndexUpdaterImpl {
    std::string path;
    fs::path dir;
    std::unique_ptr<FileLock> writer;  // the whole command; declared first, released last
    Layout layout;
    std::vector<Db> dbs;  // every store; the head (back) read-write, the others read-only
    Db& db() { return dbs.back(); }
    IndexInfo info;       // the head store's own metadata (its documents, chunks, tombstones)
    IndexInfo view;       // the whole index as it will be after Commit (UpdaterInfo)
    int64_t first_doc = 0;       // global id of the head's first document
    int64_t others_deleted = 0;  // tombstones held by the other stores
    nlohmann::json stats;
    IndexModel model;
    int chunk_docs = 2048;
    std::unordered_map<std::string, int64_t> ids;  // live external id -> global internal id
    std::unordered_set<std::string> deleted_ids;    // external ids with no live document
    // IVF lists of the head (global ids) are read when an added token first touches them
    // (ivf_loaded), not at open: adding a few documents to a large index reads a few lists.
    std::vector<std::vector<int32_t>> ivf;
    std::vector<char> ivf_loaded;
    int64_t committed_docs = 0;  // head documents the stored lists may name
    Fd vec_file;                 // the head's vectors file (format 5 with vectors), appended to
    std::vector<char> ivf_dirty;
    std::vector<int64_t> tombstones;  // global ids
    std::vector<IndexInfo> store_infos;  // every store's metadata at open
    // Document metadata (index/metadata.h): the columns (the file's, then those added rows
    // bring) and a row for each added document, written at Commit before the stores' commit.
    bool meta_exists = false;  // the index has a metadata file
    bool meta_given = false;   // an add brought metadata: Commit creates the file if missing
    std::vector<MetaColumn> meta_columns;
    int64_t meta_rows = 0;     // rows of the file below the committed documents
    struct StagedRow {
        int64_t doc;
        std::string id;
        MetaCells cells;
    };
    std::vector<StagedRow> meta_staged;  // the added documents' rows, in doc order
    int64_t committed_global() const { return first_doc + committed_docs; }
    // Staged rows of documents that exist (an add that failed part way wrote fewer).
    void trim_staged() {
        while (!meta_staged.empty() && meta_staged.back().doc >= first_doc + info.n_docs) meta_staged.pop_back();
    }
    void update_view() {
        view.n_docs = first_doc + info.n_docs;
        view.n_tokens = info.n_tokens;
        for (size_t s = 0; s + 1 < view.shards.size(); ++s) view.n_tokens += view.shards[s].n_tokens;
        view.n_chunks = info.n_chunks;
        view.n_deleted = others_deleted + info.n_deleted;
        view.shards.back().n_docs = info.n_docs;
        view.shards.back().n_tokens = info.n_tokens;
        // Every added document gets a row (NULLs without metadata of its own).
        const bool meta = meta_exists || meta_given;
        view.metadata_columns = meta ? meta_columns : std::vector<MetaColumn>();
        view.metadata_rows = meta_exists  ? meta_rows + (view.n_docs - committed_global())
                             : meta_given ? view.n_docs
                                          : -1;
    }
};

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
        return Status::IOError(u.path + ": disk full: " + std::to_string(free >> 20) + " MB free on its file system, the " +
                               "update needs about " + std::to_string((need_bytes + kMargin + (1 << 20) - 1) >> 20) + " MB");
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
                                                  if (!deleted[g]) u->ids.emplace(std::string(id), g);
                                                  else u->deleted_ids.emplace(id);
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
    if (u->view.n_docs + int64_t(doclens.size()) > INT32_MAX) return Status::NotSupported("index would exceed 2^31 documents");
    for (size_t i = 0; i < doc_ids.size(); ++i) {
        auto it = u->ids.find(doc_ids[i]);
        if (it != u->ids.end() && !replace) {
            return Status::AlreadyExists("doc-ids: line " + std::to_string(i + 1) + ": id '" + doc_ids[i] +
                                         "' is already in the index (use --replace to replace it)");
        }
    }
    MetaRows rows;
    if (metadata) TMS_RETURN_IF_ERROR(ResolveMetadata(*metadata, doc_ids, u->meta_columns, &rows));
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
    TMS_RETURN_IF_ERROR(check_free_space(*u, 2 * tokens.rows * (4 + nb + (u->info.has_vectors ? 2 * dim : 0)) +
                                                 8 * tokens.rows));
    std::unique_ptr<Encoder> enc;
    IndexBuildOptions built;  // the GPU the index was built on encodes its additions
    (void)ParseBuildOptionsJson(u->info.build_config_json, &built);
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
        b.Put(u->db().cf[kDocs], be64(chunk), encode_chunk(first, doclens.data() + d0, int64_t(d1 - d0), cids.data(),
                                                          codes.data(), n, nb));
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

Status CompactIndex(const std::string& path, bool progress) {
    UpdaterPtr lock;  // its writer lock is held until the new copy has replaced the old one
    TMS_RETURN_IF_ERROR(OpenUpdater(path, &lock));
    CrashPoint("compact:opened");
    const int chunk_docs = lock->chunk_docs;
    IndexBuildOptions opts;
    TMS_RETURN_IF_ERROR(ParseBuildOptionsJson(lock->info.build_config_json, &opts).WithContext(path + ": stored config"));
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
            std::unique_ptr<MetadataWriter> w;
            TMS_RETURN_IF_ERROR(
                MetadataWriter::Create((fs::path(build_dir) / kMetadataFile).string(), lock->meta_columns, &w));
            std::vector<MetaColumn> columns;
            TMS_RETURN_IF_ERROR(ForEachMetadataRow(meta_path, n, &columns, [&](int64_t doc, const std::string& id,
                                                                                const MetaCells& cells) {
                const int64_t to = new_of[size_t(doc)];
                if (to < 0) return Status::OK();
                if (c.doc_ids[size_t(to)] != id) {
                    return Status::Corruption(meta_path + ": the row of document " + std::to_string(doc) + " names '" +
                                              id + "', the index '" + c.doc_ids[size_t(to)] + "'");
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

namespace {

// One chunk's bytes, handed over in order, written at [at, at + n) of a vectors file: the
// 4 KiB-aligned interior through `direct` (the file opened O_DIRECT: a build's bulk goes
// straight to the disk instead of through the page cache's writeback, which sustains less on
// the disks measured, BENCHMARKS.md), the partial pages at either end through `fd` (they
// share their pages with the neighbouring chunks, written by other threads). Without a direct
// descriptor, or when the file system refuses direct writes (EINVAL: *direct_ok goes false
// for every later chunk), everything goes through `fd`, each piece handed to writeback.
class ChunkWriter {
public:
    static constexpr uint64_t kAlign = 4096;
    static constexpr size_t kBuffer = size_t(8) << 20;  // a direct write; a multiple of kAlign
    ChunkWriter(int fd, int direct, uint64_t at, uint64_t n, const std::string& name, std::atomic<bool>* direct_ok,
                char* buf)
        : fd_(fd), direct_(direct), pos_(at), a0_((at + kAlign - 1) / kAlign * kAlign),
          a1_((at + n) / kAlign * kAlign), name_(name), direct_ok_(direct_ok), buf_(buf) {
        if (direct_ < 0 || !buf_ || a1_ <= a0_ || !direct_ok_->load()) a0_ = a1_ = at + n;  // all through fd
    }
    Status Put(const char* p, uint64_t n) {
        while (n > 0) {
            uint64_t m;
            if (pos_ < a0_ || pos_ >= a1_) {  // a partial page, or everything: through the page cache
                m = pos_ < a0_ ? std::min(n, a0_ - pos_) : n;
                TMS_RETURN_IF_ERROR(pwrite_all(fd_, p, m, pos_, name_));
                if (a0_ == a1_) (void)::sync_file_range(fd_, off_t(pos_), off_t(m), SYNC_FILE_RANGE_WRITE);
            } else {
                m = std::min<uint64_t>({n, a1_ - pos_, kBuffer - fill_});
                std::memcpy(buf_ + fill_, p, m);
                fill_ += m;
                if (fill_ == kBuffer || pos_ + m == a1_) TMS_RETURN_IF_ERROR(Flush(pos_ + m - fill_));
            }
            p += m;
            n -= m;
            pos_ += m;
        }
        return Status::OK();
    }

private:
    Status Flush(uint64_t at) {  // buf_[0, fill_) at `at`: both multiples of kAlign
        const size_t n = fill_;
        fill_ = 0;
        if (direct_ok_->load()) {
            const ssize_t w = ::pwrite(direct_, buf_, n, off_t(at));
            if (w == ssize_t(n)) return Status::OK();
            if (w >= 0 || errno != EINVAL) return io_error(name_ + ": write failed", w < 0 ? errno : EIO);
            direct_ok_->store(false);
        }
        return pwrite_all(fd_, buf_, n, at, name_);
    }
    int fd_, direct_;
    uint64_t pos_, a0_, a1_;
    const std::string& name_;
    std::atomic<bool>* direct_ok_;
    char* buf_;
    size_t fill_ = 0;
};

// The fp16 vectors of a build's stores, written into their vectors files by threads of their
// own ahead of the codes: they do not depend on the model, so the bulk of a build's bytes goes
// to disk while k-means trains. One task per store chunk (the chunks StoreWriter makes: every
// chunk_docs documents of a store), written by a ChunkWriter in pieces
// and checksummed; StoreWriter::flush_chunk waits for its chunk's reference. The writing runs at
// most `max_lead` bytes ahead of the chunk the store writer waits for, so that the encoder still
// finds the input rows in the page cache where the input is larger than memory (else the
// input would be read from disk twice).
class VectorsAhead {
public:
    struct Store {  // consecutive stores from the input's first document on
        fs::path dir;
        int64_t n_docs = 0;
    };
    static Status Start(const std::vector<Store>& stores, const std::vector<int64_t>& doclens, int chunk_docs,
                        int dim, int64_t max_lead, VectorSource source, std::unique_ptr<VectorsAhead>* out) {
        std::unique_ptr<VectorsAhead> a(new VectorsAhead());
        a->start_ = std::chrono::steady_clock::now();
        a->dim_ = dim;
        a->source_ = std::move(source);
        int64_t doc = 0, tok = 0;
        for (const Store& st : stores) {
            a->first_task_.push_back(a->tasks_.size());
            a->names_.push_back((st.dir / kVectorsFile).string());
            Fd f;
            f.fd = ::open(a->names_.back().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            if (f.fd < 0) return io_error(a->names_.back() + ": cannot create", errno);
            a->fds_.push_back(std::move(f));
            Fd direct;  // none where the file system has no direct I/O
            direct.fd = ::open(a->names_.back().c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
            a->direct_fds_.push_back(std::move(direct));
            uint64_t offset = 0;
            for (int64_t d0 = 0; d0 < st.n_docs; d0 += chunk_docs) {
                Task t{a->fds_.size() - 1, tok, 0, offset};
                for (int64_t d = d0; d < std::min(st.n_docs, d0 + chunk_docs); ++d) t.n_tok += doclens[size_t(doc + d)];
                tok += t.n_tok;
                offset += uint64_t(t.n_tok) * uint64_t(dim) * sizeof(uint16_t);
                a->tasks_.push_back(t);
            }
            doc += st.n_docs;
        }
        a->first_task_.push_back(a->tasks_.size());
        const uint64_t bytes = uint64_t(tok) * uint64_t(dim) * sizeof(uint16_t);
        a->lead_ = size_t(double(std::max<int64_t>(max_lead, 0)) / double(std::max<uint64_t>(bytes, 1)) *
                          double(a->tasks_.size()));
        a->crc_.assign(a->tasks_.size(), 0);
        a->done_.assign(a->tasks_.size(), 0);
        const int n = int(std::min<size_t>({8, std::max(1u, std::thread::hardware_concurrency()), a->tasks_.size()}));
        for (int i = 0; i < n; ++i) a->threads_.emplace_back([p = a.get()] { p->Work(); });
        *out = std::move(a);
        return Status::OK();
    }
    ~VectorsAhead() {
        {
            std::lock_guard<std::mutex> g(mu_);
            stop_ = true;
            cv_.notify_all();
        }
        for (auto& t : threads_) t.join();
    }
    // Chunk c of store s, once written; or the first error of any chunk.
    Status Wait(size_t s, int64_t c, VectorRef* ref) {
        const size_t i = first_task_[s] + size_t(c);
        if (i >= first_task_[s + 1]) return Status::Internal(names_[s] + ": more chunks than were written ahead");
        std::unique_lock<std::mutex> l(mu_);
        if (i > frontier_) {
            frontier_ = i;
            cv_.notify_all();
        }
        cv_.wait(l, [&] { return done_[i] || !error_.ok(); });
        if (!done_[i]) return error_;
        *ref = {tasks_[i].offset, uint64_t(tasks_[i].n_tok) * uint64_t(dim_) * sizeof(uint16_t), crc_[i]};
        return Status::OK();
    }
    // Seconds from Start until every chunk was written (once they all were).
    double seconds() {
        std::lock_guard<std::mutex> g(mu_);
        return seconds_;
    }

private:
    struct Task {
        size_t store;
        int64_t tok0, n_tok;  // the chunk's tokens, numbered across the whole input
        uint64_t offset;      // in the store's vectors file
    };
    VectorsAhead() = default;
    void Work() {
        std::vector<uint16_t> buf;
        std::unique_ptr<char, decltype(&std::free)> aligned(
            static_cast<char*>(std::aligned_alloc(ChunkWriter::kAlign, ChunkWriter::kBuffer)), &std::free);
        const uint64_t row = uint64_t(dim_) * sizeof(uint16_t);
        const int64_t piece = int64_t(std::max<uint64_t>(1, ChunkWriter::kBuffer / row));  // a direct write's rows
        for (size_t i; !stop_ && (i = next_.fetch_add(1)) < tasks_.size();) {
            {
                std::unique_lock<std::mutex> l(mu_);
                cv_.wait(l, [&] { return stop_ || i <= frontier_ + lead_; });
            }
            if (stop_) break;
            const Task& t = tasks_[i];
            ChunkWriter w(fds_[t.store].fd, direct_fds_[t.store].fd, t.offset, uint64_t(t.n_tok) * row, names_[t.store],
                          &direct_ok_, aligned.get());
            Status st;
            uint32_t crc = 0;
            try {
                for (int64_t r = 0; r < t.n_tok && st.ok() && !stop_; r += piece) {
                    const int64_t n = std::min(piece, t.n_tok - r);
                    const uint16_t* v = source_(t.tok0 + r, n, &buf);
                    st = w.Put(reinterpret_cast<const char*>(v), uint64_t(n) * row);
                    crc = Crc32(v, uint64_t(n) * row, crc);
                }
            } catch (const std::bad_alloc&) {
                st = Status::ResourceExhausted(names_[t.store] + ": out of host memory writing vectors");
            }
            std::lock_guard<std::mutex> g(mu_);
            if (st.ok() && !stop_) {
                crc_[i] = crc;
                done_[i] = 1;
                if (++n_done_ == tasks_.size()) seconds_ = SecondsSince(start_);
            } else if (!st.ok() && error_.ok()) {
                error_ = st;
                stop_ = true;
            }
            cv_.notify_all();
        }
    }
    int dim_ = 0;
    VectorSource source_;
    std::vector<Task> tasks_;
    std::vector<size_t> first_task_;  // [stores + 1]
    std::vector<Fd> fds_;
    std::vector<Fd> direct_fds_;  // the same files opened O_DIRECT (-1: none)
    std::atomic<bool> direct_ok_{true};
    std::vector<std::string> names_;
    std::vector<uint32_t> crc_;
    std::vector<char> done_;
    size_t n_done_ = 0;
    size_t frontier_ = 0;  // the last chunk waited for: chunks up to frontier_ + lead_ are written
    size_t lead_ = 0;
    std::chrono::steady_clock::time_point start_;
    double seconds_ = 0;
    std::mutex mu_;
    std::condition_variable cv_;
    Status error_;
    std::atomic<bool> stop_{false};
    std::atomic<size_t> next_{0};
    std::vector<std::thread> threads_;
};

// One store being written: a whole unsharded index, or one shard. Its documents are the
// global internal ids [first_doc, first_doc + n_docs): chunk headers and IVF lists hold global
// ids, so that a tombstone names a document the same way in every shard.
struct StoreWriter {
    std::string path;  // for messages
    IndexBuildOptions opts;
    const IndexModel* model = nullptr;
    Db db;
    int64_t first_doc = 0;
    int64_t n_docs = 0, n_tokens = 0, n_chunks = 0;
    std::vector<std::vector<int32_t>> ivf;
    int64_t ivf_entries = 0;  // held in `ivf`
    uint32_t ivf_runs = 0;    // spilled runs, keys be32(centroid) + be32(run) in the ivf family
    // The chunk being filled.
    std::vector<int64_t> lens;
    std::vector<uint32_t> cids;
    std::vector<uint8_t> codes;
    std::vector<std::string> ids;
    Fd vec_file;                 // kVectorsFile, with keep_vectors
    uint64_t vec_written = 0;    // bytes written to it (WriteVectors, ahead of Append)
    uint64_t chunk_vec_at = 0;   // the chunk's first vector byte in it
    uint64_t chunk_vec_bytes = 0;
    uint32_t chunk_vec_crc = 0;  // CRC-32C of the chunk's vector bytes so far
    VectorsAhead* ahead = nullptr;  // when set, the vectors file is written by it (store ahead_store)
    size_t ahead_store = 0;

    Status Open(const fs::path& dir, const IndexBuildOptions& o, const IndexModel& m, int64_t first,
                VectorsAhead* vectors_ahead = nullptr, size_t store = 0) {
        path = dir.string();
        opts = o;
        model = &m;
        first_doc = first;
        ahead = vectors_ahead;
        ahead_store = store;
        ivf.resize(m.n_centroids);
        TMS_RETURN_IF_ERROR(open_db(path, false, &db));
        if (opts.keep_vectors) {
            const std::string vp = (dir / kVectorsFile).string();
            if (ahead) {
                TMS_RETURN_IF_ERROR(open_vectors_file(vp, O_WRONLY, &vec_file));  // for Finish's fsync
            } else {
                vec_file.fd = ::open(vp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
                if (vec_file.fd < 0) return io_error(vp + ": cannot create", errno);
            }
        }
        rocksdb::WriteBatch b;
        b.Put(db.cf[kModel], "centroids", encode_floats(m.centroids));
        b.Put(db.cf[kModel], "codebook", encode_floats(m.codebook));
        b.Put(db.cf[kModel], "residual_cutoffs", encode_floats(m.residual_cutoffs));
        b.Put(db.cf[kModel], "residual_weights", encode_floats(m.residual_weights));
        return write(b);
    }

    Status write(rocksdb::WriteBatch& b) {
        rocksdb::WriteOptions wo;
        wo.disableWAL = true;  // the whole DB is flushed before it is marked complete
        return from_rocks(db.db->Write(wo, &b), path);
    }

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
                    if (st.ok()) st = decode_ivf(what, v, first_doc, first_doc + n_docs, &list);
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

    Status flush_chunk() {
        if (lens.empty()) return Status::OK();
        const int64_t first = first_doc + n_docs - static_cast<int64_t>(lens.size());
        rocksdb::WriteBatch b;
        b.Put(db.cf[kDocs], be64(n_chunks),
              encode_chunk(first, lens.data(), static_cast<int64_t>(lens.size()), cids.data(), codes.data(),
                           static_cast<int64_t>(cids.size()), model->n_code_bytes));
        if (opts.keep_vectors) {
            VectorRef r;
            if (ahead) {
                TMS_RETURN_IF_ERROR(ahead->Wait(ahead_store, n_chunks, &r));
                if (r.offset != chunk_vec_at || r.bytes != chunk_vec_bytes) {
                    return Status::Internal(path + ": chunk " + std::to_string(n_chunks) +
                                            " differs from the vectors written ahead for it");
                }
            } else {
                r.offset = chunk_vec_at;
                r.bytes = chunk_vec_bytes;
                r.crc = chunk_vec_crc;
                if (r.offset + r.bytes > vec_written) return Status::Internal(path + ": vectors appended before they were written");
            }
            b.Put(db.cf[kVectors], be64(n_chunks), encode_vector_ref(r));
            chunk_vec_at += chunk_vec_bytes;
            chunk_vec_bytes = 0;
            chunk_vec_crc = 0;
        }
        b.Put(db.cf[kIds], ids_key(n_chunks), encode_ids(ids.data(), ids.size()));
        TMS_RETURN_IF_ERROR(write(b));
        ++n_chunks;
        lens.clear();
        cids.clear();
        codes.clear();
        ids.clear();
        return Status::OK();
    }

    // The vectors of the next documents to Append, n_tokens rows, written to the vectors file
    // in parallel pieces at once (they are the bulk of the bytes); the kernel is asked to start
    // writing them back, so that Finish's sync has little left to wait for.
    Status WriteVectors(const uint16_t* v, int64_t n_tok) {
        const uint64_t bytes = uint64_t(n_tok) * model->dim * sizeof(uint16_t);
        constexpr uint64_t kPiece = uint64_t(8) << 20;
        const int64_t pieces = int64_t((bytes + kPiece - 1) / kPiece);
        const std::string what = path + "/" + kVectorsFile;
        // Plain threads, not OpenMP: this runs on the build's writer thread, beside the
        // encoder's OpenMP team.
        std::vector<Status> sts(static_cast<size_t>(pieces));
        std::atomic<int64_t> next{0};
        auto work = [&] {
            for (int64_t i; (i = next.fetch_add(1)) < pieces;) {
                const uint64_t at = uint64_t(i) * kPiece, n = std::min(kPiece, bytes - at);
                sts[size_t(i)] = pwrite_all(vec_file.fd, reinterpret_cast<const char*>(v) + at, n, vec_written + at, what);
            }
        };
        std::vector<std::thread> writers;
        for (int64_t t = 1; t < std::min<int64_t>(pieces, 8); ++t) writers.emplace_back(work);
        work();
        for (auto& t : writers) t.join();
        for (const Status& st : sts) TMS_RETURN_IF_ERROR(st);
        if (bytes > 0) (void)::sync_file_range(vec_file.fd, off_t(vec_written), off_t(bytes), SYNC_FILE_RANGE_WRITE);
        vec_written += bytes;
        return Status::OK();
    }

    // One document: `len` tokens' centroid ids, codes and vectors (null unless kept, or when
    // written ahead; written before by WriteVectors, here only checksummed into the chunk's
    // reference).
    Status Append(int64_t len, const uint32_t* tc, const uint8_t* cd, const uint16_t* vec, const std::string& id) {
        const int nb = model->n_code_bytes, dim = model->dim;
        const int32_t doc = static_cast<int32_t>(first_doc + n_docs);
        for (int64_t j = 0; j < len; ++j) {
            auto& l = ivf[tc[j]];
            if (l.empty() || l.back() != doc) {
                l.push_back(doc);
                ++ivf_entries;
            }
        }
        lens.push_back(len);
        cids.insert(cids.end(), tc, tc + len);
        codes.insert(codes.end(), cd, cd + len * nb);
        if (opts.keep_vectors) {
            const uint64_t bytes = uint64_t(len) * dim * sizeof(uint16_t);
            if (!ahead) chunk_vec_crc = Crc32(vec, bytes, chunk_vec_crc);
            chunk_vec_bytes += bytes;
        }
        ids.push_back(id);
        ++n_docs;
        n_tokens += len;
        if (static_cast<int>(lens.size()) == std::max(1, opts.chunk_docs)) TMS_RETURN_IF_ERROR(flush_chunk());
        if (ivf_entries >= opts.ivf_memory_entries) TMS_RETURN_IF_ERROR(spill_ivf());
        return Status::OK();
    }

    // The IVF lists and the metadata, flushed; then marked complete, durably, and closed.
    Status Finish(const nlohmann::json& shard_meta) {
        Trace tr = LoadTrace();  // also times the end of a build
        TMS_RETURN_IF_ERROR(flush_chunk());
        TMS_RETURN_IF_ERROR(write_ivf());
        std::vector<std::vector<int32_t>>().swap(ivf);
        tr.Mark("finish: ivf lists");
        IndexInfo info;
        FillInfo(*model, n_docs, n_tokens, opts, &info);
        info.n_chunks = n_chunks;
        {
            rocksdb::WriteBatch b;
            b.Put(db.cf[kMeta], "format_version", std::to_string(kIndexFormatVersion));
            b.Put(db.cf[kMeta], "config", BuildOptionsToJson(opts));
            b.Put(db.cf[kMeta], "stats", info_json(info, *model, std::max(1, opts.chunk_docs), first_doc));
            if (!shard_meta.is_null()) b.Put(db.cf[kMeta], "shard", shard_meta.dump());
            TMS_RETURN_IF_ERROR(write(b));
        }
        rocksdb::FlushOptions fo;
        fo.wait = true;
        TMS_RETURN_IF_ERROR(from_rocks(db.db->Flush(fo, db.cf), path));
        if (vec_file.fd >= 0) {  // durable, with its directory entry, before the store is marked complete
            TMS_RETURN_IF_ERROR(fsync_fd(vec_file.fd, path + "/" + kVectorsFile));
            vec_file.reset();
            Fd d;
            d.fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (d.fd < 0) return io_error(path + ": cannot open", errno);
            TMS_RETURN_IF_ERROR(fsync_fd(d.fd, path));
        }
        tr.Mark("finish: flush");
        // Marked complete last, durably (WAL on, synced).
        rocksdb::WriteOptions sync;
        sync.sync = true;
        TMS_RETURN_IF_ERROR(from_rocks(db.db->Put(sync, db.cf[kMeta], "complete", "1"), path));
        TMS_RETURN_IF_ERROR(from_rocks(db.db->Flush(fo, db.cf), path));
        db.Close();
        return Status::OK();
    }
};

}  // namespace

uint32_t ModelCrc(const IndexModel& m) {
    uint32_t c = Crc32(m.centroids.data(), m.centroids.size() * sizeof(float));
    c = Crc32(m.codebook.data(), m.codebook.size() * sizeof(float), c);
    c = Crc32(m.residual_cutoffs.data(), m.residual_cutoffs.size() * sizeof(float), c);
    return Crc32(m.residual_weights.data(), m.residual_weights.size() * sizeof(float), c);
}

int ResolveShardCount(int requested, int64_t n_tokens) {
    if (requested > 0) return requested;
    return int(std::clamp<int64_t>((n_tokens + kTokensPerShard - 1) / kTokensPerShard, 1, kMaxShards));
}

std::vector<int64_t> SplitShards(const std::vector<int64_t>& doclens, int shards) {
    const int64_t n = static_cast<int64_t>(doclens.size());
    shards = int(std::clamp<int64_t>(shards, 1, std::max<int64_t>(1, n)));
    int64_t total = 0;
    for (int64_t l : doclens) total += l;
    std::vector<int64_t> out;
    int64_t doc = 0, tok = 0;
    for (int s = 1; s < shards; ++s) {
        // The first document past s / shards of the tokens starts the next shard; every shard
        // keeps at least one document.
        const int64_t goal = int64_t(double(total) * s / shards);
        const int64_t start = doc;
        while (doc < n - (shards - s) && (doc == start || tok < goal)) tok += doclens[doc++];
        out.push_back(doc - start);
    }
    out.push_back(n - doc);
    return out;
}

std::string ShardDirName(int shard) {
    char b[32];
    std::snprintf(b, sizeof(b), "shard-%04d", shard);
    return b;
}

struct IndexWriter::Impl {
    std::string path;
    fs::path target, tmp;
    std::unique_ptr<FileLock> target_lock;  // writer lock of an index being replaced
    std::unique_ptr<FileLock> tmp_lock;     // marks tmp as alive for RecoverLeftovers
    IndexBuildOptions opts;
    const IndexModel* model = nullptr;
    bool finished = false;
    bool joined = false;  // a part of a distributed build in a build directory rank 0 owns
    // Documents of each shard; one entry: an unsharded index (one store, in tmp itself).
    std::vector<int64_t> shard_docs;
    std::vector<int> mine;  // the shards this writer writes, ascending (every one but in a part)
    std::vector<std::unique_ptr<StoreWriter>> done;  // finished stores, in order
    std::unique_ptr<StoreWriter> cur;                // the shard being written
    int cur_shard = -1;
    std::unique_ptr<VectorsAhead> ahead;             // WriteVectorsAhead's, until FinishShards
    int ahead_dim = 0;
    double ahead_seconds = 0;  // from WriteVectorsAhead until every vector was written
    bool sharded() const { return shard_docs.size() > 1; }
    fs::path store_dir(size_t s) const { return sharded() ? tmp / ShardDirName(int(s)) : tmp; }

    Status open_next() {
        const size_t s = size_t(mine[done.size()]);
        int64_t first = 0;
        for (size_t i = 0; i < s; ++i) first += shard_docs[i];
        cur_shard = int(s);
        cur = std::make_unique<StoreWriter>();
        if (sharded()) {
            std::error_code ec;
            fs::create_directory(store_dir(s), ec);
            if (ec) return Status::IOError(store_dir(s).string() + ": cannot create: " + ec.message());
        }
        return cur->Open(store_dir(s), opts, *model, first, ahead.get(), s);
    }
    Status finish_cur() {
        nlohmann::json meta;
        if (sharded()) meta = {{"shard", cur_shard}, {"n_shards", shard_docs.size()}};
        TMS_RETURN_IF_ERROR(cur->Finish(meta));
        CrashPoint("build:shard");
        done.push_back(std::move(cur));
        return Status::OK();
    }
};

IndexWriter::IndexWriter() : impl_(std::make_unique<Impl>()) {}

IndexWriter::~IndexWriter() {
    if (!impl_->finished) {
        impl_->cur.reset();
        impl_->done.clear();
        impl_->ahead.reset();  // its threads write into the directory
        // Created by Create, ours (a part's build directory is rank 0's to remove).
        if (!impl_->tmp.empty() && !impl_->joined) RemoveIndexDir(impl_->tmp);
    }
}

const std::string IndexWriter::build_dir() const { return impl_->tmp.string(); }
double IndexWriter::vectors_ahead_seconds() const { return impl_->ahead_seconds; }

Status IndexWriter::Create(const std::string& path, const IndexBuildOptions& opts, const IndexModel& model,
                           std::unique_ptr<IndexWriter>* out, std::unique_ptr<FileLock> target_lock,
                           std::vector<int64_t> shard_docs, const WriterPart* part) {
    const bool parted = part && part->size > 1;
    if (parted && (part->rank < 0 || part->rank >= part->size)) return Status::InvalidArgument(path + ": bad build part");
    if (parted && part->rank != 0) {  // join rank 0's build directory
        std::unique_ptr<IndexWriter> w(new IndexWriter());
        Impl& im = *w->impl_;
        im.path = path;
        im.joined = true;
        im.tmp = part->dir;
        std::error_code ec;
        if (!fs::is_directory(im.tmp, ec)) {
            return Status::IOError(part->dir + ": the build directory of rank 0 is not visible here (a distributed "
                                   "build writes every shard into one directory: a shared filesystem)");
        }
        im.shard_docs = shard_docs.empty() ? std::vector<int64_t>{INT64_MAX} : std::move(shard_docs);
        for (int s = part->rank; s < int(im.shard_docs.size()); s += part->size) im.mine.push_back(s);
        im.opts = opts;
        im.model = &model;
        if (!im.mine.empty()) TMS_RETURN_IF_ERROR(im.open_next());
        *out = std::move(w);
        return Status::OK();
    }
    std::unique_ptr<IndexWriter> w;
    TMS_RETURN_IF_ERROR(Begin(path, opts, &w, std::move(target_lock), std::move(shard_docs), part));
    TMS_RETURN_IF_ERROR(w->SetModel(model));
    *out = std::move(w);
    return Status::OK();
}

Status IndexWriter::Begin(const std::string& path, const IndexBuildOptions& opts, std::unique_ptr<IndexWriter>* out,
                          std::unique_ptr<FileLock> target_lock, std::vector<int64_t> shard_docs,
                          const WriterPart* part) {
    const bool parted = part && part->size > 1;
    if (parted && part->rank != 0) return Status::InvalidArgument(path + ": a joining part is made by Create");
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
    im.shard_docs = shard_docs.empty() ? std::vector<int64_t>{INT64_MAX} : std::move(shard_docs);
    // The last shard takes what remains (a distributed build's counts are exact: every rank
    // splits the same way).
    if (im.sharded() && !parted) im.shard_docs.back() = INT64_MAX;
    for (int s = 0; s < int(im.shard_docs.size()); s += parted ? part->size : 1) im.mine.push_back(s);
    TMS_RETURN_IF_ERROR(MakeBuildDir(target, &im.tmp));
    // Locked before it carries the marker: RecoverLeftovers never takes it for a dead build's.
    TMS_RETURN_IF_ERROR(FileLock::Acquire(im.tmp / kWriterLockFile, true, 0, true, im.tmp.string() + ": locked", &im.tmp_lock));
    TMS_RETURN_IF_ERROR(WriteMarker(im.tmp));
    im.opts = opts;
    CrashPoint("build:created");
    *out = std::move(w);
    return Status::OK();
}

Status IndexWriter::SetModel(const IndexModel& model) {
    Impl& im = *impl_;
    if (im.model) return Status::Internal(im.path + ": the writer has its model");
    im.model = &model;
    if (im.ahead && model.dim != im.ahead_dim) {
        return Status::Internal(im.path + ": the model's dimension differs from the vectors written ahead");
    }
    return im.open_next();
}

Status IndexWriter::WriteVectorsAhead(const std::vector<int64_t>& doclens, int dim, int64_t max_lead,
                                      VectorSource source) {
    Impl& im = *impl_;
    if (im.model || im.ahead || im.mine.size() != im.shard_docs.size() || !im.opts.keep_vectors) {
        return Status::Internal(im.path + ": vectors are written ahead by a whole build with vectors, before its model");
    }
    std::vector<VectorsAhead::Store> stores;
    int64_t first = 0;
    for (size_t s = 0; s < im.shard_docs.size(); ++s) {
        const int64_t n = std::min(im.shard_docs[s], int64_t(doclens.size()) - first);
        if (im.sharded()) {
            std::error_code ec;
            fs::create_directory(im.store_dir(s), ec);
            if (ec) return Status::IOError(im.store_dir(s).string() + ": cannot create: " + ec.message());
        }
        stores.push_back({im.store_dir(s), n});
        first += n;
    }
    im.ahead_dim = dim;
    return VectorsAhead::Start(stores, doclens, std::max(1, im.opts.chunk_docs), dim, max_lead, std::move(source),
                               &im.ahead);
}

Status IndexWriter::AppendDocs(const int64_t* doclens, int64_t n, const uint32_t* token_centroids, const uint8_t* codes,
                               const uint16_t* vectors, const std::string* ids) {
    Impl& im = *impl_;
    const int nb = im.model->n_code_bytes, dim = im.model->dim;
    int64_t t = 0;
    for (int64_t i = 0; i < n;) {
        if (!im.cur) return Status::InvalidArgument(im.path + ": more documents than this writer's shards hold");
        if (im.cur->n_docs == im.shard_docs[size_t(im.cur_shard)]) {
            TMS_RETURN_IF_ERROR(im.finish_cur());
            if (im.done.size() == im.mine.size()) {
                return Status::InvalidArgument(im.path + ": more documents than this writer's shards hold");
            }
            TMS_RETURN_IF_ERROR(im.open_next());
        }
        // The documents the current shard still takes: their vectors in one write, then each.
        const int64_t room = im.shard_docs[size_t(im.cur_shard)] - im.cur->n_docs;  // INT64_MAX - n unsharded
        const int64_t i1 = room >= n - i ? n : i + room;
        const bool vecs = im.opts.keep_vectors && !im.ahead;
        if (vecs) {
            int64_t run = 0;
            for (int64_t j = i; j < i1; ++j) run += doclens[j];
            TMS_RETURN_IF_ERROR(im.cur->WriteVectors(vectors + t * dim, run));
        }
        for (; i < i1; ++i) {
            const int64_t len = doclens[i];
            TMS_RETURN_IF_ERROR(im.cur->Append(len, token_centroids + t, codes + t * nb,
                                               vecs ? vectors + t * dim : nullptr, ids[i]));
            t += len;
        }
    }
    return Status::OK();
}

Status IndexWriter::FinishShards() {
    Impl& im = *impl_;
    if (im.cur) TMS_RETURN_IF_ERROR(im.finish_cur());
    im.cur.reset();
    if (im.done.size() != im.mine.size()) return Status::InvalidArgument(im.path + ": fewer documents than shards");
    if (im.ahead) im.ahead_seconds = im.ahead->seconds();
    im.ahead.reset();  // every chunk of every store was waited for
    if (im.joined) im.finished = true;  // its part is done; rank 0 completes the index
    return Status::OK();
}

Status IndexWriter::Finish() {
    TMS_RETURN_IF_ERROR(FinishShards());
    return Complete();
}

Status IndexWriter::Complete() {
    Impl& im = *impl_;
    if (im.joined) return Status::InvalidArgument(im.path + ": a part of a distributed build does not complete it");
    if (im.sharded()) {
        nlohmann::json shards = nlohmann::json::array();
        for (size_t s = 0; s < im.shard_docs.size(); ++s) {
            std::error_code ec;
            if (!fs::is_directory(im.store_dir(s), ec)) {
                return Status::Internal(im.store_dir(s).string() + ": a shard of the build is missing");
            }
            shards.push_back(ShardDirName(int(s)));
        }
        const nlohmann::json manifest = {{"format_version", kShardedFormatVersion}, {"shards", shards},
                                         {"model_crc", ModelCrc(*im.model)}};
        const std::string text = manifest.dump(1) + "\n";
        CrashPoint("build:manifest");
        TMS_RETURN_IF_ERROR(WriteFileAtomically((im.tmp / kManifestFile).string(), [&](std::FILE* f) {
            return std::fwrite(text.data(), 1, text.size(), f) == text.size();
        }));
    }
    CrashPoint("build:complete");
    TMS_RETURN_IF_ERROR(ReplaceIndexDir(im.tmp, im.target));
    im.finished = true;
    return Status::OK();
}

Status WriteIndex(const std::string& path, const IndexData& d, const IndexBuildOptions& opts,
                  std::unique_ptr<FileLock> target_lock,
                  const std::function<Status(const std::string&)>& before_complete) {
    IndexBuildOptions o = opts;
    o.keep_vectors = !d.vectors.empty();
    const int64_t n = d.info.n_docs;
    std::vector<int64_t> lens(n);
    for (int64_t i = 0; i < n; ++i) lens[i] = d.doc_offsets[i + 1] - d.doc_offsets[i];
    std::unique_ptr<IndexWriter> w;
    TMS_RETURN_IF_ERROR(IndexWriter::Create(path, o, d.model, &w, std::move(target_lock),
                                            SplitShards(lens, ResolveShardCount(o.shards, d.info.n_tokens))));
    TMS_RETURN_IF_ERROR(w->AppendDocs(lens.data(), n, d.token_centroids.data(), d.codes.data(),
                                      d.vectors.empty() ? nullptr : d.vectors.data(), d.doc_ids.data()));
    TMS_RETURN_IF_ERROR(w->FinishShards());
    if (before_complete) TMS_RETURN_IF_ERROR(before_complete(w->build_dir()));
    return w->Complete();
}

namespace {

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
            if (w != 0) return Status::InvalidArgument(path + ": has one shard; shard " + std::to_string(w) + " asked for");
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
            return Status::IOError(path + ": another process is updating the index and its files changed while it "
                                   "was being opened; try again (" + st.message() + ")");
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
            return Status::InvalidArgument(path + ": a shard of a sharded index, not an index (open its parent directory)");
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

Status read_store(Db& db, const std::string& path, VectorLoad vectors, bool progress, int64_t first_doc,
                  int64_t limit, IndexData* d, std::vector<int64_t>* tombstones);

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
        return wanted[s] ? read_store(dbs[s], sp, vectors, show, total.shards[s].first_doc, limit, &(*shards)[s],
                                      &tomb[s])
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
            return Status::Corruption(layout.stores[s].string() + ": its model differs from the manifest's (the index is damaged)");
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
    for (size_t s = 0; s < n; ++s) {
        IndexData& d = (*shards)[s];
        d.info.n_deleted = std::count(d.deleted.begin(), d.deleted.end(), char(1));
        if (d.info.n_deleted == 0) continue;
        size_t w = 0;
        int64_t begin = 0;
        for (int k = 0; k < d.model.n_centroids; ++k) {
            const int64_t end = d.ivf_offsets[k + 1];
            for (int64_t e = begin; e < end; ++e) {
                if (!d.deleted[d.ivf_docs[e]]) d.ivf_docs[w++] = d.ivf_docs[e];
            }
            begin = end;
            d.ivf_offsets[k + 1] = static_cast<int64_t>(w);
        }
        d.ivf_docs.resize(w);
    }
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

}  // namespace

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

Status ReadShardCount(const std::string& path, int* n) {
    fs::path dir;
    TMS_RETURN_IF_ERROR(ResolveTargetPath(path, &dir));
    TMS_RETURN_IF_ERROR(check_is_index_dir(path));
    Layout layout;
    TMS_RETURN_IF_ERROR(read_layout(dir, path, &layout, {}, /*count_only=*/true));
    *n = layout.n_shards;
    return Status::OK();
}

IndexInfo SumShardInfos(const std::vector<IndexData>& shards) {
    IndexInfo info = shards.at(0).info;
    info.n_docs = info.n_tokens = info.n_chunks = info.n_deleted = 0;
    info.shards.clear();
    for (const IndexData& s : shards) {
        info.n_docs += s.info.n_docs;
        info.n_tokens += s.info.n_tokens;
        info.n_chunks += s.info.n_chunks;
        info.n_deleted += s.info.n_deleted;
        info.shards.push_back(s.info.shards.at(0));
    }
    return info;
}

namespace {
// dst[at ..) = src (the copies of ConcatShards are gigabytes: on several threads).
template <class T>
void append_parallel(const PodVector<T>& src, int64_t at, PodVector<T>* dst) {
    kernels::ParallelMemcpy(dst->data() + at, src.data(), src.size() * sizeof(T));
}
}  // namespace

void ConcatShards(std::vector<IndexData>* shards, IndexData* d, std::vector<PodVector<uint16_t>>* vector_parts) {
    std::vector<IndexData>& v = *shards;
    if (vector_parts) vector_parts->clear();
    if (v.size() == 1) {
        *d = std::move(v[0]);
        if (vector_parts) vector_parts->push_back(std::move(d->vectors));
        shards->clear();
        return;
    }
    *d = IndexData();
    d->model = v[0].model;
    d->info = SumShardInfos(v);
    d->first_doc = v[0].first_doc;
    int64_t tokens = 0, vec = 0, code_bytes = 0;
    for (const IndexData& s : v) {
        tokens += int64_t(s.token_centroids.size());
        code_bytes += int64_t(s.codes.size());
        vec += int64_t(s.vectors.size());
    }
    // Sized once and filled shard by shard, each shard's arrays freed as soon as they are
    // copied: the resident peak is the whole plus one shard, not twice the whole.
    d->token_centroids.resize(size_t(tokens));
    d->codes.resize(size_t(code_bytes));
    if (!vector_parts) d->vectors.resize(size_t(vec));
    d->doc_offsets.assign(1, 0);
    int64_t at_tok = 0, at_code = 0, at_vec = 0;
    for (IndexData& s : v) {
        const int64_t t0 = d->doc_offsets.back();
        for (size_t i = 1; i < s.doc_offsets.size(); ++i) d->doc_offsets.push_back(t0 + s.doc_offsets[i]);
        for (const VectorFileSpan& f : s.vector_files) d->vector_files.push_back({at_tok + f.token0, f.file});
        append_parallel(s.token_centroids, at_tok, &d->token_centroids);
        append_parallel(s.codes, at_code, &d->codes);
        at_tok += int64_t(s.token_centroids.size());
        at_code += int64_t(s.codes.size());
        if (vector_parts) {
            vector_parts->push_back(std::move(s.vectors));
        } else {
            append_parallel(s.vectors, at_vec, &d->vectors);
            at_vec += int64_t(s.vectors.size());
        }
        d->doc_ids.insert(d->doc_ids.end(), std::make_move_iterator(s.doc_ids.begin()), std::make_move_iterator(s.doc_ids.end()));
        d->deleted.insert(d->deleted.end(), s.deleted.begin(), s.deleted.end());
        PodVector<uint32_t>().swap(s.token_centroids);
        PodVector<uint8_t>().swap(s.codes);
        PodVector<uint16_t>().swap(s.vectors);
    }
    // IVF lists: each centroid's lists of the shards in order (ids ascend across shards, which
    // are consecutive document ranges from v[0].first_doc).
    const int K = d->model.n_centroids;
    d->ivf_offsets.assign(K + 1, 0);
    for (int k = 0; k < K; ++k) {
        int64_t len = 0;
        for (const IndexData& s : v) len += s.ivf_offsets[k + 1] - s.ivf_offsets[k];
        d->ivf_offsets[k + 1] = d->ivf_offsets[k] + len;
    }
    d->ivf_docs.resize(d->ivf_offsets.back());
#pragma omp parallel for schedule(dynamic, 64)
    for (int k = 0; k < K; ++k) {
        int64_t w = d->ivf_offsets[k];
        for (const IndexData& s : v) {
            const int32_t base = static_cast<int32_t>(s.first_doc - d->first_doc);
            for (int64_t e = s.ivf_offsets[k]; e < s.ivf_offsets[k + 1]; ++e) d->ivf_docs[w++] = base + s.ivf_docs[e];
        }
    }
    shards->clear();
}

Status ReadIndex(const std::string& path, bool load_vectors, bool progress, IndexData* d) {
    std::vector<IndexData> shards;
    TMS_RETURN_IF_ERROR(
        ReadIndexShards(path, load_vectors ? VectorLoad::kMemory : VectorLoad::kNone, progress, &shards));
    ConcatShards(&shards, d);
    return Status::OK();
}

namespace {

// One store's documents (local ids 0..n_docs-1 in `d`; stored as global ids from `first_doc`)
// and its raw tombstones (global ids below `limit`). `d->deleted` and the IVF filtering are the
// caller's (read_shards: a tombstone may live in another shard's store).
Status read_store(Db& db, const std::string& path, VectorLoad vectors, bool progress, int64_t first_doc,
                  int64_t limit, IndexData* d, std::vector<int64_t>* tombstones) {
    nlohmann::json stats;
    TMS_RETURN_IF_ERROR(read_meta(db, path, &d->info, &stats));
    IndexModel& m = d->model;
    const IndexInfo& info = d->info;
    TMS_RETURN_IF_ERROR(read_model(db, path, info, stats, &m));
    Trace trace = LoadTrace();
    const int64_t n_docs = info.n_docs, n_tokens = info.n_tokens;
    const int ncb = m.n_code_bytes;
    // vec: the vectors are read into d->vectors; vec_refs: their chunks' references are kept
    // (d->vector_files) and nothing is read.
    const bool inline_vectors = info.format_version == kInlineVectorsFormat;
    const bool vec = info.has_vectors && (vectors == VectorLoad::kMemory ||
                                          (vectors == VectorLoad::kFileOrMemory && inline_vectors));
    const bool vec_refs = info.has_vectors && (vectors == VectorLoad::kFile ||
                                               (vectors == VectorLoad::kFileOrMemory && !inline_vectors));
    if (vec_refs && inline_vectors) {
        return Status::NotSupported(path + ": this index keeps its vectors inside the store (format " +
                                    std::to_string(kInlineVectorsFormat) +
                                    "), which cannot be searched from disk; `tms compact` rewrites it in the current format");
    }
    // Format 5: the vectors file, at least as long as the store's tokens (an update that did not
    // commit may have left more).
    const bool vec_in_file = (vec || vec_refs) && !inline_vectors;
    std::vector<int64_t> chunk_t0;
    std::vector<uint32_t> chunk_crc;
    const std::string vec_path = path + "/" + kVectorsFile;
    Fd vec_file;
    if (vec_in_file) {
        TMS_RETURN_IF_ERROR(open_vectors_file(vec_path, O_RDONLY, &vec_file));
        struct stat st;
        if (::fstat(vec_file.fd, &st) != 0) return io_error(vec_path + ": cannot stat", errno);
        const uint64_t want = uint64_t(n_tokens) * uint64_t(m.dim) * 2;
        if (uint64_t(st.st_size) < want) {
            return Status::Corruption(vec_path + ": truncated (" + std::to_string(st.st_size) + " bytes, the index's " +
                                      std::to_string(n_tokens) + " tokens need " + std::to_string(want) + ")");
        }
    }
    try {
        d->doc_offsets.assign(size_t(n_docs) + 1, 0);
        d->token_centroids.resize(n_tokens);
        d->codes.resize(size_t(n_tokens) * ncb);
        d->vectors.clear();
        d->vector_files.clear();
        if (vec) d->vectors.resize(size_t(n_tokens) * m.dim);
        advise_huge_pages(d->vectors.data(), d->vectors.size() * sizeof(uint16_t));
        advise_huge_pages(d->codes.data(), d->codes.size());
        advise_huge_pages(d->token_centroids.data(), d->token_centroids.size() * sizeof(uint32_t));
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
        VectorRef vref;  // format 5: where the chunk's vectors are in the vectors file
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
            if (st.ok() && (vec || vec_refs)) {
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
            if (magic != kChunkMagic || int64_t(first) != first_doc + next_doc || next_doc + int64_t(cnt) > n_docs) {
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
            if (vec && !vec_in_file && vecs_v[i].size() != size_t(ntok) * m.dim * 2 + 4) {
                return Status::Corruption(path + ": vectors chunk " + std::to_string(c) + ": wrong size");
            }
            if (vec_in_file) {
                const std::string vw = path + ": vectors chunk " + std::to_string(c);
                Reader vr(vw, vecs_v[i].data(), vecs_v[i].size() - 4);
                uint32_t vmagic = 0;
                VectorRef& ref = parts[i].vref;
                TMS_RETURN_IF_ERROR(vr.get(&vmagic, 1));
                TMS_RETURN_IF_ERROR(vr.get(&ref.offset, 1));
                TMS_RETURN_IF_ERROR(vr.get(&ref.bytes, 1));
                TMS_RETURN_IF_ERROR(vr.get(&ref.crc, 1));
                if (vmagic != kVectorRefMagic || !vr.done() || ref.offset != uint64_t(next_tok) * m.dim * 2 ||
                    ref.bytes != uint64_t(ntok) * m.dim * 2) {
                    return Status::Corruption(vw + ": bad reference to " + kVectorsFile);
                }
                if (vec_refs) {
                    chunk_t0.push_back(next_tok);
                    chunk_crc.push_back(ref.crc);
                }
            }
            next_tok += ntok;
        }
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t i = 0; i < nw; ++i) {
            const Part& p = parts[i];
            uint32_t* cid = d->token_centroids.data() + p.t0;
            std::memcpy(cid, p.cids, size_t(p.ntok) * sizeof(uint32_t));
            std::memcpy(d->codes.data() + size_t(p.t0) * ncb, p.codes, size_t(p.ntok) * ncb);
            Status vst;
            uint16_t* vdst = vec ? d->vectors.data() + size_t(p.t0) * m.dim : nullptr;
            if (vec && vec_in_file) {
                const std::string vw = vec_path + ": chunk " + std::to_string(w0 + i);
                vst = pread_all(vec_file.fd, vdst, p.vref.bytes, p.vref.offset, vw);
                if (vst.ok() && Crc32(vdst, p.vref.bytes) != p.vref.crc) vst = Status::Corruption(vw + ": checksum mismatch");
            } else if (vec) {
                std::memcpy(vdst, vecs_v[i].data(), size_t(p.ntok) * m.dim * 2);
            }
            uint32_t bad = 0;
            for (int64_t t = 0; t < p.ntok; ++t) bad |= cid[t] >= uint32_t(m.n_centroids) ? 1u : 0u;
            sts[i] = bad ? Status::Corruption(path + ": docs chunk " + std::to_string(w0 + i) + ": centroid id out of range")
                         : !vst.ok() ? vst
                                     : decode_ids(path + ": ids of chunk " + std::to_string(w0 + i), ids_v[i],
                                                  size_t(p.ndocs), d->doc_ids.data() + p.d0);
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
    if (vec_refs) {
        chunk_t0.push_back(next_tok);
        d->vector_files.push_back(
            {0, VectorFileBuilder::Make(vec_path, &vec_file, m.dim, std::move(chunk_t0), std::move(chunk_crc))});
    }
    trace.Mark("chunks");
    // IVF lists: fetched and decoded in parallel, then concatenated.
    {
        std::vector<std::vector<int32_t>> lists(m.n_centroids);
        std::vector<Status> lst(m.n_centroids);
#pragma omp parallel for schedule(dynamic, 64)
        for (int k = 0; k < m.n_centroids; ++k) {
            lst[k] = read_ivf_list(db, path, k, first_doc, first_doc + n_docs, &lists[k]);
            for (int32_t& e : lists[k]) e = static_cast<int32_t>(e - first_doc);  // local ids
        }
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
    TMS_RETURN_IF_ERROR(read_tombstones(db, path, limit, tombstones));
    trace.Mark("tombstones");
    return Status::OK();
}

}  // namespace

}  // namespace tms::index

// Copyright TileMaxSim authors. One store being written: its chunks, vectors, IVF lists and metadata.

#include <fcntl.h>
#include <algorithm>

#include "base/progress.h"
#include "index/store/crc32c.h"
#include "index/store/format.h"
#include "index/store/index_dir.h"
#include "index/store/store_writer.h"
#include "tilemaxsim/version.h"

namespace tms::index {

namespace fs = std::filesystem;

Status StoreWriter::Open(const fs::path& dir, const IndexBuildOptions& o, const IndexModel& m, int64_t first,
                         VectorsAhead* vectors_ahead, size_t store) {
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

Status StoreWriter::write(rocksdb::WriteBatch& b) {
    rocksdb::WriteOptions wo;
    wo.disableWAL = true;  // the whole DB is flushed before it is marked complete
    return from_rocks(db.db->Write(wo, &b), path);
}

Status StoreWriter::spill_ivf() {
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

Status StoreWriter::write_ivf() {
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

Status StoreWriter::flush_chunk() {
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
            if (r.offset + r.bytes > vec_written)
                return Status::Internal(path + ": vectors appended before they were written");
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

Status StoreWriter::WriteVectors(const uint16_t* v, int64_t n_tok) {
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

Status StoreWriter::Append(int64_t len, const uint32_t* tc, const uint8_t* cd, const uint16_t* vec,
                           const std::string& id) {
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

Status StoreWriter::Finish(const nlohmann::json& shard_meta) {
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

}  // namespace tms::index

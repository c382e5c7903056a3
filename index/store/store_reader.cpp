// Copyright TileMaxSim authors. Reading one store: its chunks, vectors, IVF lists and tombstones.

#include <fcntl.h>
#include <omp.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/progress.h"
#include "index/store/db.h"
#include "index/store/file_io.h"
#include "index/store/format.h"
#include "index/store/store_reader.h"
#include "index/store/vectors_file.h"
#include "kernels/cpu/parallel_copy.h"

namespace tms::index {

namespace fs = std::filesystem;

namespace {

// The IVF lists of d's documents from their tokens' centroids: each document once in each list
// of its tokens, ascending (as the stored lists are).
void ivf_from_tokens(IndexData* d, int64_t n_docs) {
    const int K = d->model.n_centroids;
    std::vector<std::pair<uint32_t, int32_t>> pairs;  // (centroid, document), documents ascending
    std::vector<uint32_t> mine;
    for (int64_t doc = 0; doc < n_docs; ++doc) {
        mine.assign(d->token_centroids.begin() + d->doc_offsets[size_t(doc)],
                    d->token_centroids.begin() + d->doc_offsets[size_t(doc) + 1]);
        std::sort(mine.begin(), mine.end());
        mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
        for (uint32_t k : mine) pairs.push_back({k, int32_t(doc)});
    }
    d->ivf_offsets.assign(size_t(K) + 1, 0);
    for (const auto& p : pairs) ++d->ivf_offsets[p.first + 1];
    for (int k = 0; k < K; ++k) d->ivf_offsets[size_t(k) + 1] += d->ivf_offsets[size_t(k)];
    d->ivf_docs.resize(pairs.size());
    std::vector<int64_t> at(d->ivf_offsets.begin(), d->ivf_offsets.end() - 1);
    for (const auto& p : pairs) d->ivf_docs[size_t(at[p.first]++)] = p.second;
}

}  // namespace

// One store's documents (local ids 0..n_docs-1 in `d`; stored as global ids from `first_doc`)
// and its raw tombstones (global ids below `limit`). `d->deleted` and the IVF filtering are the
// caller's (read_shards: a tombstone may live in another shard's store).
Status read_store(Db& db, const std::string& path, VectorLoad vectors, bool progress, int64_t first_doc, int64_t limit,
                  IndexData* d, std::vector<int64_t>* tombstones, const StoreStart& from) {
    nlohmann::json stats;
    TMS_RETURN_IF_ERROR(read_meta(db, path, &d->info, &stats));
    IndexModel& m = d->model;
    const IndexInfo& info = d->info;
    TMS_RETURN_IF_ERROR(read_model(db, path, info, stats, &m));
    TMS_RETURN_IF_ERROR(from_rocks(db.db->GetDbIdentity(d->store_identity), path));
    Trace trace = LoadTrace();
    const bool partial = from.doc > 0 || from.token > 0 || from.chunk > 0;
    if (from.doc < 0 || from.token < 0 || from.chunk < 0 || from.doc > info.n_docs || from.token > info.n_tokens ||
        from.chunk > info.n_chunks) {
        return Status::Corruption(path + ": holds fewer documents than it did when it was read before");
    }
    // The documents read: the store's from `from` on.
    const int64_t n_docs = info.n_docs - from.doc, n_tokens = info.n_tokens - from.token;
    const int ncb = m.n_code_bytes;
    // vec: the vectors are read into d->vectors; vec_refs: their chunks' references are kept
    // (d->vector_files) and nothing is read.
    const bool inline_vectors = info.format_version == kInlineVectorsFormat;
    const bool vec = info.has_vectors &&
                     (vectors == VectorLoad::kMemory || (vectors == VectorLoad::kFileOrMemory && inline_vectors));
    const bool vec_refs =
        info.has_vectors && (vectors == VectorLoad::kFile || (vectors == VectorLoad::kFileOrMemory && !inline_vectors));
    if (vec_refs && partial) return Status::Internal(path + ": part of a store read with its vectors left on disk");
    if (vec_refs && inline_vectors) {
        return Status::NotSupported(
            path + ": this index keeps its vectors inside the store (format " + std::to_string(kInlineVectorsFormat) +
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
        return Status::ResourceExhausted(path + ": not enough host memory to load " + std::to_string(n_tokens) +
                                         " tokens");
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
    for (int64_t w0 = from.chunk; w0 < info.n_chunks; w0 += window) {
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
            if (magic != kChunkMagic || int64_t(first) != first_doc + from.doc + next_doc ||
                next_doc + int64_t(cnt) > n_docs) {
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
                if (vmagic != kVectorRefMagic || !vr.done() ||
                    ref.offset != uint64_t(from.token + next_tok) * m.dim * 2 ||
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
                if (vst.ok() && Crc32(vdst, p.vref.bytes) != p.vref.crc)
                    vst = Status::Corruption(vw + ": checksum mismatch");
            } else if (vec) {
                std::memcpy(vdst, vecs_v[i].data(), size_t(p.ntok) * m.dim * 2);
            }
            uint32_t bad = 0;
            for (int64_t t = 0; t < p.ntok; ++t) bad |= cid[t] >= uint32_t(m.n_centroids) ? 1u : 0u;
            sts[i] =
                bad ? Status::Corruption(path + ": docs chunk " + std::to_string(w0 + i) + ": centroid id out of range")
                : !vst.ok() ? vst
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
    if (vec_refs) {
        chunk_t0.push_back(next_tok);
        d->vector_files.push_back(
            {0, VectorFileBuilder::Make(vec_path, &vec_file, m.dim, std::move(chunk_t0), std::move(chunk_crc))});
    }
    trace.Mark("chunks");
    if (partial) {
        d->info.n_docs = n_docs;
        d->info.n_tokens = n_tokens;
        d->info.n_chunks -= from.chunk;
        ivf_from_tokens(d, n_docs);
    } else {  // IVF lists: fetched and decoded in parallel, then concatenated.
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

}  // namespace tms::index

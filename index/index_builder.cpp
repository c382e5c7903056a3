// Copyright TileMaxSim authors. The public IndexBuilder: streaming build in bounded memory.
// Inputs are memory-mapped (.npy files, a directory of shards, or safetensors); training
// reads a sample; documents are then encoded and written chunk by chunk, so peak memory is
// the sample, one chunk of codes (and vectors), and the IVF lists.
#include "tilemaxsim/index_builder.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/memory.h"
#include "base/progress.h"
#include "index/build_metadata.h"
#include "index/encode/encoder.h"
#include "index/index_data.h"
#include "index/ingest/input_checks.h"
#include "index/ingest/npy.h"
#include "index/ingest/metadata_jsonl.h"
#include "index/ingest/pool.h"
#include "index/metadata/metadata.h"
#include "index/store/index_dir.h"
#include "index/store/index_reader.h"
#include "index/store/index_writer.h"
#include "index/store/shards.h"
#include "index/train/train.h"
#include "kernels/nearest.h"
#include "kernels/threads.h"
#include "index/ingest/files.h"
#include "index/ingest/npy.h"

namespace fs = std::filesystem;

namespace tms {
namespace {

// The streaming build over one or more shards (documents never straddle shards), named in
// messages by `names`. `release(shard, rows)`: the first `rows` rows of a shard are done with
// (drop their pages); `restart()`: a new pass over the input begins.
using index::ReleaseFn;

Status build_streaming(const std::vector<EmbeddingView>& shards, const std::vector<std::vector<int64_t>>& shard_lens,
                       const std::vector<std::string>& names, std::vector<std::string> ids,
                       const IndexBuildOptions& opts, const std::string& path, BuildStats* stats, BuildGroup* group,
                       const DocMetadata* metadata, const ReleaseFn& release = nullptr,
                       const std::function<void()>& restart = nullptr, bool pooled = false) {
    std::vector<int64_t> all_lens;
    int64_t rows = 0;
    for (size_t s = 0; s < shards.size(); ++s) {
        all_lens.insert(all_lens.end(), shard_lens[s].begin(), shard_lens[s].end());
        rows += shards[s].rows;
    }
    const EmbeddingView whole{nullptr, shards.empty() ? DType::kF32 : shards[0].dtype, rows,
                              shards.empty() ? 0 : shards[0].dim};
    TMS_RETURN_IF_ERROR(index::ValidateInput(whole, all_lens, &ids));
    // Token pooling: the input's documents pooled into memory (1/pool_factor of its tokens, fp16),
    // and the index built from them (a stream, IndexStreamBuilder, pools batch by batch instead).
    if (opts.pool_factor > 1 && !pooled) {
        std::vector<uint16_t> tokens;
        std::vector<int64_t> lens;
        for (size_t s = 0; s < shards.size(); ++s) {
            TMS_RETURN_IF_ERROR(index::CheckValues(shards[s], names[s]));
            std::vector<uint16_t> t;
            std::vector<int64_t> l;
            TMS_RETURN_IF_ERROR(index::PoolDocuments(shards[s], shard_lens[s], opts.pool_factor, &t, &l));
            tokens.insert(tokens.end(), t.begin(), t.end());
            lens.insert(lens.end(), l.begin(), l.end());
            if (release) release(s, shards[s].rows);
        }
        const EmbeddingView v{tokens.data(), DType::kF16, int64_t(tokens.size()) / whole.dim, whole.dim};
        return build_streaming({v}, {lens}, {"docs"}, std::move(ids), opts, path, stats, group, metadata, nullptr,
                               nullptr, true);
    }
    // A distributed build: every step that can fail on one rank ends in an agreement, so that
    // every rank fails together (and rank 0's build directory is removed).
    const bool parted = group && group->size() > 1;
    const int rank = parted ? group->rank() : 0;
    const auto agree = [&](const Status& st) { return parted ? group->Agree(st) : st; };
    // The metadata is checked before anything is trained; rank 0 writes it.
    index::MetaRows meta_rows;
    if (metadata) {
        TMS_RETURN_IF_ERROR(agree(rank == 0 ? index::ResolveMetadata(*metadata, ids, {}, &meta_rows) : Status::OK()));
    }
    // The text field: a metadata field of text values.
    TMS_RETURN_IF_ERROR(agree([&]() -> Status {
        if (rank != 0) return Status::OK();
        TMS_RETURN_IF_ERROR(index::CheckTextField(opts, metadata ? &meta_rows.columns : nullptr));
        return metadata ? index::CheckSpans(opts.spans_field, opts.text_field, meta_rows.columns, meta_rows.cells,
                                            all_lens, ids, metadata->source)
                        : Status::OK();
    }()));
    // Training runs BLAS products on every thread, beside its samples and score blocks.
    const int threads = opts.threads > 0 ? opts.threads : omp_get_max_threads();
    TMS_RETURN_IF_ERROR(agree(kernels::check_blas_room(threads, int64_t(128) << 20, path)));
    std::vector<std::pair<std::string, double>> phases;
    const std::vector<int64_t> shard_docs = index::SplitShards(all_lens, index::ResolveShardCount(opts.shards, rows));
    std::unique_ptr<index::IndexWriter> writer;
    // The fp16 vectors, the bulk of the bytes, do not depend on the model: a whole build writes
    // them while k-means trains (a distributed one as it encodes). The input pages they are read
    // from stay mapped until the encoder has passed them too (release_done below).
    const bool ahead = opts.keep_vectors && !parted;
    if (ahead) {
        TMS_RETURN_IF_ERROR(index::IndexWriter::Begin(path, opts, &writer, nullptr, shard_docs));
        std::vector<int64_t> row0(1, 0);
        for (const auto& v : shards) row0.push_back(row0.back() + v.rows);
        const long page = ::sysconf(_SC_PAGESIZE);
        auto source = [&shards, row0, page](int64_t t0, int64_t n, std::vector<uint16_t>* buf) -> const uint16_t* {
            const auto shard_of = [&](int64_t t) {
                return size_t(std::upper_bound(row0.begin(), row0.end(), t) - row0.begin()) - 1;
            };
            const int64_t dim = shards[0].dim;
            size_t s = shard_of(t0);
            if (shards[s].dtype == DType::kF16 && t0 + n <= row0[s + 1]) {
                const uint16_t* p = static_cast<const uint16_t*>(shards[s].data) + (t0 - row0[s]) * dim;
                // Read ahead even where sampling asked the mapping for random access.
                const uintptr_t a = reinterpret_cast<uintptr_t>(p) / uintptr_t(page) * uintptr_t(page);
                (void)::madvise(reinterpret_cast<void*>(a), reinterpret_cast<uintptr_t>(p + n * dim) - a,
                                MADV_WILLNEED);
                return p;
            }
            buf->resize(size_t(n * dim));
            for (int64_t t = t0; t < t0 + n;) {
                s = shard_of(t);
                const int64_t m = std::min(t0 + n, row0[s + 1]) - t;
                index::ToHalf(shards[s], t - row0[s], m, buf->data() + (t - t0) * dim, false);
                t += m;
            }
            return buf->data();
        };
        // A quarter of the available memory ahead of the encoder: the whole input wherever it
        // fits in the page cache beside the build.
        const int64_t lead = std::max<int64_t>(int64_t(256) << 20, HostAvailableMemory() / 4);
        TMS_RETURN_IF_ERROR(writer->WriteVectorsAhead(all_lens, whole.dim, lead, source));
    }
    index::IndexModel model;
    TMS_RETURN_IF_ERROR(
        agree(rank == 0 ? index::TrainModel(shards, opts, &model, &phases, &names, release) : Status::OK()));
    if (parted) {
        std::string bytes = rank == 0 ? index::ModelToBytes(model) : std::string();
        TMS_RETURN_IF_ERROR(group->Broadcast(&bytes));
        if (rank != 0)
            TMS_RETURN_IF_ERROR(agree(index::ModelFromBytes(bytes, &model)));
        else
            TMS_RETURN_IF_ERROR(agree(Status::OK()));
    }
    if (release) {  // the sample touched pages all over the input
        for (size_t s = 0; s < shards.size(); ++s) release(s, shards[s].rows);
    }
    if (restart) restart();
    auto t0 = std::chrono::steady_clock::now();
    index::WriterPart part;
    if (ahead) {
        TMS_RETURN_IF_ERROR(writer->SetModel(model));
    } else if (parted) {
        part.rank = rank;
        part.size = group->size();
        // Rank 0 makes the build directory, then the others join it.
        TMS_RETURN_IF_ERROR(
            agree(rank == 0 ? index::IndexWriter::Create(path, opts, model, &writer, nullptr, shard_docs, &part)
                            : Status::OK()));
        part.dir = rank == 0 ? writer->build_dir() : std::string();
        TMS_RETURN_IF_ERROR(group->Broadcast(&part.dir));
        TMS_RETURN_IF_ERROR(
            agree(rank != 0 ? index::IndexWriter::Create(path, opts, model, &writer, nullptr, shard_docs, &part)
                            : Status::OK()));
    } else {
        TMS_RETURN_IF_ERROR(index::IndexWriter::Create(path, opts, model, &writer, nullptr, shard_docs));
    }
    // The documents this rank writes: every one, or its shards' ([first, end) each).
    std::vector<int64_t> shard_first(1, 0);
    for (int64_t c : shard_docs) shard_first.push_back(shard_first.back() + c);
    shard_first.back() = int64_t(all_lens.size());
    const auto mine = [&](size_t sh) { return !parted || int(sh % size_t(part.size)) == rank; };
    int64_t my_rows = 0;
    for (size_t sh = 0; sh + 1 < shard_first.size(); ++sh) {
        if (!mine(sh)) continue;
        for (int64_t d = shard_first[sh]; d < shard_first[sh + 1]; ++d) my_rows += all_lens[size_t(d)];
    }
    // On another index's centroids (centroids_from): where it holds these very documents, its
    // tokens' assignments are this build's (no nearest-centroid search per token).
    std::vector<uint32_t> known;
    if (!opts.centroids_from.empty() && !parted) {
        const auto k0 = std::chrono::steady_clock::now();
        index::ReadKnownAssignments(opts.centroids_from, model, all_lens, &known);
        if (!known.empty()) phases.emplace_back("known_assignments", SecondsSince(k0));
    }
    double encode_s = 0, wait_s = 0;  // main thread: encoding, and blocked on the writer
    const Status encoded = [&]() -> Status {
        std::unique_ptr<index::Encoder> enc;
        TMS_RETURN_IF_ERROR(index::Encoder::Create(model, opts.device, opts.gpu, &enc));
        // Two chunk buffers: the writer appends chunk k (RocksDB, IVF lists) on its own thread
        // while chunk k + 1 is encoded (declared in this order so that the writer is joined first).
        struct ChunkBuf {
            std::vector<uint32_t> cids;
            std::vector<uint8_t> codes;
            std::vector<uint16_t> vecs;
        } bufs[2];
        std::future<Status> appending;
        auto wait_writer = [&]() {
            const auto w0 = std::chrono::steady_clock::now();
            Status st = appending.valid() ? appending.get() : Status::OK();
            wait_s += SecondsSince(w0);
            return st;
        };
        const int dim = whole.dim;
        // Documents per Encode call: whole chunks, about 1M tokens (fewer GPU pipeline drains),
        // the two buffers at most ~64 MB each.
        const int64_t chunk = std::max(1, opts.chunk_docs);
        // fp16 input is written to the vectors file straight from its mapping; other types are
        // converted into the chunk buffer (unless written ahead).
        bool convert_vectors = false;
        for (const auto& v : shards)
            convert_vectors = convert_vectors || (opts.keep_vectors && !ahead && v.dtype != DType::kF16);
        const int64_t token_bytes = 4 + model.n_code_bytes + (convert_vectors ? 2 * dim : 0);
        const int64_t want_tokens = std::min<int64_t>(int64_t(1) << 20, (int64_t(64) << 20) / token_bytes);
        const double avg_len = double(rows) / double(std::max<size_t>(1, all_lens.size()));
        const int64_t group_docs =
            chunk * std::max<int64_t>(1, static_cast<int64_t>(want_tokens / (avg_len * double(chunk))));
        Progress prog("encoding", my_rows, opts.progress, " tok");
        // Input pages are released once the writer is done with them (it reads fp16 vectors
        // from the input): a chunk's after the next chunk's wait_writer (release(s, rows) again
        // for rows already released is a no-op).
        std::vector<int64_t> release_upto(shards.size(), 0);
        auto release_done = [&] {
            for (size_t s = 0; release && s < shards.size(); ++s) {
                if (release_upto[s] > 0) release(s, release_upto[s]);
            }
        };
        size_t doc = 0;  // global document of the input shard's first, then of d0
        int64_t shard_row0 = 0;  // global row of the input shard's first token
        int k = 0;
        for (size_t s = 0; s < shards.size(); ++s) {
            const auto& lens = shard_lens[s];
            int64_t row = 0;
            for (size_t d0 = 0; d0 < lens.size();) {
                // A group never straddles index shards: it is all this rank's, or skipped.
                const size_t g0 = doc + d0;
                const size_t sh = size_t(std::upper_bound(shard_first.begin(), shard_first.end(), int64_t(g0)) -
                                         shard_first.begin()) -
                                  1;
                const size_t d1 = std::min({lens.size(), size_t(d0 + group_docs), size_t(shard_first[sh + 1]) - doc});
                int64_t n = 0;
                for (size_t d = d0; d < d1; ++d) n += lens[d];
                if (!mine(sh)) {
                    row += n;
                    release_upto[s] = row;
                    d0 = d1;
                    continue;
                }
                ChunkBuf& b = bufs[k++ % 2];  // the other one may still be appending
                try {
                    b.cids.resize(n);
                    b.codes.resize(size_t(n) * model.n_code_bytes);
                    if (convert_vectors) b.vecs.resize(size_t(n) * dim);
                } catch (const std::bad_alloc&) {
                    (void)wait_writer();
                    return Status::ResourceExhausted("out of host memory encoding a chunk");
                }
                const auto e0 = std::chrono::steady_clock::now();
                Status st = enc->Encode(shards[s], row, n, b.cids.data(), b.codes.data(),
                                        known.empty() ? nullptr : known.data() + shard_row0 + row);
                encode_s += SecondsSince(e0);
                if (!st.ok() && st.message().rfind("docs:", 0) == 0)
                    st = Status(st.code(), names[s] + st.message().substr(4));
                const uint16_t* vecs = nullptr;
                if (st.ok() && opts.keep_vectors && !ahead) {
                    if (shards[s].dtype == DType::kF16) {
                        vecs = static_cast<const uint16_t*>(shards[s].data) + size_t(row) * dim;
                    } else {
                        index::ToHalf(shards[s], row, n, b.vecs.data());
                        vecs = b.vecs.data();
                    }
                }
                const Status wst = wait_writer();  // chunk k - 1, which used the other buffer
                release_done();
                TMS_RETURN_IF_ERROR(st);
                TMS_RETURN_IF_ERROR(wst);
                appending = std::async(std::launch::async, [&writer, &b, &lens, &ids, d0, d1, g0, vecs]() {
                    try {
                        return writer->AppendDocs(lens.data() + d0, int64_t(d1 - d0), b.cids.data(), b.codes.data(),
                                                  vecs, ids.data() + g0);
                    } catch (const std::bad_alloc&) {
                        return Status::ResourceExhausted("out of host memory writing the index");
                    } catch (const std::exception& e) {
                        return Status::Internal(std::string("writing the index: ") + e.what());
                    }
                });
                row += n;
                release_upto[s] = row;
                prog.Add(n);
                d0 = d1;
            }
            doc += lens.size();
            shard_row0 += shards[s].rows;
        }
        TMS_RETURN_IF_ERROR(wait_writer());
        release_done();
        prog.Done();
        return Status::OK();
    }();
    phases.emplace_back("encode+write", SecondsSince(t0));
    phases.emplace_back("encode+write.encoding", encode_s);
    phases.emplace_back("encode+write.writer_wait", wait_s);
    t0 = std::chrono::steady_clock::now();
    IndexInfo info;
    index::FillInfo(model, static_cast<int64_t>(all_lens.size()), rows, opts, &info);
    TMS_RETURN_IF_ERROR(agree(encoded.ok() ? writer->FinishShards() : encoded));
    if (ahead) phases.emplace_back("vectors_ahead", writer->vectors_ahead_seconds());
    // Every rank's shards are done: rank 0 writes the metadata and the manifest into the build
    // directory and puts the index in place (with its metadata, or none).
    const auto complete = [&]() -> Status {
        if (metadata) {
            TMS_RETURN_IF_ERROR(
                index::WriteBuildMetadata(writer->build_dir(), meta_rows.columns, ids, meta_rows.cells, opts));
        }
        return writer->Complete();
    };
    TMS_RETURN_IF_ERROR(agree(rank == 0 ? complete() : Status::OK()));
    phases.emplace_back("finish", SecondsSince(t0));
    if (stats) {
        index::FillBuildStats(info, stats);
        stats->phase_seconds.insert(stats->phase_seconds.end(), phases.begin(), phases.end());
    }
    return Status::OK();
}

// A memory-mapped input: its views point into the mappings it owns.
struct Inputs {
    std::vector<std::unique_ptr<index::MappedNpy>> maps;  // one per shard
    std::vector<EmbeddingView> shards;
    std::vector<std::string> names;  // file names, for messages
    std::vector<int64_t> released;   // rows released so far in the current pass, per shard
    std::vector<std::vector<int64_t>> lens;
};

Status add_npy_pair(const std::string& docs, const std::string& doclens, Inputs* in) {
    std::unique_ptr<index::MappedNpy> m;
    TMS_RETURN_IF_ERROR(index::MappedNpy::Open(docs, &m));
    EmbeddingView v;
    // Values are checked for finiteness as they are encoded (no extra pass over the input).
    TMS_RETURN_IF_ERROR(index::EmbeddingsFromRaw(m->header(), m->data(), 2, docs, &v, false));
    if (!in->shards.empty() && (v.dim != in->shards[0].dim || v.dtype != in->shards[0].dtype)) {
        return Status::InvalidArgument(docs + ": " + DTypeName(v.dtype) + " dim " + std::to_string(v.dim) +
                                       " differs from the first shard's " + DTypeName(in->shards[0].dtype) + " dim " +
                                       std::to_string(in->shards[0].dim));
    }
    HostArray lens;
    TMS_RETURN_IF_ERROR(LoadNpy(doclens, &lens));
    std::vector<int64_t> l;
    TMS_RETURN_IF_ERROR(IntegersFromArray(lens, doclens, &l));
    TMS_RETURN_IF_ERROR(index::CheckDocLens(l, v.rows, doclens, docs));
    in->maps.push_back(std::move(m));
    in->shards.push_back(v);
    in->names.push_back(docs);
    in->lens.push_back(std::move(l));
    return Status::OK();
}

// DIR/docs_*.npy with DIR/doclens_*.npy (same suffix), in name order.
Status add_shard_dir(const std::string& dir, Inputs* in) {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
        const std::string n = e.path().filename().string();
        if (n.rfind("docs_", 0) == 0 && e.path().extension() == ".npy") names.push_back(n);
    }
    if (ec) return Status::IOError(dir + ": " + ec.message());
    if (names.empty()) return Status::InvalidArgument(dir + ": no docs_*.npy shards in this directory");
    std::sort(names.begin(), names.end());
    for (const auto& n : names) {
        const std::string lens = (fs::path(dir) / ("doclens_" + n.substr(5))).string();
        if (!fs::exists(lens, ec)) return Status::InvalidArgument(lens + ": missing (shard " + n + " has no doclens)");
        TMS_RETURN_IF_ERROR(add_npy_pair((fs::path(dir) / n).string(), lens, in));
    }
    return Status::OK();
}

// safetensors: tensors "embeddings" (or "docs") F16/BF16/F32 [n_tokens, dim] and "doclens" I32/I64 [n_docs].
Status add_safetensors(const std::string& path, Inputs* in) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return Status::NotFound(path + ": no such file");
    std::error_code ec;
    const int64_t size = static_cast<int64_t>(fs::file_size(path, ec));
    uint64_t n = 0;
    unsigned char b[8];
    if (!f.read(reinterpret_cast<char*>(b), 8))
        return Status::InvalidArgument(path + ": not a safetensors file (too short)");
    for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
    if (n > 100000000 || int64_t(8 + n) > size)
        return Status::InvalidArgument(path + ": not a safetensors file (bad header length)");
    std::string header(n, '\0');
    f.read(header.data(), static_cast<std::streamsize>(n));
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(header);
    } catch (const std::exception& e) {
        return Status::InvalidArgument(path + ": bad safetensors header: " + e.what());
    }
    const int64_t base = 8 + static_cast<int64_t>(n);
    auto tensor = [&](const std::vector<std::string>& names, std::string* dtype, std::vector<int64_t>* shape,
                      int64_t* b0, int64_t* b1) -> Status {
        for (const auto& name : names) {
            if (!j.contains(name)) continue;
            // Integers only, each below 2^62: nlohmann converts 5724.0 or 2^63 + 5 to int64 silently.
            const auto uint_of = [&](const nlohmann::json& v, int64_t* out) {
                if (!v.is_number_unsigned() || v.get<uint64_t>() > (uint64_t(1) << 62)) return false;
                *out = static_cast<int64_t>(v.get<uint64_t>());
                return true;
            };
            const std::string what = path + ": tensor '" + name + "'";
            int64_t o0 = 0, o1 = 0;
            try {
                const auto& t = j.at(name);
                *dtype = t.at("dtype").get<std::string>();
                shape->clear();
                for (const auto& v : t.at("shape")) {
                    int64_t d = 0;
                    if (!uint_of(v, &d))
                        return Status::InvalidArgument(what + ": shape entries must be non-negative integers");
                    shape->push_back(d);
                }
                const auto& offs = t.at("data_offsets");
                if (offs.size() != 2 || !uint_of(offs[0], &o0) || !uint_of(offs[1], &o1)) {
                    return Status::InvalidArgument(what + ": data_offsets must be two non-negative integers");
                }
            } catch (const std::exception& e) {
                return Status::InvalidArgument(what + ": " + e.what());
            }
            TMS_RETURN_IF_ERROR(index::CheckShape(*shape, 8, what));
            *b0 = o0 + base;
            *b1 = o1 + base;
            if (*b1 < *b0 || *b1 > size) return Status::InvalidArgument(what + " outside the file");
            return Status::OK();
        }
        return Status::InvalidArgument(path + ": no tensor named '" + names[0] + "'");
    };
    std::string dt, lt;
    std::vector<int64_t> ds, ls;
    int64_t d0, d1, l0, l1;
    TMS_RETURN_IF_ERROR(tensor({"embeddings", "docs"}, &dt, &ds, &d0, &d1));
    TMS_RETURN_IF_ERROR(tensor({"doclens"}, &lt, &ls, &l0, &l1));
    HostArray dh;
    dh.shape = ds;
    if (dt == "F16")
        dh.descr = "<f2";
    else if (dt == "BF16")
        dh.descr = "<V2";
    else if (dt == "F32")
        dh.descr = "<f4";
    else
        return Status::InvalidArgument(path + ": embeddings dtype " + dt + " not supported (F16, BF16 or F32)");
    const int64_t esize = dt == "F32" ? 4 : 2;
    if ((d1 - d0) != dh.numel() * esize)
        return Status::InvalidArgument(path + ": embeddings size does not match its shape");
    HostArray lh;
    lh.shape = ls;
    if (lt == "I32")
        lh.descr = "<i4";
    else if (lt == "I64")
        lh.descr = "<i8";
    else
        return Status::InvalidArgument(path + ": doclens dtype " + lt + " not supported (I32 or I64)");
    if ((l1 - l0) != lh.numel() * (lt == "I32" ? 4 : 8))
        return Status::InvalidArgument(path + ": doclens size does not match its shape");
    lh.bytes.resize(l1 - l0);
    f.seekg(l0);
    f.read(reinterpret_cast<char*>(lh.bytes.data()), l1 - l0);
    std::vector<int64_t> l;
    TMS_RETURN_IF_ERROR(IntegersFromArray(lh, path + " (doclens)", &l));
    // Embeddings: memory-mapped like .npy input (the mapping starts at the file's first page).
    if (d0 % esize != 0) {
        return Status::InvalidArgument(path + ": embeddings are not aligned to their element size in the file");
    }
    std::unique_ptr<index::MappedNpy> m;
    TMS_RETURN_IF_ERROR(index::MappedNpy::OpenRange(path, size_t(d0), size_t(d1 - d0), dh, &m));
    EmbeddingView v;
    TMS_RETURN_IF_ERROR(index::EmbeddingsFromRaw(m->header(), m->data(), 2, path + " (embeddings)", &v, false));
    TMS_RETURN_IF_ERROR(index::CheckDocLens(l, v.rows, path + " (doclens)", path + " (embeddings)"));
    in->maps.push_back(std::move(m));
    in->shards.push_back(v);
    in->names.push_back(path + " (embeddings)");
    in->lens.push_back(std::move(l));
    return Status::OK();
}

}  // namespace

IndexBuilder::IndexBuilder(IndexBuildOptions opts, std::string path) : opts_(std::move(opts)), path_(std::move(path)) {}
IndexBuilder::~IndexBuilder() = default;

Status IndexBuilder::Create(const IndexBuildOptions& opts, const std::string& path,
                            std::unique_ptr<IndexBuilder>* out) {
    if (path.empty()) return Status::InvalidArgument("index path is empty");
    TMS_RETURN_IF_ERROR(ValidateBuildOptions(opts));
    // Refuse before training, not after it, when the index to replace is being written (the
    // writer lock itself is taken when the new copy is created).
    fs::path target;
    TMS_RETURN_IF_ERROR(index::ResolveTargetPath(path, &target));
    TMS_RETURN_IF_ERROR(CheckOutputPath(path, OutputKind::kIndex));  // never inside another index
    if (opts.overwrite && index::WriterActive(target)) return index::WriterBusyError(target);
    out->reset(new IndexBuilder(opts, path));
    return Status::OK();
}

Status IndexBuilder::Build(const EmbeddingView& tokens, const std::vector<int64_t>& doclens,
                           const std::vector<std::string>& doc_ids, BuildStats* stats, const DocMetadata* metadata) {
    kernels::SetThreads(opts_.threads);
    const auto t0 = std::chrono::steady_clock::now();
    Status st = build_streaming({tokens}, {doclens}, {"docs"}, doc_ids, opts_, path_, stats, group_, metadata);
    if (stats) stats->seconds_total += SecondsSince(t0);
    return st;
}

Status IndexBuilder::BuildFromFiles(const std::string& docs, const std::string& doclens, const std::string& doc_ids_txt,
                                    BuildStats* stats, const DocMetadata* metadata) {
    kernels::SetThreads(opts_.threads);
    // Replacing the index would delete inputs that lie inside it.
    TMS_RETURN_IF_ERROR(
        CheckOutputPath(path_, OutputKind::kIndex, {{"docs", docs}, {"doclens", doclens}, {"doc ids", doc_ids_txt}}));
    const auto t0 = std::chrono::steady_clock::now();
    Inputs in;
    std::vector<std::string> ids;
    const Status loaded = [&]() -> Status {
        std::error_code ec;
        if (fs::is_directory(docs, ec)) {
            TMS_RETURN_IF_ERROR(add_shard_dir(docs, &in));
        } else if (docs.size() > 12 && docs.substr(docs.size() - 12) == ".safetensors") {
            TMS_RETURN_IF_ERROR(add_safetensors(docs, &in));
        } else {
            if (doclens.empty()) return Status::InvalidArgument(docs + ": --doclens is required with a .npy file");
            TMS_RETURN_IF_ERROR(add_npy_pair(docs, doclens, &in));
        }
        size_t n_docs = 0;
        for (const auto& l : in.lens) n_docs += l.size();
        if (!doc_ids_txt.empty()) {
            TMS_RETURN_IF_ERROR(ReadLines(doc_ids_txt, &ids));
            if (ids.size() != n_docs) {
                return Status::InvalidArgument(doc_ids_txt + ": " + std::to_string(ids.size()) + " ids for " +
                                               std::to_string(n_docs) + " documents");
            }
        }
        return Status::OK();
    }();
    // Every rank of a distributed build reads the input: one that cannot fails them all.
    TMS_RETURN_IF_ERROR(group_ && group_->size() > 1 ? group_->Agree(loaded) : loaded);
    if (stats) stats->phase_seconds.emplace_back("load", SecondsSince(t0));
    // Sampling reads scattered rows: no readahead or fault-around while it runs.
    for (auto& m : in.maps) m->Advise(true);
    in.released.assign(in.maps.size(), 0);
    auto release = [&in](size_t shard, int64_t rows) {
        if (shard >= in.maps.size() || rows <= in.released[shard]) return;
        const EmbeddingView& v = in.shards[shard];
        const size_t row_bytes = size_t(v.dim) * DTypeSize(v.dtype);
        in.maps[shard]->Release(size_t(in.released[shard]) * row_bytes, size_t(rows) * row_bytes);
        in.released[shard] = rows;
    };
    auto restart = [&in]() {
        in.released.assign(in.maps.size(), 0);
        for (auto& m : in.maps) m->Advise(false);
    };
    Status st =
        build_streaming(in.shards, in.lens, in.names, ids, opts_, path_, stats, group_, metadata, release, restart);
    if (stats) stats->seconds_total += SecondsSince(t0);
    if (!st.ok() && st.message().rfind("doc-ids:", 0) == 0 && !doc_ids_txt.empty()) {
        return Status(st.code(), doc_ids_txt + st.message().substr(7));
    }
    return st;
}

Status ReadIndexInfo(const std::string& path, IndexInfo* info) { return index::ReadIndexInfo(path, info); }
Status ReadIndexShardCount(const std::string& path, int* n_shards) { return index::ReadShardCount(path, n_shards); }

}  // namespace tms

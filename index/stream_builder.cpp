// Copyright TileMaxSim authors. IndexStreamBuilder: an index built from documents as they come.
// The first documents are held (fp16) until they fill the training sample; the model trains on
// them; from then on documents are gathered into groups of about 1M tokens, each encoded while
// the writer appends the one before (two groups, as IndexBuilder's chunk buffers).
#include <algorithm>
#include <chrono>
#include <functional>
#include <future>
#include <omp.h>
#include <string_view>
#include <unordered_set>

#include "base/progress.h"
#include "index/build_metadata.h"
#include "index/encode/encoder.h"
#include "index/ingest/input_checks.h"
#include "index/ingest/metadata_jsonl.h"
#include "index/ingest/pool.h"
#include "index/model.h"
#include "index/store/index_writer.h"
#include "index/store/shards.h"
#include "index/train/train.h"
#include "kernels/nearest.h"
#include "kernels/threads.h"
#include "tilemaxsim/index_builder.h"

namespace tms {

namespace {

// Documents gathered for one Encode + AppendDocs: their fp16 tokens, lengths, ids, and codes.
struct StreamGroup {
    std::vector<uint16_t> tokens;  // [n_tokens, dim]
    std::vector<int64_t> lens;
    std::vector<std::string> ids;
    std::vector<uint32_t> cids;
    std::vector<uint8_t> codes;
    int64_t rows(int dim) const { return int64_t(tokens.size()) / dim; }
    // Emptied for the next documents; the held sample's buffers (far larger than a group) are
    // given back.
    void clear(size_t group_values) {
        tokens.clear();
        lens.clear();
        ids.clear();
        if (tokens.capacity() > 2 * group_values) {
            tokens.shrink_to_fit();
            cids = {};
            codes = {};
        }
    }
};

}  // namespace

struct IndexStreamBuilder::Impl {
    IndexBuildOptions opts;
    std::string path;
    int64_t expected = 0;  // the corpus's tokens, as the caller estimates them (0: unknown)
    int dim = 0;
    int64_t docs = 0, tokens = 0, batches = 0;
    bool failed = false, finished = false;
    // Every id (the metadata's rows) and their hashes (duplicates; a hash seen before is checked
    // against the ids themselves).
    std::vector<std::string> ids;
    std::unordered_set<uint64_t> id_hashes;
    // Metadata: the columns as they first appeared, and a row per document once any batch had some.
    std::vector<MetaColumn> columns;
    std::vector<index::MetaCells> cells;
    bool has_metadata = false;
    // The group being gathered is groups[k % 2]; the other may be appending.
    StreamGroup groups[2];
    int k = 0;
    std::future<Status> appending;
    int64_t group_tokens = int64_t(1) << 20;  // tokens per group once trained
    bool trained = false;
    index::IndexModel model;
    std::unique_ptr<index::IndexWriter> writer;
    std::unique_ptr<index::Encoder> enc;
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    std::vector<std::pair<std::string, double>> phases;
    double encode_s = 0, wait_s = 0;
    std::unique_ptr<Progress> progress;

    StreamGroup& gathering() { return groups[k % 2]; }
    std::string batch_name() const { return "batch " + std::to_string(batches) + ": "; }

    // The batch's ids (numbered on when none): valid, unique in the batch and the stream.
    Status check_ids(std::vector<std::string>* batch_ids, size_t n) const {
        if (batch_ids->empty()) {
            batch_ids->resize(n);
            for (size_t i = 0; i < n; ++i) (*batch_ids)[i] = std::to_string(docs + int64_t(i));
        }
        if (batch_ids->size() != n) {
            return Status::InvalidArgument(batch_name() + std::to_string(batch_ids->size()) + " ids for " +
                                           std::to_string(n) + " documents");
        }
        std::unordered_set<std::string_view> batch;
        batch.reserve(n);
        for (size_t i = 0; i < n; ++i) {
            const std::string& id = (*batch_ids)[i];
            TMS_RETURN_IF_ERROR(index::CheckId(id, batch_name() + "id " + std::to_string(i)));
            // A hash seen before is a duplicate or (rarely) a collision: the ids tell.
            const bool dup = !batch.insert(id).second || (id_hashes.count(std::hash<std::string_view>()(id)) &&
                                                          std::find(ids.begin(), ids.end(), id) != ids.end());
            if (dup) return Status::InvalidArgument(batch_name() + "duplicate id '" + id + "'");
        }
        return Status::OK();
    }

    // The batch's tokens (checked) into the gathering group as fp16.
    Status gather(const EmbeddingView& t, const std::vector<int64_t>& lens, std::vector<std::string>* batch_ids) {
        StreamGroup& g = gathering();
        const size_t at = g.tokens.size();
        try {
            g.tokens.resize(at + size_t(t.rows) * size_t(dim));
        } catch (const std::bad_alloc&) {
            return Status::ResourceExhausted("out of host memory gathering a batch of the stream");
        }
        index::ToHalf(t, 0, t.rows, g.tokens.data() + at);
        g.lens.insert(g.lens.end(), lens.begin(), lens.end());
        for (auto& id : *batch_ids) g.ids.push_back(id);
        return Status::OK();
    }

    Status wait_writer() {
        const auto w0 = std::chrono::steady_clock::now();
        Status st = appending.valid() ? appending.get() : Status::OK();
        wait_s += SecondsSince(w0);
        return st;
    }

    // Encodes the gathering group and hands it to the writer's thread; the next group gathers
    // in the other buffer once the writer is done with it.
    Status flush() {
        StreamGroup& g = gathering();
        if (g.lens.empty()) return Status::OK();
        const int64_t n = g.rows(dim);
        try {
            g.cids.resize(size_t(n));
            g.codes.resize(size_t(n) * size_t(model.n_code_bytes));
        } catch (const std::bad_alloc&) {
            return Status::ResourceExhausted("out of host memory encoding a group of the stream");
        }
        const auto e0 = std::chrono::steady_clock::now();
        const Status st =
            enc->Encode(EmbeddingView{g.tokens.data(), DType::kF16, n, dim}, 0, n, g.cids.data(), g.codes.data());
        encode_s += SecondsSince(e0);
        TMS_RETURN_IF_ERROR(wait_writer());
        TMS_RETURN_IF_ERROR(st);
        const bool vecs = opts.keep_vectors;
        appending = std::async(std::launch::async, [w = writer.get(), &g, vecs]() {
            try {
                return w->AppendDocs(g.lens.data(), int64_t(g.lens.size()), g.cids.data(), g.codes.data(),
                                     vecs ? g.tokens.data() : nullptr, g.ids.data());
            } catch (const std::bad_alloc&) {
                return Status::ResourceExhausted("out of host memory writing the index");
            } catch (const std::exception& e) {
                return Status::Internal(std::string("writing the index: ") + e.what());
            }
        });
        if (progress) progress->Add(n);
        // The other group gathers next: its append was waited for above.
        ++k;
        gathering().clear(size_t(group_tokens) * size_t(dim));
        return Status::OK();
    }

    // Trains on the held documents (the first group) and opens the writer's stores and the
    // encoder; `n_tokens` sizes the centroids and the shards.
    Status train(int64_t n_tokens) {
        const auto t0 = std::chrono::steady_clock::now();
        StreamGroup& held = gathering();
        IndexBuildOptions o = opts;
        const int64_t most = o.max_train_tokens > 0 ? std::min(n_tokens, o.max_train_tokens) : n_tokens;
        if (o.n_centroids <= 0) o.n_centroids = index::AutoCentroids(n_tokens, most);
        const int64_t rows = held.rows(dim);
        TMS_RETURN_IF_ERROR(
            index::TrainModel({EmbeddingView{held.tokens.data(), DType::kF16, rows, dim}}, o, &model, &phases));
        const int shards = index::ResolveShardCount(opts.shards, n_tokens);
        if (shards > 1) TMS_RETURN_IF_ERROR(writer->SetShardTokens((n_tokens + shards - 1) / shards));
        TMS_RETURN_IF_ERROR(writer->SetModel(model));
        TMS_RETURN_IF_ERROR(index::Encoder::Create(model, opts.device, opts.gpu, &enc));
        const int64_t token_bytes = 4 + model.n_code_bytes + 2 * int64_t(dim);
        group_tokens = std::min<int64_t>(int64_t(1) << 20, (int64_t(256) << 20) / token_bytes);
        trained = true;
        phases.emplace_back("stream.train", SecondsSince(t0));
        progress = std::make_unique<Progress>("encoding", std::max(n_tokens, tokens), opts.progress, " tok");
        return Status::OK();
    }
};

IndexStreamBuilder::IndexStreamBuilder() : impl_(std::make_unique<Impl>()) {}
IndexStreamBuilder::~IndexStreamBuilder() {
    if (impl_->appending.valid()) (void)impl_->appending.get();
}

int64_t IndexStreamBuilder::n_docs() const { return impl_->docs; }
int64_t IndexStreamBuilder::n_tokens() const { return impl_->tokens; }

Status IndexStreamBuilder::Create(const IndexBuildOptions& opts, const std::string& path, int64_t expected_tokens,
                                  std::unique_ptr<IndexStreamBuilder>* out) {
    TMS_RETURN_IF_ERROR(ValidateBuildOptions(opts));
    if (expected_tokens < 0) return Status::InvalidArgument("expected tokens: must be >= 0");
    std::unique_ptr<IndexStreamBuilder> b(new IndexStreamBuilder());
    Impl& im = *b->impl_;
    im.opts = opts;
    im.path = path;
    // The stream's tokens as the index will hold them (pooled).
    im.expected = (expected_tokens + opts.pool_factor - 1) / std::max(1, opts.pool_factor);
    const int threads = opts.threads > 0 ? opts.threads : omp_get_max_threads();
    TMS_RETURN_IF_ERROR(kernels::check_blas_room(threads, int64_t(128) << 20, path));
    // The build directory now: an existing index or a path that cannot be written fails before
    // any document is taken.
    TMS_RETURN_IF_ERROR(index::IndexWriter::Begin(path, opts, &im.writer));
    *out = std::move(b);
    return Status::OK();
}

Status IndexStreamBuilder::Add(const EmbeddingView& tokens, const std::vector<int64_t>& doclens,
                               const std::vector<std::string>& doc_ids, const DocMetadata* metadata) {
    Impl& im = *impl_;
    if (im.finished) return Status::InvalidArgument(im.path + ": the stream's build has finished");
    if (im.failed) return Status::InvalidArgument(im.path + ": the stream's build failed before; start again");
    ++im.batches;
    bool taken = false;  // past this, a failure ends the stream
    const Status st = [&]() -> Status {
        if (tokens.dim < 32 || tokens.dim > 1024) {
            return Status::InvalidArgument(im.batch_name() + "dimension " + std::to_string(tokens.dim) +
                                           " outside the supported range [32, 1024]");
        }
        if (im.dim != 0 && tokens.dim != im.dim) {
            return Status::InvalidArgument(im.batch_name() + "dimension " + std::to_string(tokens.dim) +
                                           " differs from the stream's " + std::to_string(im.dim));
        }
        if (doclens.empty()) return Status::OK();  // an empty batch adds nothing
        if (im.docs + int64_t(doclens.size()) > INT32_MAX) {
            return Status::NotSupported(im.batch_name() + "one index holds at most 2^31 - 1 documents");
        }
        TMS_RETURN_IF_ERROR(
            index::CheckDocLens(doclens, tokens.rows, im.batch_name() + "doclens", im.batch_name() + "docs"));
        std::vector<std::string> ids = doc_ids;
        TMS_RETURN_IF_ERROR(im.check_ids(&ids, doclens.size()));
        index::MetaRows rows;
        if (metadata) TMS_RETURN_IF_ERROR(index::ResolveMetadata(*metadata, ids, im.columns, &rows));
        if (im.docs == 0) TMS_RETURN_IF_ERROR(index::CheckTextField(im.opts, metadata ? &rows.columns : nullptr));
        if (metadata) {
            TMS_RETURN_IF_ERROR(index::CheckSpans(im.opts.spans_field, im.opts.text_field, rows.columns, rows.cells,
                                                  doclens, ids, im.batch_name() + metadata->source));
        }
        TMS_RETURN_IF_ERROR(index::CheckValues(tokens, im.batch_name() + "docs"));
        // Pooled, the batch's pooled tokens are what the index takes.
        std::vector<uint16_t> pooled;
        std::vector<int64_t> pooled_lens;
        EmbeddingView in = tokens;
        if (im.opts.pool_factor > 1) {
            TMS_RETURN_IF_ERROR(index::PoolDocuments(tokens, doclens, im.opts.pool_factor, &pooled, &pooled_lens));
            in = EmbeddingView{pooled.data(), DType::kF16, int64_t(pooled.size()) / tokens.dim, tokens.dim};
        }
        const std::vector<int64_t>& lens = im.opts.pool_factor > 1 ? pooled_lens : doclens;
        im.dim = tokens.dim;
        TMS_RETURN_IF_ERROR(im.gather(in, lens, &ids));
        taken = true;
        if (metadata && !im.has_metadata) {
            im.cells.resize(size_t(im.docs));
            im.has_metadata = true;
        }
        if (metadata) {
            im.columns = std::move(rows.columns);
            for (auto& c : rows.cells) im.cells.push_back(std::move(c));
        } else if (im.has_metadata) {
            im.cells.resize(im.cells.size() + doclens.size());
        }
        for (auto& id : ids) {
            im.id_hashes.insert(std::hash<std::string_view>()(id));
            im.ids.push_back(std::move(id));
        }
        im.docs += int64_t(doclens.size());
        im.tokens += in.rows;
        if (!im.trained) {
            const int64_t n = im.expected > 0 ? im.expected : kStreamDefaultTokens;
            const IndexBuildOptions& o = im.opts;
            const int64_t most = o.max_train_tokens > 0 ? std::min(n, o.max_train_tokens) : n;
            const int k = o.n_centroids > 0 ? o.n_centroids : index::AutoCentroids(n, most);
            // Held until the sample for k centroids is full (whatever the expected size, which may
            // be short) and the stream is known to be longer than it.
            if (im.tokens <= index::TrainSampleTokens(INT64_MAX, k, o)) return Status::OK();
            TMS_RETURN_IF_ERROR(im.train(std::max(n, im.tokens)));
            return im.flush();
        }
        if (im.gathering().rows(im.dim) >= im.group_tokens) return im.flush();
        return Status::OK();
    }();
    // Bad input is refused before anything is taken and leaves the stream usable.
    if (!st.ok() && taken) im.failed = true;
    return st;
}

Status IndexStreamBuilder::Finish(BuildStats* stats) {
    Impl& im = *impl_;
    if (im.finished) return Status::InvalidArgument(im.path + ": the stream's build has finished");
    if (im.failed) return Status::InvalidArgument(im.path + ": the stream's build failed before; start again");
    im.failed = true;  // until it completes
    if (im.docs == 0) return Status::InvalidArgument(im.path + ": the stream brought no documents");
    // A stream shorter than its sample: trained on all of it, sized for what it is.
    if (!im.trained) TMS_RETURN_IF_ERROR(im.train(im.tokens));
    TMS_RETURN_IF_ERROR(im.flush());
    TMS_RETURN_IF_ERROR(im.wait_writer());
    if (im.progress) im.progress->Done();
    const auto t0 = std::chrono::steady_clock::now();
    im.phases.emplace_back("stream.encoding", im.encode_s);
    im.phases.emplace_back("stream.writer_wait", im.wait_s);
    TMS_RETURN_IF_ERROR(im.writer->FinishShards());
    if (im.has_metadata) {
        TMS_RETURN_IF_ERROR(index::CheckTextField(im.opts, &im.columns));
        TMS_RETURN_IF_ERROR(index::WriteBuildMetadata(im.writer->build_dir(), im.columns, im.ids, im.cells, im.opts));
    }
    TMS_RETURN_IF_ERROR(im.writer->Complete());
    im.phases.emplace_back("finish", SecondsSince(t0));
    im.failed = false;
    im.finished = true;
    if (stats) {
        IndexInfo info;
        index::FillInfo(im.model, im.docs, im.tokens, im.opts, &info);
        index::FillBuildStats(info, stats);
        stats->phase_seconds = im.phases;
        stats->seconds_total = SecondsSince(im.start);
    }
    return Status::OK();
}

}  // namespace tms

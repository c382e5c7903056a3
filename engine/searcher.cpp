// Copyright TileMaxSim authors. The query pipeline:
//   centroid scores (BLAS) -> per-token top-nprobe centroids -> pruning of the documents the
//   probes reach to ncandidates (probe scores, or the IVF union and its centroid interaction)
//   -> compressed scoring (codes) -> top-rerank -> exact rerank on stored vectors (CPU or GPU)
//   -> top-k.  Exhaustive mode: exact MaxSim on every document.
#include "tilemaxsim/searcher.h"

#include "tilemaxsim/estimate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <future>
#include <iterator>
#include <limits>
#include <mutex>
#include <optional>
#include <omp.h>
#include <thread>
#include <unordered_map>

#include "engine/backend.h"
#include "engine/gpu_shard.h"
#include "engine/vector_rows.h"
#include "kernels/cuda/gpu_context.h"
#include "index/index_data.h"
#include "index/metadata.h"
#include "base/memory.h"
#include "base/progress.h"
#include "kernels/candidates.h"
#include "kernels/maxsim.h"
#include "kernels/nearest.h"

namespace tms {
namespace {

using Clock = std::chrono::steady_clock;

// Candidate lists of a batch: query q's documents (a segment's ids) docs[off[q] .. off[q + 1])
// and, where a stage scored them, their scores.
struct Lists {
    std::vector<int64_t> off;
    std::vector<int32_t> docs;
    std::vector<float> scores;
};

// The documents a search may return (SearchOptions::allow and filter, resolved), global ids: row
// row(q) of `set` for query q of the batch. A query of a direct row scores its allowed documents
// all (no probing).
struct Allowed {
    std::shared_ptr<const DocSet> set;
    std::shared_ptr<const std::vector<char>> direct_rows;
    // Rows allowed at most half of the documents: their queries may be searched again
    // (kTrustedPerHit); a broader filter leaves each query most of its topic.
    std::shared_ptr<const std::vector<char>> narrow_rows;
    int row0 = 0;  // the row of the batch's first query (a chunk of a larger batch)
    bool per_query() const { return set->rows > 1; }
    int row(int q) const { return per_query() ? row0 + q : 0; }
    bool direct(int q) const { return (*direct_rows)[size_t(row(q))] != 0; }
    bool narrow(int q) const { return (*narrow_rows)[size_t(row(q))] != 0; }
    /// The same for the queries from q0 on.
    Allowed From(int q0) const {
        Allowed a = *this;
        a.row0 += q0;
        return a;
    }
};

// One segment's state through the stages of a search cut across segments (ShardSearcher's
// PruneStage, CompressedStage).
struct SegmentCall {
    std::vector<float> qconv;  // the queries as fp32, when they are not and the host needs them
    std::vector<float> cs;     // the host's centroid scores (host candidate generation)
    bool on_gpu = false;       // candidates were generated (and are scored) on the GPU
    uint64_t ticket = 0;       // that generation's device state (GpuCodeScorer::ScoreLists)
    Lists lists;
};

// The queries as fp32 on the host: q's own data, or its conversion into *conv.
const float* HostF32(const QueryBatch& q, std::vector<float>* conv) {
    if (q.dtype == DType::kF32) return static_cast<const float*>(q.data);
    if (conv->empty()) {
        conv->resize(size_t(q.n_queries) * q.q_tokens * q.dim);
        kernels::load_as_float_parallel(q.data, q.dtype, 0, int64_t(conv->size()), conv->data());
    }
    return conv->data();
}

// Queries of other batches copied side by side into one batch that owns them (every source of
// the shape of `shape`: tokens, dim, dtype, and lengths or none).
class QueryCopy {
public:
    QueryCopy(const QueryBatch& shape, int n)
        : row_(size_t(shape.q_tokens) * size_t(shape.dim) * size_t(DTypeSize(shape.dtype))), data_(size_t(n) * row_),
          lengths_(shape.lengths ? size_t(n) : 0), batch_(shape) {
        batch_.data = data_.data();
        batch_.n_queries = n;
        batch_.lengths = shape.lengths ? lengths_.data() : nullptr;
    }
    QueryCopy(const QueryCopy&) = delete;
    QueryCopy& operator=(const QueryCopy&) = delete;
    /// Queries [first, first + n) of src, after those appended before.
    void Append(const QueryBatch& src, int first, int n) {
        std::memcpy(data_.data() + at_ * row_, static_cast<const char*>(src.data) + size_t(first) * row_, size_t(n) * row_);
        if (src.lengths) std::copy_n(src.lengths + first, n, lengths_.begin() + ptrdiff_t(at_));
        at_ += size_t(n);
    }
    const QueryBatch& batch() const { return batch_; }

private:
    size_t row_;
    std::vector<uint8_t> data_;
    std::vector<int32_t> lengths_;
    QueryBatch batch_;
    size_t at_ = 0;
};

// The pipeline of one device's documents: consecutive shards placed on the CPU or on one GPU,
// searched as one (ConcatShards), so that shards sharing a device cost what one shard of
// their documents would, and give its results. Hits carry global internal ids.
class ShardSearcher {
public:
    const IndexInfo& info() const { return data_.info; }
    /// allowed: exhaustive search only (approximate search with a filter runs the stages).
    Status Search(const QueryBatch& queries, const SearchOptions& opts, std::vector<std::vector<SearchHit>>* results,
                  SearchTimings* timings, const Allowed* allowed = nullptr) const;
    /// Search of a validated batch with options capped by the index's size.
    Status SearchCapped(const QueryBatch& queries, const SearchOptions& opts,
                        std::vector<std::vector<SearchHit>>* results, SearchTimings* timings,
                        const Allowed* allowed) const;
    /// Search of one chunk of a validated batch (Search splits batches by max_batch_queries).
    Status SearchChunk(const QueryBatch& queries, const SearchOptions& opts,
                       std::vector<std::vector<SearchHit>>* results, SearchTimings* timings,
                       const Allowed* allowed) const;

    /// One search of 256 synthetic queries of 32 tokens (centroids as tokens), results dropped,
    /// as fp32 and as fp16 (the GPU scorers take 16-bit queries as they are, through other
    /// kernel instances): loads the kernels and sizes the scratch buffers of the default batch
    /// shape.
    Status WarmUp() const {
        const int nq = 256, qt = 32, dim = data_.info.dim, K = data_.model.n_centroids;
        std::vector<float> q(size_t(nq) * qt * dim);
        for (int64_t r = 0; r < int64_t(nq) * qt; ++r) {
            const float* c = data_.model.centroids.data() + size_t(r * 7919 % K) * dim;
            std::copy(c, c + dim, q.begin() + r * dim);
        }
        QueryBatch b;
        b.data = q.data();
        b.n_queries = nq;
        b.q_tokens = qt;
        b.dim = dim;
        std::vector<std::vector<SearchHit>> res;
        TMS_RETURN_IF_ERROR(Search(b, SearchOptions{}, &res, nullptr));
        std::vector<uint16_t> h(q.size());
        for (size_t i = 0; i < q.size(); ++i) h[i] = kernels::float_to_half(q[i]);
        b.data = h.data();
        b.dtype = DType::kF16;
        return Search(b, SearchOptions{}, &res, nullptr);
    }

    /// The shard can score exactly (its vectors are loaded, on the host or its GPU, or open on
    /// disk).
    bool have_vectors() const { return gpu_exact() || !data_.vectors.empty() || !rows_.empty(); }
    Status CheckExact() const {
        if (have_vectors()) return Status::OK();
        return Status::NotSupported(data_.info.has_vectors
                                        ? "rerank needs the stored vectors, which were not loaded"
                                        : "rerank needs stored vectors: this index has none (rebuild with --keep-vectors)");
    }
    /// Exact MaxSim of local candidate lists (off [n_queries + 1], docs): Rerank's step.
    Status ExactLocal(const QueryBatch& q, const std::vector<int64_t>& off, const std::vector<int32_t>& docs,
                      std::vector<float>* scores) const {
        TMS_RETURN_IF_ERROR(CheckExact());
        std::unique_lock<std::mutex> gpu_lock;
        if (ctx_) gpu_lock = std::unique_lock<std::mutex>(ctx_->mutex());
        std::vector<float> qconv;
        return exact_candidates(gpu_exact() ? nullptr : HostF32(q, &qconv), q, off, docs, scores);
    }
    /// Vectors not where scoring runs (host or disk tier on a GPU, disk tier on the CPU): each
    /// exact step reads its documents' rows through rows_.
    bool streamed() const { return !rows_.empty(); }

    // The stages of a search whose candidates are cut together with other segments' (and
    // other participants', SearchCuts) between them: they compute what SearchChunk does, in
    // steps that return to the host. Each holds the GPU context's mutex for its own step only.
    /// The documents the probes reach, each query's cut to its ncandidates best by pruning
    /// score (c->lists.scores), or all of them (no scores) when ncandidates == 0. With
    /// `allowed`: only allowed documents; a query allowed few (Allowed::direct) gets them all,
    /// each with pruning score 0.
    Status PruneStage(const QueryBatch& q, const SearchOptions& opts, SegmentCall* c,
                      const Allowed* allowed = nullptr) const;
    /// Compressed scores of c's lists, each query's `keep` best.
    Status CompressedStage(const QueryBatch& q, int keep, SegmentCall* c) const;

    /// Puts the shard on the GPU of `ctx` (null: it stays on the host) and warms it up;
    /// `vector_parts`: its vectors when data_ holds none (ConcatShards'): uploaded and freed
    /// (tier kGpu), or kept on the host (kHost). A segment on disk (kDisk) reads
    /// data_.vector_files.
    Status Place(std::shared_ptr<kernels::GpuContext> ctx, bool warm_up, VectorTier tier,
                 std::vector<index::PodVector<uint16_t>>* vector_parts);
    /// scales_ for the host path (IndexModel::unit_norm with codes), when the codes stay here.
    Status HostScales();

    index::IndexData data_;
    // The host path's token_scales (IndexModel::unit_norm; the GPU shard holds its own).
    index::PodVector<float> scales_;
    // Streamed tiers: where the rows are read from (host_parts_ on a GPU's host tier, else
    // data_.vector_files).
    engine::VectorRows rows_;
    std::vector<index::PodVector<uint16_t>> host_parts_;
    int64_t stream_bytes_ = 0;  // SearcherOptions::stream_bytes
    // host_parts_ are registered with the GPU: it reads the rows a step needs itself.
    bool mapped_ = false;
    // The GPU scorers run on the context's stream with its shared scratch, and keep per-call
    // state (device lists between Candidates and ScoreCandidatesTop): a search holds the
    // context's mutex.
    std::shared_ptr<kernels::GpuContext> ctx_;
    std::unique_ptr<engine::GpuShard> dev_;  // the shard's data on its GPU
    bool gpu_codes() const { return dev_ && dev_->has_codes(); }
    bool gpu_exact() const { return dev_ && dev_->has_vectors(); }

private:
    /// On the host: centroid scores (*cs), probing, and the documents the probes reach, cut to
    /// ncandidates per query by probe score (kProbe) or, when a query has more than ncandidates
    /// (or cut_all), by centroid-only score (kInteraction): lists->scores then holds the
    /// pruning scores, else it is empty.
    /// allow, allow_stride: kernels::IvfUnionParams's (local ids).
    Status HostCandidates(const float* qf, const QueryBatch& q, const SearchOptions& opts, bool cut_all,
                          std::vector<float>* cs, Lists* lists, const uint32_t* allow = nullptr,
                          int64_t allow_stride = 0) const;
    /// The allowed documents of this segment for the batch's queries (local ids): one row of
    /// bitmap_words(n_docs) words for every query, or one per query (per_query()).
    std::vector<uint32_t> LocalAllow(const Allowed& a, int n_queries) const;
    /// Query q's row of `local` (LocalAllow's).
    const uint32_t* AllowRow(const std::vector<uint32_t>& local, const Allowed& a, int q) const {
        return local.data() + (a.per_query() ? size_t(q) * size_t(kernels::bitmap_words(data_.info.n_docs)) : 0);
    }
    /// Query q's live allowed documents of this segment (local ids, ascending) into *out.
    void AllowedDocs(const std::vector<uint32_t>& local, const Allowed& a, int q, std::vector<int32_t>* out) const;
    /// Compressed (or centroid-only) scores of the host lists `l` into *scores (cs: the
    /// centroid scores, on the host path).
    Status ListScores(const float* qf, const QueryBatch& q, const float* cs, const Lists& l, bool centroids_only,
                      std::vector<float>* scores) const;
    // qf: as for exact_candidates.
    Status exhaustive(const float* qf, const QueryBatch& q, int k, std::vector<int32_t>* ids,
                      std::vector<float>* scores, const Allowed* allowed) const;
    // The streamed tiers' exhaustive search: the documents in chunks of rows read through
    // rows_, each chunk's top-k merged into the whole's.
    Status exhaustive_streamed(const float* qf, const QueryBatch& q, int k, std::vector<int32_t>* ids,
                               std::vector<float>* scores, const Allowed* allowed) const;
    // Rows read for one exact step: a buffer (the GPU shard's pinned one, or owned here) and
    // the documents' token offsets in it.
    struct RowBuffer {
        uint16_t* tokens = nullptr;
        std::vector<int64_t> offsets;
        index::PodVector<uint16_t> own;
        std::vector<const uint16_t*> sources;  // mapped_: each document's rows in host memory
        // GpuShard::StageRows': the tokens on the device, and the event of their copy.
        const uint16_t* device_tokens = nullptr;
        void* ready = nullptr;
        engine::GpuShard::Rows rows() const {
            return {tokens, offsets.data(), int64_t(offsets.size()) - 1,
                    sources.empty() ? nullptr : sources.data(), device_tokens, ready};
        }
    };
    // The rows of docs[0..n) (ascending), or when docs is null of documents [d0, d1), into
    // *rb, using pinned buffer `slot` on a GPU.
    Status read_rows(int slot, const int32_t* docs, int64_t n, int64_t d0, int64_t d1, RowBuffer* rb) const;
    // Exact scores of lists (off, docs index rb's documents) against rb: as exact_candidates.
    Status score_rows(const float* qf, const QueryBatch& q, const RowBuffer& rb, const int64_t* off,
                      const int32_t* docs, std::vector<float>* scores) const;
    Status code_scores(const kernels::CodeMaxSimParams& p, bool centroids_only) const;
    // Exact MaxSim of fp32 queries against the host fp16 vectors (candidates and output unset).
    kernels::MaxSimParams exact_params(const float* q, int n_queries, int q_stride, const int32_t* lens) const {
        kernels::MaxSimParams p;
        p.queries = q;
        p.q_dtype = DType::kF32;
        p.n_queries = n_queries;
        p.q_stride = q_stride;
        p.dim = data_.info.dim;
        p.query_lens = lens;
        p.doc_tokens = data_.vectors.data();
        p.d_dtype = DType::kF16;
        p.doc_offsets = data_.doc_offsets.data();
        p.n_docs = data_.info.n_docs;
        return p;
    }
    // qf: the queries as fp32 on the host; read only without a GPU (which takes q as it is).
    Status exact_candidates(const float* qf, const QueryBatch& q, const std::vector<int64_t>& off,
                            const std::vector<int32_t>& docs, std::vector<float>* scores) const;
};

// Top-k per segment on the CPU (kernels::topk_cpu): offsets == nullptr means dense rows of row_len.
Status select_topk(const float* scores, const int64_t* offsets, int64_t row_len, int64_t n_segments, const int32_t* ids,
                   int k, int32_t* out_ids, float* out_scores) {
    kernels::TopKParams tp;
    tp.scores = scores;
    tp.offsets = offsets;
    tp.row_len = row_len;
    tp.n_segments = n_segments;
    tp.ids = ids;
    tp.k = k;
    tp.out_ids = out_ids;
    tp.out_scores = out_scores;
    return kernels::topk_cpu(tp);
}

// Keeps the top `keep` candidates of each query by score: rewrites (off, docs, scores).
Status select_top(int n_queries, int keep, std::vector<int64_t>* off, std::vector<int32_t>* docs,
                  std::vector<float>* scores) {
    std::vector<int32_t> ids(size_t(n_queries) * keep);
    std::vector<float> top(size_t(n_queries) * keep);
    TMS_RETURN_IF_ERROR(select_topk(scores->data(), off->data(), 0, n_queries, docs->data(), keep, ids.data(), top.data()));
    std::vector<int64_t> noff(1, 0);
    std::vector<int32_t> ndocs;
    std::vector<float> nscores;
    for (int q = 0; q < n_queries; ++q) {
        for (int j = 0; j < keep; ++j) {
            if (ids[size_t(q) * keep + j] < 0) break;
            ndocs.push_back(ids[size_t(q) * keep + j]);
            nscores.push_back(top[size_t(q) * keep + j]);
        }
        noff.push_back(static_cast<int64_t>(ndocs.size()));
    }
    *off = std::move(noff);
    *docs = std::move(ndocs);
    *scores = std::move(nscores);
    return Status::OK();
}

Status select_top(int n_queries, int keep, Lists* l) { return select_top(n_queries, keep, &l->off, &l->docs, &l->scores); }

// Compressed (or centroid-only) scores of p's candidates into p.scores, on the GPU when the
// shard's codes live there.
Status ShardSearcher::code_scores(const kernels::CodeMaxSimParams& p, bool centroids_only) const {
    if (gpu_codes()) {
        std::vector<float> out;
        TMS_RETURN_IF_ERROR(dev_->CodeScore(p.queries, p.n_queries, p.q_stride, p.query_lens, p.cand_offsets,
                                            p.cand_docs, centroids_only, &out));
        std::copy(out.begin(), out.end(), p.scores);
        return Status::OK();
    }
    kernels::CodeMaxSimParams c = p;
    if (centroids_only) c.n_code_bytes = 0;
    return kernels::code_maxsim_cpu(c);
}

Status ShardSearcher::exact_candidates(const float* qf, const QueryBatch& q, const std::vector<int64_t>& off,
                                      const std::vector<int32_t>& docs, std::vector<float>* scores) const {
    if (gpu_exact()) {
        return dev_->ExactScore(q.data, q.dtype, q.n_queries, q.q_tokens, q.lengths, off.data(), docs.data(), scores);
    }
    if (streamed()) {
        // The batch's distinct documents, their rows read once into one buffer (pinned for a
        // GPU), the lists renumbered into it.
        std::vector<int32_t> u(docs);
        std::sort(u.begin(), u.end());
        u.erase(std::unique(u.begin(), u.end()), u.end());
        std::vector<int32_t> local(docs.size());
#pragma omp parallel for schedule(static) if (docs.size() > 65536)
        for (size_t i = 0; i < docs.size(); ++i) {
            local[i] = int32_t(std::lower_bound(u.begin(), u.end(), docs[i]) - u.begin());
        }
        RowBuffer rb;
        TMS_RETURN_IF_ERROR(read_rows(0, u.data(), int64_t(u.size()), -1, -1, &rb));
        return score_rows(qf, q, rb, off.data(), local.data(), scores);
    }
    scores->resize(docs.size());
    kernels::MaxSimParams p = exact_params(qf, q.n_queries, q.q_tokens, q.lengths);
    p.cand_offsets = off.data();
    p.cand_docs = docs.data();
    p.scores = scores->data();
    return kernels::maxsim_cpu(p);
}

Status ShardSearcher::read_rows(int slot, const int32_t* docs, int64_t n, int64_t d0, int64_t d1,
                                RowBuffer* rb) const {
    const int dim = data_.info.dim;
    const int64_t* doff = data_.doc_offsets.data();
    // The documents' rows back to back: their offsets in the buffer.
    const int64_t m = docs ? n : d1 - d0;
    const auto doc = [&](int64_t i) { return docs ? int64_t(docs[i]) : d0 + i; };
    rb->offsets.resize(size_t(m) + 1);
    rb->offsets[0] = 0;
    for (int64_t i = 0; i < m; ++i) rb->offsets[size_t(i) + 1] = rb->offsets[size_t(i)] + doff[doc(i) + 1] - doff[doc(i)];
    const int64_t tokens = rb->offsets.back();
    if (mapped_) {  // the GPU reads the rows where they are
        rb->tokens = nullptr;
        rb->sources.resize(size_t(m));
        for (int64_t i = 0; i < m; ++i) rb->sources[size_t(i)] = rows_.HostRow(doff[doc(i)]);
        return Status::OK();
    }
    const size_t elems = std::max<size_t>(size_t(tokens) * dim, 1);
    if (ctx_) {
        TMS_RETURN_IF_ERROR(dev_->PinnedRows(slot, elems, &rb->tokens));
    } else {
        try {
            rb->own.resize(elems);
        } catch (const std::bad_alloc&) {
            return Status::ResourceExhausted("no host memory for " + std::to_string(tokens) + " token rows");
        }
        rb->tokens = rb->own.data();
    }
    if (docs) return rows_.Gather(doff, docs, n, rb->offsets.data(), rb->tokens);
    // A range in pieces of 4 MB, read or copied on every thread.
    const int64_t piece = std::max<int64_t>(1, (int64_t(4) << 20) / (int64_t(dim) * 2));
    const int64_t n_pieces = (tokens + piece - 1) / piece;
    std::vector<Status> sts(static_cast<size_t>(n_pieces));
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_pieces; ++i) {
        const int64_t t = i * piece;
        sts[size_t(i)] = rows_.Range(doff[d0] + t, std::min(piece, tokens - t), rb->tokens + size_t(t) * dim);
    }
    for (const Status& st : sts) TMS_RETURN_IF_ERROR(st);
    return Status::OK();
}

Status ShardSearcher::score_rows(const float* qf, const QueryBatch& q, const RowBuffer& rb, const int64_t* off,
                                 const int32_t* docs, std::vector<float>* scores) const {
    const int64_t n_docs = int64_t(rb.offsets.size()) - 1;
    if (ctx_) {
        const engine::GpuShard::Rows rows = rb.rows();
        return dev_->ExactScore(q.data, q.dtype, q.n_queries, q.q_tokens, q.lengths, off, docs, scores, &rows);
    }
    scores->resize(size_t(off[q.n_queries]));
    kernels::MaxSimParams p = exact_params(qf, q.n_queries, q.q_tokens, q.lengths);
    p.doc_tokens = rb.tokens;
    p.doc_offsets = rb.offsets.data();
    p.n_docs = n_docs;
    p.cand_offsets = off;
    p.cand_docs = docs;
    p.scores = scores->data();
    return kernels::maxsim_cpu(p);
}

// Merges a chunk's top-k (ids local to the chunk, plus `base`) into the running top-k of one
// query (ids, scores): best first, ties to the lower id, -1 / -inf padding last.
void merge_top(int k, int32_t* ids, float* scores, const int32_t* c_ids, const float* c_scores, int32_t base) {
    std::vector<CutKey> all;
    all.reserve(size_t(2) * k);
    for (int j = 0; j < k; ++j) {
        if (ids[j] >= 0) all.push_back({scores[j], ids[j]});
        if (c_ids[j] >= 0) all.push_back({c_scores[j], int64_t(c_ids[j]) + base});
    }
    const size_t keep = std::min(all.size(), size_t(k));
    std::partial_sort(all.begin(), all.begin() + keep, all.end(), CutKeyBetter);
    for (int j = 0; j < k; ++j) {
        ids[j] = size_t(j) < keep ? int32_t(all[j].id) : -1;
        scores[j] = size_t(j) < keep ? all[j].score : -INFINITY;
    }
}

Status ShardSearcher::exhaustive_streamed(const float* qf, const QueryBatch& q, int k, std::vector<int32_t>* ids,
                                          std::vector<float>* scores, const Allowed* allowed) const {
    const int64_t n_docs = data_.info.n_docs;
    const int64_t* doff = data_.doc_offsets.data();
    const int nq = q.n_queries;
    constexpr int kGpuMaxTopK = 1024;
    // Chunks of at most stream_bytes_ of rows (a document alone may be more).
    const int64_t max_tokens = std::max<int64_t>(1, stream_bytes_ / (int64_t(data_.info.dim) * 2));
    const std::vector<uint32_t> local = allowed ? LocalAllow(*allowed, nq) : std::vector<uint32_t>();
    // Without deletions or a filter a GPU scores each chunk densely and selects its top-k.
    const bool dense = ctx_ && data_.info.n_deleted == 0 && !allowed && k <= kGpuMaxTopK;
    ids->assign(size_t(nq) * k, -1);
    scores->assign(size_t(nq) * k, -INFINITY);
    std::vector<int32_t> c_ids(size_t(nq) * k);
    std::vector<float> c_scores(size_t(nq) * k), s;
    std::vector<int64_t> off;
    std::vector<int32_t> cand;
    // Two steps at a time: the next one's rows are read (pinned buffer slot 1 - slot) and, on
    // a GPU, copied to it (StageRows) while this one's are scored.
    RowBuffer rbs[2];
    const auto step_end = [&](int64_t d0) {
        const int64_t d1 = std::upper_bound(doff + d0 + 1, doff + n_docs + 1, doff[d0] + max_tokens) - doff - 1;
        return std::max(d1, d0 + 1);
    };
    std::future<Status> reading;
    const auto read_step = [&](int slot, int64_t d0) {
        reading = std::async(std::launch::async, [this, &rbs, slot, d0, d1 = step_end(d0)] {
            RowBuffer& rb = rbs[slot];
            rb.device_tokens = nullptr;
            rb.ready = nullptr;
            try {
                TMS_RETURN_IF_ERROR(read_rows(slot, nullptr, 0, d0, d1, &rb));
            } catch (const std::bad_alloc&) {
                return Status::ResourceExhausted("no host memory for the rows of an exhaustive step");
            }
            if (!ctx_) return Status::OK();
            if (mapped_) {
                // Registered host memory in one piece (a range within one part): copied at
                // the link's speed, not gathered by the scoring kernel's stream.
                if (rb.sources.empty()) return Status::OK();
                const size_t row = size_t(data_.info.dim) * sizeof(uint16_t);
                const uintptr_t base = reinterpret_cast<uintptr_t>(rb.sources[0]);
                for (size_t i = 0; i < rb.sources.size(); ++i) {
                    if (reinterpret_cast<uintptr_t>(rb.sources[i]) != base + size_t(rb.offsets[i]) * row) {
                        return Status::OK();
                    }
                }
                rb.tokens = const_cast<uint16_t*>(rb.sources[0]);
                rb.sources.clear();
            }
            // On to the GPU while the step before is scored; without room there the scoring
            // call copies them itself.
            engine::GpuShard::Rows r = rb.rows();
            const Status st = dev_->StageRows(slot, size_t(rb.offsets.back()) * data_.info.dim, &r);
            if (st.code() == Status::Code::kResourceExhausted) return Status::OK();
            TMS_RETURN_IF_ERROR(st);
            rb.device_tokens = r.device_tokens;
            rb.ready = r.ready;
            return Status::OK();
        });
    };
    // Every step started is waited for, also when a step fails.
    struct Join {
        std::future<Status>& f;
        ~Join() {
            if (f.valid()) f.wait();
        }
    } join{reading};
    // TMS_TRACE_SEARCH=1: per step, the wait for its rows and its scoring, on stderr.
    Trace trace("TMS_TRACE_SEARCH", "stream", Trace::Unit::kMilliseconds);
    if (n_docs > 0) read_step(0, 0);
    for (int64_t d0 = 0, d1 = 0, step = 0; d0 < n_docs; d0 = d1, ++step) {
        d1 = step_end(d0);
        trace.Mark("scored");
        TMS_RETURN_IF_ERROR(reading.get());
        trace.Mark("rows waited");
        const RowBuffer& rb = rbs[step % 2];
        if (d1 < n_docs) read_step(int((step + 1) % 2), d1);
        const engine::GpuShard::Rows rows = rb.rows();
        if (dense) {
            std::vector<int32_t> bi;
            std::vector<float> bs;
            TMS_RETURN_IF_ERROR(dev_->ExactScoreTopK(q.data, q.dtype, nq, q.q_tokens, q.lengths, nullptr, nullptr, k,
                                                     &bi, &bs, &rows));
            c_ids = std::move(bi);
            c_scores = std::move(bs);
        } else {
            // Each query's live (allowed) documents of the chunk, numbered from d0.
            off.assign(1, 0);
            cand.clear();
            for (int i = 0; i < nq; ++i) {
                const uint32_t* row = allowed ? AllowRow(local, *allowed, i) : nullptr;
                for (int64_t d = d0; d < d1; ++d) {
                    if (!data_.deleted[d] && (!row || kernels::bitmap_has(row, d))) cand.push_back(int32_t(d - d0));
                }
                off.push_back(int64_t(cand.size()));
            }
            if (ctx_ && k <= kGpuMaxTopK) {
                TMS_RETURN_IF_ERROR(dev_->ExactScoreTopK(q.data, q.dtype, nq, q.q_tokens, q.lengths, off.data(),
                                                         cand.data(), k, &c_ids, &c_scores, &rows));
            } else {
                TMS_RETURN_IF_ERROR(score_rows(qf, q, rb, off.data(), cand.data(), &s));
                TMS_RETURN_IF_ERROR(
                    select_topk(s.data(), off.data(), 0, nq, cand.data(), k, c_ids.data(), c_scores.data()));
            }
        }
#pragma omp parallel for schedule(static) if (int64_t(nq) * k > 4096)
        for (int i = 0; i < nq; ++i) {
            merge_top(k, ids->data() + size_t(i) * k, scores->data() + size_t(i) * k, c_ids.data() + size_t(i) * k,
                      c_scores.data() + size_t(i) * k, int32_t(d0));
        }
    }
    return Status::OK();
}

Status ShardSearcher::exhaustive(const float* qf, const QueryBatch& q, int k, std::vector<int32_t>* ids,
                                std::vector<float>* scores, const Allowed* allowed) const {
    if (streamed()) return exhaustive_streamed(qf, q, k, ids, scores, allowed);
    const int64_t n_docs = data_.info.n_docs;
    const int64_t n_deleted = data_.info.n_deleted;
    // The GPU selects the top-k itself up to kGpuMaxTopK; past that, or with deletions or a
    // filter, it scores candidate lists of live (allowed) documents and the CPU selects.
    constexpr int kGpuMaxTopK = 1024;
    if (gpu_exact() && n_deleted == 0 && !allowed && k <= kGpuMaxTopK) {
        return dev_->ExactScoreTopK(q.data, q.dtype, q.n_queries, q.q_tokens, q.lengths, nullptr, nullptr, k, ids,
                                    scores);
    }
    const std::vector<uint32_t> local = allowed ? LocalAllow(*allowed, q.n_queries) : std::vector<uint32_t>();
    if (gpu_exact()) {
        // Each query's documents: the live ones, or (per query) its live allowed ones.
        std::vector<int32_t> live;
        const bool shared = !allowed || !allowed->per_query();
        if (shared && allowed) {
            AllowedDocs(local, *allowed, 0, &live);
        } else if (shared) {
            for (int64_t d = 0; d < n_docs; ++d)
                if (!data_.deleted[d]) live.push_back(static_cast<int32_t>(d));
        }
        ids->assign(size_t(q.n_queries) * k, -1);
        scores->assign(size_t(q.n_queries) * k, -INFINITY);
        const int64_t per_query = shared ? int64_t(live.size()) : n_docs;  // a bound on each list
        const int block = static_cast<int>(std::max<int64_t>(
            1, std::min<int64_t>(q.n_queries, (int64_t(64) << 20) / std::max<int64_t>(1, per_query))));
        std::vector<int64_t> off;
        std::vector<int32_t> cand;
        std::vector<float> s;
        for (int q0 = 0; q0 < q.n_queries; q0 += block) {
            const int nq = std::min(block, q.n_queries - q0);
            off.assign(1, 0);
            cand.clear();
            for (int i = 0; i < nq; ++i) {
                if (!shared) AllowedDocs(local, *allowed, q0 + i, &live);
                cand.insert(cand.end(), live.begin(), live.end());
                off.push_back(static_cast<int64_t>(cand.size()));
            }
            const void* qb = static_cast<const char*>(q.data) + size_t(q0) * q.q_tokens * q.dim * DTypeSize(q.dtype);
            const int32_t* lb = q.lengths ? q.lengths + q0 : nullptr;
            if (k <= kGpuMaxTopK) {
                std::vector<int32_t> bi;
                std::vector<float> bs;
                TMS_RETURN_IF_ERROR(
                    dev_->ExactScoreTopK(qb, q.dtype, nq, q.q_tokens, lb, off.data(), cand.data(), k, &bi, &bs));
                std::copy(bi.begin(), bi.end(), ids->begin() + size_t(q0) * k);
                std::copy(bs.begin(), bs.end(), scores->begin() + size_t(q0) * k);
                continue;
            }
            TMS_RETURN_IF_ERROR(dev_->ExactScore(qb, q.dtype, nq, q.q_tokens, lb, off.data(), cand.data(), &s));
            TMS_RETURN_IF_ERROR(select_topk(s.data(), off.data(), 0, nq, cand.data(), k, ids->data() + size_t(q0) * k,
                                            scores->data() + size_t(q0) * k));
        }
        return Status::OK();
    }
    ids->assign(size_t(q.n_queries) * k, -1);
    scores->assign(size_t(q.n_queries) * k, -INFINITY);
    // Queries in blocks so that the dense score matrix stays under ~256 MB.
    const int block = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(q.n_queries, (int64_t(64) << 20) / n_docs)));
    std::vector<float> dense;
    for (int q0 = 0; q0 < q.n_queries; q0 += block) {
        const int nq = std::min(block, q.n_queries - q0);
        dense.resize(size_t(nq) * n_docs);
        kernels::MaxSimParams p = exact_params(qf + size_t(q0) * q.q_tokens * q.dim, nq, q.q_tokens,
                                               q.lengths ? q.lengths + q0 : nullptr);
        p.scores = dense.data();
        TMS_RETURN_IF_ERROR(kernels::maxsim_cpu(p));
        if (n_deleted > 0) {
            for (int i = 0; i < nq; ++i)
                for (int64_t d = 0; d < n_docs; ++d)
                    if (data_.deleted[d]) dense[size_t(i) * n_docs + d] = -INFINITY;
        }
        if (allowed) {
#pragma omp parallel for schedule(static)
            for (int i = 0; i < nq; ++i) {
                const uint32_t* row = AllowRow(local, *allowed, q0 + i);
                for (int64_t d = 0; d < n_docs; ++d)
                    if (!kernels::bitmap_has(row, d)) dense[size_t(i) * n_docs + d] = -INFINITY;
            }
        }
        TMS_RETURN_IF_ERROR(select_topk(dense.data(), nullptr, n_docs, nq, nullptr, k, ids->data() + size_t(q0) * k,
                                        scores->data() + size_t(q0) * k));
        if (allowed) {  // fewer allowed documents than k: the rest (-inf) are padding
            for (int i = 0; i < nq; ++i) {
                const uint32_t* row = AllowRow(local, *allowed, q0 + i);
                int32_t* top = ids->data() + size_t(q0 + i) * k;
                for (int j = 0; j < k; ++j)
                    if (top[j] >= 0 && !kernels::bitmap_has(row, top[j])) top[j] = -1;
            }
        }
    }
    return Status::OK();
}

// A request's shape and options in range for an index of `info`'s dimension.
Status validate_search(const IndexInfo& info, const QueryBatch& q, const SearchOptions& opts) {
    if (opts.k <= 0) return Status::InvalidArgument("k must be > 0, got " + std::to_string(opts.k));
    if (q.dim != info.dim) {
        return Status::InvalidArgument("query dimension " + std::to_string(q.dim) + " differs from the index's " +
                                       std::to_string(info.dim));
    }
    if (q.n_queries < 0 || q.q_tokens <= 0) return Status::InvalidArgument("queries: empty token dimension");
    if (q.n_queries > 0 && q.data == nullptr) return Status::InvalidArgument("queries: null data");
    if (q.lengths) {
        for (int i = 0; i < q.n_queries; ++i) {
            if (q.lengths[i] < 0 || q.lengths[i] > q.q_tokens) {
                return Status::InvalidArgument("query " + std::to_string(i) + ": length " + std::to_string(q.lengths[i]) +
                                               " outside [0, " + std::to_string(q.q_tokens) + "]");
            }
        }
    }
    if (opts.nprobe <= 0) return Status::InvalidArgument("nprobe must be > 0");
    if (opts.ncandidates < 0 || opts.rerank < 0) return Status::InvalidArgument("ncandidates and rerank must be >= 0");
    if (opts.max_batch_queries < 0) return Status::InvalidArgument("max_batch_queries must be >= 0");
    return Status::OK();
}

Status ShardSearcher::Search(const QueryBatch& q, const SearchOptions& opts, std::vector<std::vector<SearchHit>>* results,
                            SearchTimings* timings, const Allowed* allowed) const {
    const IndexInfo& info = data_.info;
    TMS_RETURN_IF_ERROR(validate_search(info, q, opts));
    // No request asks for more than the index holds: k, rerank and candidates beyond the
    // number of documents would only size buffers (k = 10^8 over 300 documents: gigabytes).
    const int64_t n_docs = std::max<int64_t>(1, info.n_docs);
    SearchOptions capped = opts;
    capped.k = int(std::min<int64_t>(opts.k, n_docs));
    capped.rerank = int(std::min<int64_t>(opts.rerank, n_docs));
    capped.ncandidates = int(std::min<int64_t>(opts.ncandidates, n_docs));
    return SearchCapped(q, capped, results, timings, allowed);
}

// Queries searched together: opts.max_batch_queries, or as many as keep the per-batch centroid
// scores [queries, tokens, centroids] (and, with probe pruning, the dense probe scores
// [queries, documents]: a GPU holds them) under 1 GiB of fp32 each, at most 4096. Exhaustive
// search bounds its [queries, documents] scores itself.
int64_t chunk_queries(const SearchOptions& opts, int q_tokens, int n_centroids, int64_t n_docs) {
    if (opts.max_batch_queries > 0) return opts.max_batch_queries;
    constexpr int64_t kBudget = int64_t(1) << 30;
    int64_t chunk = kBudget / (4 * std::max<int64_t>(int64_t(q_tokens) * n_centroids, 1));
    if (opts.pruning == Pruning::kProbe) chunk = std::min(chunk, kBudget / (4 * std::max<int64_t>(n_docs, 1)));
    return std::clamp<int64_t>(chunk, 1, 4096);
}

Status ShardSearcher::SearchCapped(const QueryBatch& q, const SearchOptions& opts,
                                  std::vector<std::vector<SearchHit>>* results, SearchTimings* timings,
                                  const Allowed* allowed) const {
    std::unique_lock<std::mutex> gpu_lock;
    if (ctx_) gpu_lock = std::unique_lock<std::mutex>(ctx_->mutex());
    const IndexInfo& info = data_.info;
    const int64_t chunk = chunk_queries(opts, q.q_tokens, info.n_centroids, info.n_docs);
    if (q.n_queries <= chunk) return SearchChunk(q, opts, results, timings, allowed);
    results->assign(size_t(q.n_queries), {});
    SearchTimings sum;
    for (int64_t q0 = 0; q0 < q.n_queries; q0 += chunk) {
        const QueryBatch b = q.Slice(int(q0), int(std::min<int64_t>(chunk, q.n_queries - q0)));
        std::vector<std::vector<SearchHit>> part;
        SearchTimings t;
        const Allowed a = allowed ? allowed->From(int(q0)) : Allowed{};
        TMS_RETURN_IF_ERROR(SearchChunk(b, opts, &part, &t, allowed ? &a : nullptr));
        std::move(part.begin(), part.end(), results->begin() + q0);
        sum.candidates += t.candidates;
        sum.scoring += t.scoring;
        sum.rerank += t.rerank;
        sum.total += t.total;
    }
    if (timings) *timings = sum;
    return Status::OK();
}

Status ShardSearcher::SearchChunk(const QueryBatch& q, const SearchOptions& opts,
                                 std::vector<std::vector<SearchHit>>* results, SearchTimings* timings,
                                 const Allowed* allowed) const {
    const auto t_start = Clock::now();
    const IndexInfo& info = data_.info;
    const bool have_vectors = this->have_vectors();
    if (opts.exhaustive && !have_vectors) {
        return Status::NotSupported(info.has_vectors
                                        ? "exhaustive search needs the stored vectors, which were not loaded"
                                        : "exhaustive search needs stored vectors: this index has none (rebuild with --keep-vectors)");
    }
    const int nq = q.n_queries, k = opts.k;
    // TMS_TRACE_SEARCH=1: host time of each step of the batch on stderr.
    Trace trace("TMS_TRACE_SEARCH", "search", Trace::Unit::kMilliseconds);
    // fp32 queries are used in place; fp16 / bf16 ones are converted once, and only for the
    // steps that read them on the host: the GPU scorers take them as they are (H200, 256 fp16
    // queries of 32 x 128: the host conversion took 0.5-2.3 ms of a ~5 ms batch).
    std::vector<float> qconv;
    const auto host_f32 = [&] { return HostF32(q, &qconv); };

    std::vector<int32_t> top_ids;
    std::vector<float> top_scores;
    SearchTimings t;
    if (opts.exhaustive) {
        const auto t0 = Clock::now();
        TMS_RETURN_IF_ERROR(exhaustive(gpu_exact() ? nullptr : host_f32(), q, k, &top_ids, &top_scores, allowed));
        t.scoring = SecondsSince(t0);
        trace.Mark("exhaustive");
    } else if (allowed) {
        return Status::Internal("SearchChunk: a filtered approximate search runs the stages (search_cut)");
    } else {
        // 1-3. Centroid scores, probing and pruning.
        auto t0 = Clock::now();
        const int nprobe = std::min(opts.nprobe, info.n_centroids);
        Lists l;
        std::vector<float> cs;
        // With the codes and IVF lists on the GPU, probing, the union and the pruning run there;
        // the [nq, qt, K] centroid scores never exist on the host, and the lists stay on the
        // device (ScoreCandidatesTop below brings back the best).
        const bool gpu_candidates = gpu_codes() && nprobe <= 64;
        if (gpu_candidates) {
            TMS_RETURN_IF_ERROR(dev_->Candidates(q.data, q.dtype, nq, q.q_tokens, q.lengths, nprobe, opts.ncandidates,
                                                 opts.pruning, &l.off, nullptr, nullptr, nullptr, nullptr, false));
        } else {
            TMS_RETURN_IF_ERROR(HostCandidates(host_f32(), q, opts, /*cut_all=*/false, &cs, &l));
        }
        t.candidates = SecondsSince(t0);
        trace.Mark("candidates");
        // 4. Compressed scoring.
        t0 = Clock::now();
        const bool rerank = have_vectors && opts.rerank > 0;
        const int keep = rerank ? std::max(opts.rerank, k) : k;
        if (gpu_candidates) {
            // The lists Candidates left on the device (with its query rows and centroid
            // scores), and only their `keep` best come back (the selection below, done there).
            TMS_RETURN_IF_ERROR(dev_->ScoreCandidatesTop(keep, &l.off, &l.docs, &l.scores));
        } else {
            TMS_RETURN_IF_ERROR(ListScores(host_f32(), q, cs.data(), l, /*centroids_only=*/false, &l.scores));
        }
        t.scoring = SecondsSince(t0);
        trace.Mark("compressed scoring");
        // 5. Exact rerank of the best compressed candidates.
        if (rerank) {
            t0 = Clock::now();
            if (!gpu_candidates) TMS_RETURN_IF_ERROR(select_top(nq, keep, &l));
            trace.Mark("rerank selection");
            TMS_RETURN_IF_ERROR(exact_candidates(gpu_exact() ? nullptr : host_f32(), q, l.off, l.docs, &l.scores));
            t.rerank = SecondsSince(t0);
            trace.Mark("exact rerank");
        }
        top_ids.resize(size_t(nq) * k);
        top_scores.resize(size_t(nq) * k);
        TMS_RETURN_IF_ERROR(
            select_topk(l.scores.data(), l.off.data(), 0, nq, l.docs.data(), k, top_ids.data(), top_scores.data()));
        trace.Mark("top-k");
    }
    results->assign(nq, {});
#pragma omp parallel for schedule(static) if (int64_t(nq) * k > 4096)
    for (int qi = 0; qi < nq; ++qi) {
        auto& r = (*results)[qi];
        r.reserve(size_t(std::min<int64_t>(k, info.n_docs)));
        for (int j = 0; j < k; ++j) {
            const int32_t id = top_ids[size_t(qi) * k + j];
            if (id < 0 || data_.deleted[id]) break;  // padding; deleted documents rank last (-inf)
            r.push_back({data_.doc_ids[id], data_.first_doc + id, top_scores[size_t(qi) * k + j]});
        }
    }
    trace.Mark("results");
    t.total = SecondsSince(t_start);
    if (timings) *timings = t;
    return Status::OK();
}

Status ShardSearcher::HostCandidates(const float* qf, const QueryBatch& q, const SearchOptions& opts, bool cut_all,
                                     std::vector<float>* cs, Lists* lists, const uint32_t* allow,
                                     int64_t allow_stride) const {
    const int nq = q.n_queries, qt = q.q_tokens;
    const int K = data_.model.n_centroids;
    const int nprobe = std::min(opts.nprobe, K);
    const bool by_probes = opts.ncandidates > 0 && opts.pruning == Pruning::kProbe;
    cs->resize(size_t(nq) * qt * K);
    index::CentroidScores(qf, int64_t(nq) * qt, data_.model, cs->data());
    // Probe-score pruning also needs each row's best unprobed centroid (its floor): the rows'
    // take-th best, then each row's first nprobe moved together (in place).
    const int64_t rows = int64_t(nq) * qt;
    const int take = by_probes ? std::min(nprobe + 1, K) : nprobe;
    std::vector<int32_t> probe(size_t(rows) * take);
    std::vector<float> probe_scores(probe.size()), floors;
    TMS_RETURN_IF_ERROR(select_topk(cs->data(), nullptr, K, rows, nullptr, take, probe.data(), probe_scores.data()));
    if (by_probes) {
        floors.resize(size_t(rows));
        for (int64_t r = 0; r < rows; ++r) {
            floors[size_t(r)] = probe_scores[size_t(r * take + take - 1)];
            std::copy_n(probe.begin() + r * take, nprobe, probe.begin() + r * nprobe);
            std::copy_n(probe_scores.begin() + r * take, nprobe, probe_scores.begin() + r * nprobe);
        }
        probe.resize(size_t(rows) * nprobe);
        probe_scores.resize(probe.size());
    }
    kernels::IvfUnionParams up;
    up.probe = probe.data();
    up.n_queries = nq;
    up.q_stride = qt;
    up.nprobe = nprobe;
    up.query_lens = q.lengths;
    up.ivf_offsets = data_.ivf_offsets.data();
    up.ivf_docs = data_.ivf_docs.data();
    up.n_centroids = K;
    up.n_docs = data_.info.n_docs;
    up.allow = allow;
    up.allow_stride = allow_stride;
    lists->scores.clear();
    if (by_probes) {
        kernels::ProbeScoreParams pp;
        pp.lists = up;
        pp.probe_scores = probe_scores.data();
        pp.floor_scores = floors.data();
        pp.keep = opts.ncandidates;
        std::vector<uint32_t> fixed;
        TMS_RETURN_IF_ERROR(kernels::probe_scores_cpu(pp, &lists->off, &lists->docs, &fixed));
        lists->scores.assign(fixed.begin(), fixed.end());  // below 2^24: exact in fp32
        return Status::OK();
    }
    TMS_RETURN_IF_ERROR(kernels::ivf_union_cpu(up, &lists->off, &lists->docs));
    // Centroid-interaction pruning (PLAID stages 2-3): score by centroids alone.
    int64_t max_cands = 0;
    for (int qi = 0; qi < nq; ++qi) max_cands = std::max(max_cands, lists->off[qi + 1] - lists->off[qi]);
    if (opts.ncandidates > 0 && (cut_all || max_cands > opts.ncandidates)) {
        TMS_RETURN_IF_ERROR(ListScores(qf, q, cs->data(), *lists, /*centroids_only=*/true, &lists->scores));
        TMS_RETURN_IF_ERROR(select_top(nq, opts.ncandidates, lists));
    }
    return Status::OK();
}

Status ShardSearcher::ListScores(const float* qf, const QueryBatch& q, const float* cs, const Lists& l,
                                 bool centroids_only, std::vector<float>* scores) const {
    scores->resize(l.docs.size());
    kernels::CodeMaxSimParams cp;
    cp.queries = qf;
    cp.n_queries = q.n_queries;
    cp.q_stride = q.q_tokens;
    cp.dim = q.dim;
    cp.query_lens = q.lengths;
    cp.centroid_scores = cs;
    cp.n_centroids = data_.model.n_centroids;
    cp.token_centroids = data_.token_centroids.data();
    cp.doc_offsets = data_.doc_offsets.data();
    cp.n_docs = data_.info.n_docs;
    cp.codes = data_.codes.data();
    cp.n_code_bytes = data_.model.n_code_bytes;
    cp.codebook = data_.model.codebook.data();
    cp.token_scales = scales_.empty() ? nullptr : scales_.data();
    cp.cand_offsets = l.off.data();
    cp.cand_docs = l.docs.data();
    cp.scores = scores->data();
    return code_scores(cp, centroids_only);
}

Status ShardSearcher::PruneStage(const QueryBatch& q, const SearchOptions& opts, SegmentCall* c,
                                 const Allowed* allowed) const {
    std::unique_lock<std::mutex> gpu_lock;
    if (ctx_) gpu_lock = std::unique_lock<std::mutex>(ctx_->mutex());
    SearchOptions o = opts;  // more candidates than documents would only size buffers
    if (o.ncandidates > 0) o.ncandidates = int(std::min<int64_t>(o.ncandidates, std::max<int64_t>(1, data_.info.n_docs)));
    const int nprobe = std::min(o.nprobe, data_.info.n_centroids);
    const int nq = q.n_queries;
    c->on_gpu = gpu_codes() && nprobe <= 64;  // as SearchChunk decides
    std::vector<uint32_t> local;
    int n_direct = 0;
    if (allowed) {
        local = LocalAllow(*allowed, nq);
        for (int i = 0; i < nq; ++i) n_direct += allowed->direct(i);
    }
    const int64_t stride = allowed && allowed->per_query() ? kernels::bitmap_words(data_.info.n_docs) : 0;
    if (n_direct < nq) {  // some query probes
        if (c->on_gpu) {
            TMS_RETURN_IF_ERROR(dev_->Candidates(q.data, q.dtype, nq, q.q_tokens, q.lengths, nprobe, o.ncandidates,
                                                 o.pruning, &c->lists.off, &c->lists.docs, &c->lists.scores,
                                                 &c->ticket, allowed ? local.data() : nullptr, stride > 0));
        } else {
            TMS_RETURN_IF_ERROR(HostCandidates(HostF32(q, &c->qconv), q, o, /*cut_all=*/true, &c->cs, &c->lists,
                                               allowed ? local.data() : nullptr, stride));
        }
    } else {  // the compressed stage scores the lists below: on the host, with these centroid scores
        c->ticket = 0;
        if (!c->on_gpu) {
            c->cs.resize(size_t(nq) * q.q_tokens * data_.model.n_centroids);
            index::CentroidScores(HostF32(q, &c->qconv), int64_t(nq) * q.q_tokens, data_.model, c->cs.data());
        }
        c->lists.off.assign(size_t(nq) + 1, 0);
        c->lists.docs.clear();
        c->lists.scores.clear();
    }
    if (n_direct == 0) return Status::OK();
    // The queries allowed few documents: all of them, pruning score 0 (the cuts spare them).
    const bool scored = o.ncandidates > 0;
    std::vector<std::vector<int32_t>> mine(allowed->per_query() ? size_t(nq) : 1);
    if (!allowed->per_query()) AllowedDocs(local, *allowed, 0, &mine[0]);
#pragma omp parallel for schedule(dynamic) if (allowed->per_query())
    for (int i = 0; i < nq; ++i)
        if (allowed->per_query() && allowed->direct(i)) AllowedDocs(local, *allowed, i, &mine[size_t(i)]);
    const Lists& l = c->lists;
    const auto list_of = [&](int i) -> std::pair<const int32_t*, int64_t> {
        if (!allowed->direct(i)) return {l.docs.data() + l.off[size_t(i)], l.off[size_t(i) + 1] - l.off[size_t(i)]};
        const auto& m = mine[allowed->per_query() ? size_t(i) : 0];
        return {m.data(), int64_t(m.size())};
    };
    Lists out;
    out.off.assign(size_t(nq) + 1, 0);
    for (int i = 0; i < nq; ++i) out.off[size_t(i) + 1] = out.off[size_t(i)] + list_of(i).second;
    out.docs.resize(size_t(out.off.back()));
    if (scored) out.scores.assign(out.docs.size(), 0.f);
#pragma omp parallel for schedule(dynamic)
    for (int i = 0; i < nq; ++i) {
        const auto [docs, len] = list_of(i);
        std::copy(docs, docs + len, out.docs.begin() + out.off[size_t(i)]);
        if (scored && !allowed->direct(i)) {
            std::copy(l.scores.begin() + l.off[size_t(i)], l.scores.begin() + l.off[size_t(i) + 1],
                      out.scores.begin() + out.off[size_t(i)]);
        }
    }
    c->lists = std::move(out);
    return Status::OK();
}

std::vector<uint32_t> ShardSearcher::LocalAllow(const Allowed& a, int n_queries) const {
    const int64_t n = data_.info.n_docs, words = kernels::bitmap_words(n), first = data_.first_doc;
    const int rows = a.per_query() ? n_queries : 1;
    std::vector<uint32_t> out(size_t(rows) * size_t(words), 0u);
    const int sh = int(first % 32);
#pragma omp parallel for schedule(static) if (int64_t(rows) * words > 65536)
    for (int r = 0; r < rows; ++r) {
        const uint32_t* src = a.set->Row(a.row(r)) + first / 32;
        const int64_t src_words = DocSet::Words(a.set->n_docs) - first / 32;
        uint32_t* dst = out.data() + size_t(r) * size_t(words);
        for (int64_t w = 0; w < words; ++w) {  // bits [first + 32 w, first + 32 w + 32) of the row
            uint32_t lo = w < src_words ? src[w] : 0u, hi = w + 1 < src_words ? src[w + 1] : 0u;
            dst[w] = sh ? (lo >> sh) | (hi << (32 - sh)) : lo;
        }
        if (n % 32) dst[words - 1] &= (1u << (n % 32)) - 1u;  // no bit past the segment's documents
    }
    return out;
}

void ShardSearcher::AllowedDocs(const std::vector<uint32_t>& local, const Allowed& a, int q,
                                std::vector<int32_t>* out) const {
    const int64_t words = kernels::bitmap_words(data_.info.n_docs);
    const uint32_t* row = AllowRow(local, a, q);
    out->clear();
    for (int64_t w = 0; w < words; ++w) {
        for (uint32_t x = row[w]; x; x &= x - 1) {
            const int32_t d = int32_t(w * 32 + __builtin_ctz(x));
            if (!data_.deleted[size_t(d)]) out->push_back(d);
        }
    }
}

Status ShardSearcher::CompressedStage(const QueryBatch& q, int keep, SegmentCall* c) const {
    std::unique_lock<std::mutex> gpu_lock;
    if (ctx_) gpu_lock = std::unique_lock<std::mutex>(ctx_->mutex());
    keep = int(std::min<int64_t>(keep, std::max<int64_t>(1, data_.info.n_docs)));
    Lists& l = c->lists;
    if (c->on_gpu) {
        Lists top;
        TMS_RETURN_IF_ERROR(dev_->ScoreLists(q.data, q.dtype, q.n_queries, q.q_tokens, q.lengths, l.off.data(),
                                             l.docs.data(), keep, &top.off, &top.docs, &top.scores, c->ticket));
        l = std::move(top);
        return Status::OK();
    }
    TMS_RETURN_IF_ERROR(ListScores(HostF32(q, &c->qconv), q, c->cs.data(), l, /*centroids_only=*/false, &l.scores));
    return select_top(q.n_queries, keep, &l);
}

Status ShardSearcher::Place(std::shared_ptr<kernels::GpuContext> ctx, bool warm_up, VectorTier tier,
                            std::vector<index::PodVector<uint16_t>>* vector_parts) {
    rows_.dim = data_.info.dim;
    for (const index::VectorFileSpan& f : data_.vector_files) rows_.AddFile(f);
    if (!ctx) return HostScales();
    ctx_ = ctx;
    const std::vector<index::PodVector<uint16_t>> none;
    const bool to_gpu = tier == VectorTier::kGpu;
    TMS_RETURN_IF_ERROR(engine::MakeGpuShard(ctx, data_, to_gpu ? *vector_parts : none, to_gpu ? &rows_ : nullptr, &dev_));
    // The device copy is the one used (MakeGpuShard uploads every vector it is given).
    if (dev_->has_vectors()) {
        index::PodVector<uint16_t>().swap(data_.vectors);
        rows_ = engine::VectorRows();
        data_.vector_files.clear();
    }
    if (tier == VectorTier::kHost) {
        host_parts_ = std::move(*vector_parts);
        int64_t t0 = 0;
        mapped_ = true;
        for (const auto& part : host_parts_) {
            const int64_t n = int64_t(part.size()) / data_.info.dim;
            rows_.AddHost(t0, part.data(), n);
            mapped_ = dev_->RegisterHost(part.data(), part.size() * sizeof(uint16_t)) && mapped_;
            t0 += n;
        }
    }
    vector_parts->clear();
    if (!gpu_codes()) TMS_RETURN_IF_ERROR(HostScales());
    if (warm_up && data_.info.n_docs > 0) TMS_RETURN_IF_ERROR(WarmUp());
    return Status::OK();
}

Status ShardSearcher::HostScales() {
    const index::IndexModel& m = data_.model;
    if (!m.unit_norm || m.n_code_bytes == 0) return Status::OK();
    kernels::DecodedScaleParams p;
    p.centroids = m.centroids.data();
    p.n_centroids = m.n_centroids;
    p.dim = m.dim;
    p.token_centroids = data_.token_centroids.data();
    p.codes = data_.codes.data();
    p.n_code_bytes = m.n_code_bytes;
    p.codebook = m.codebook.data();
    p.n_tokens = int64_t(data_.token_centroids.size());
    try {
        scales_.resize(size_t(p.n_tokens));
    } catch (...) {
        return Status::ResourceExhausted("out of host memory for the token scales");
    }
    p.scales = scales_.data();
    return kernels::decoded_scales_cpu(p);
}

// Bytes a shard holds once loaded: codes, centroid ids and scales, IVF lists, vectors (with
// `file_vectors`, those still in their files, which the GPU tier uploads).
int64_t shard_bytes(const index::IndexData& d, bool file_vectors) {
    const int64_t scale = d.model.unit_norm && d.model.n_code_bytes > 0 ? 4 : 0;
    int64_t vec = int64_t(d.vectors.size());
    for (const index::VectorFileSpan& f : d.vector_files) vec += file_vectors ? f.file->n_tokens() * d.info.dim : 0;
    return int64_t(d.token_centroids.size()) * (4 + scale) + int64_t(d.codes.size()) + int64_t(d.ivf_docs.size()) * 4 +
           vec * 2 + int64_t(d.doc_offsets.size()) * 8;
}

// The first non-finite value among the used token rows of a batch, as an error naming the query
// (16-bit values by their exponent bits: all ones is Inf or NaN).
Status check_finite(const QueryBatch& q) {
    if (q.data == nullptr || q.n_queries <= 0 || q.q_tokens <= 0 || q.dim <= 0) return Status::OK();
    const int64_t row = int64_t(q.q_tokens) * q.dim;
    std::vector<int64_t> bad(size_t(q.n_queries), -1);  // per query: the first bad element
#pragma omp parallel for schedule(static) if (int64_t(q.n_queries) * row > (int64_t(1) << 18))
    for (int i = 0; i < q.n_queries; ++i) {
        const int64_t n = int64_t(q.lengths ? std::clamp(q.lengths[i], 0, q.q_tokens) : q.q_tokens) * q.dim;
        const int64_t base = int64_t(i) * row;
        if (q.dtype == DType::kF32) {
            const float* x = static_cast<const float*>(q.data) + base;
            for (int64_t e = 0; e < n; ++e)
                if (!std::isfinite(x[e])) {
                    bad[size_t(i)] = e;
                    break;
                }
        } else {
            const uint16_t* x = static_cast<const uint16_t*>(q.data) + base;
            const uint16_t exp = q.dtype == DType::kF16 ? 0x7c00 : 0x7f80;
            for (int64_t e = 0; e < n; ++e)
                if ((x[e] & exp) == exp) {
                    bad[size_t(i)] = e;
                    break;
                }
        }
    }
    for (int i = 0; i < q.n_queries; ++i) {
        if (bad[size_t(i)] < 0) continue;
        const int64_t e = bad[size_t(i)];
        float v;
        kernels::load_as_float_parallel(q.data, q.dtype, int64_t(i) * row + e, 1, &v);
        return Status::InvalidArgument("query " + std::to_string(i) + ": non-finite value (" +
                                       (std::isnan(v) ? "NaN" : "Inf") + ") at token " + std::to_string(e / q.dim) +
                                       ", dimension " + std::to_string(e % q.dim));
    }
    return Status::OK();
}

constexpr CutKey kKeepAll{-INFINITY, std::numeric_limits<int64_t>::max()};

// step(i) for every segment i of `groups` (segment indices per device, n in all): one host
// thread per GPU runs its segments in turn (they share its stream and scratch); on the CPU (one
// group) they run in turn, each step using every core. Returns each segment's status.
std::vector<Status> run_on_devices(const std::vector<std::vector<size_t>>& groups, size_t n,
                                   const std::function<Status(size_t)>& step) {
    std::vector<Status> sts(n);
    auto device = [&](size_t g) {
        for (size_t i : groups[g]) sts[i] = step(i);
    };
    std::vector<std::thread> workers;
    for (size_t g = 1; g < groups.size(); ++g) workers.emplace_back(device, g);
    if (!groups.empty()) device(0);
    for (auto& w : workers) w.join();
    return sts;
}

// Per query, the keep-th best key of best[q] over every participant (SearchCuts::Cut, or this
// process's alone), or kKeepAll where they hold fewer. Collective with cuts: called with the
// caller's error so far, which it returns (with cuts, any participant's).
Status agree_cut(SearchCuts* cuts, int keep, const Status& st, std::vector<std::vector<CutKey>> best,
                 std::vector<CutKey>* at) {
    at->assign(best.size(), kKeepAll);
    if (cuts) return cuts->Cut(keep, st, best, at);
    TMS_RETURN_IF_ERROR(st);
    for (size_t i = 0; i < best.size(); ++i) {
        auto& b = best[i];
        if (b.size() < size_t(keep)) continue;
        std::nth_element(b.begin(), b.begin() + (keep - 1), b.end(), CutKeyBetter);
        (*at)[i] = b[size_t(keep - 1)];
    }
    return Status::OK();
}

// A query allowed at most half of the documents whose top k holds a document that its pruning
// did not rank among its best kTrustedPerHit * k candidates (at most half of them) is searched
// again: its pruning scores did not tell its best documents from the rest (a filter that leaves
// a query few documents of its topic reaches down to where documents all score alike, and the
// cut to ncandidates drops some of its best), so the second search probes kDeepenProbes times
// as many lists (at most kMaxWidenedProbes) and scores every allowed document they reach,
// without the cut. Documents of one topic rank in any order within its first few k, which is
// not a reason to search again.
constexpr int kTrustedPerHit = 4;
constexpr int kDeepenProbes = 2;
constexpr int kMaxWidenedProbes = 64;  // the most the GPU's candidate generation takes

// Approximate search of the segments `segs` (`groups`: their indices per device) as one segment
// over all of them, and with `cuts` over every participant's, would search: each stage runs on
// every device at once, and between stages the host cuts the candidates to the best
// ncandidates (by pruning score), then to the best rerank-or-k (by compressed score), keys
// (score, global id) compared across segments. Results: these segments' share of the top-k.
// n_docs, n_centroids: of the whole (they size the chunks, which must be the same everywhere).
// st: the caller's error so far, still taken through the cuts (the other participants wait
// in them). With a filter (opts.allow or opts.filter: the same on every participant), the
// queries the pruning ranked poorly are searched again (kDeepenProbes).
Status search_cut(const std::vector<const ShardSearcher*>& segs, const std::vector<std::vector<size_t>>& groups,
                  int64_t n_docs, int n_centroids, const QueryBatch& q, const SearchOptions& opts, Status st,
                  SearchCuts* cuts, std::vector<std::vector<SearchHit>>* results, SearchTimings* timings,
                  const Allowed* allowed = nullptr) {
    const auto t_start = Clock::now();
    const size_t n = segs.size();
    bool have_vectors = true;
    for (const ShardSearcher* sg : segs) have_vectors = have_vectors && sg->CheckExact().ok();
    const bool rerank = have_vectors && opts.rerank > 0;
    const int keep = rerank ? std::max(opts.rerank, opts.k) : opts.k;
    const int64_t chunk = chunk_queries(opts, q.q_tokens, n_centroids, n_docs);
    const bool deepen = (opts.allow || !opts.filter.empty()) && opts.ncandidates > 0;
    SearchTimings t;
    // One stage on every segment, every device at once.
    auto run = [&](const std::function<Status(size_t)>& step, double* seconds) {
        const auto t0 = Clock::now();
        const std::vector<Status> sts = run_on_devices(groups, n, step);
        *seconds += SecondsSince(t0);
        for (const Status& e : sts) TMS_RETURN_IF_ERROR(e);
        return Status::OK();
    };
    // One pass of the queries b (allowed a) with options o: these segments' share of each
    // query's top-k into *out and, with deep, the queries to search again (agreed by every
    // participant). Errors go to st.
    auto pass = [&](const QueryBatch& b, const Allowed* a, const SearchOptions& o,
                    std::vector<std::vector<SearchHit>>* out, std::vector<int>* deep) {
        const int nb = b.n_queries;
        std::vector<SegmentCall> calls(n);
        // Queries that score all their allowed documents: their pruning scores are all 0 (a
        // cut would keep the lowest ids, not the best).
        const auto direct = [&](int i) { return a && a->direct(i); };
        // Each query's best keep_n keys over every segment's lists (none for the spared).
        auto best_keys = [&](int keep_n, bool spare_direct) {
            std::vector<std::vector<CutKey>> best(static_cast<size_t>(nb));
            if (!st.ok()) return best;
#pragma omp parallel for schedule(dynamic, 4)
            for (int i = 0; i < nb; ++i) {
                if (spare_direct && direct(i)) continue;
                auto& bq = best[size_t(i)];
                for (size_t s = 0; s < n; ++s) {
                    const Lists& l = calls[s].lists;
                    for (int64_t e = l.off[size_t(i)]; e < l.off[size_t(i) + 1]; ++e)
                        bq.push_back({l.scores[size_t(e)], segs[s]->data_.first_doc + l.docs[size_t(e)]});
                }
                if (bq.size() > size_t(keep_n)) {
                    std::nth_element(bq.begin(), bq.begin() + (keep_n - 1), bq.end(), CutKeyBetter);
                    bq.resize(size_t(keep_n));
                }
            }
            return best;
        };
        // Cuts every segment's lists to the best `keep_n` of each query over all of them.
        auto cut = [&](int keep_n, bool spare_direct) {
            std::vector<CutKey> at;
            st = agree_cut(cuts, keep_n, st, best_keys(keep_n, spare_direct), &at);
            if (!st.ok()) return;
            bool cuts_any = false;
            for (int i = 0; i < nb; ++i) {
                if (spare_direct && direct(i)) at[size_t(i)] = kKeepAll;
                cuts_any = cuts_any || CutKeyBetter(at[size_t(i)], kKeepAll);
            }
            if (!cuts_any) return;  // every list is kept whole
            for (size_t s = 0; s < n; ++s) {
                Lists& l = calls[s].lists;
                const int64_t first = segs[s]->data_.first_doc;
                const auto kept = [&](int i, int64_t e) {
                    return !CutKeyBetter(at[size_t(i)], {l.scores[size_t(e)], first + l.docs[size_t(e)]});
                };
                Lists cut_lists;
                cut_lists.off.assign(size_t(nb) + 1, 0);
                for (int i = 0; i < nb; ++i) {
                    int64_t c = 0;
                    for (int64_t e = l.off[size_t(i)]; e < l.off[size_t(i) + 1]; ++e) c += kept(i, e);
                    cut_lists.off[size_t(i) + 1] = cut_lists.off[size_t(i)] + c;
                }
                cut_lists.docs.resize(size_t(cut_lists.off.back()));
                cut_lists.scores.resize(cut_lists.docs.size());
#pragma omp parallel for schedule(static) if (l.docs.size() > 65536)
                for (int i = 0; i < nb; ++i) {
                    int64_t w = cut_lists.off[size_t(i)];
                    for (int64_t e = l.off[size_t(i)]; e < l.off[size_t(i) + 1]; ++e) {
                        if (!kept(i, e)) continue;
                        cut_lists.docs[size_t(w)] = l.docs[size_t(e)];
                        cut_lists.scores[size_t(w++)] = l.scores[size_t(e)];
                    }
                }
                l = std::move(cut_lists);
            }
        };
        if (st.ok()) {
            st = run([&](size_t s) { return segs[s]->PruneStage(b, o, &calls[s], a); }, &t.candidates);
        }
        // Per query (with deep): the global ids of the candidates kept past the pruning's
        // trusted best, ascending.
        std::vector<std::vector<int64_t>> past(deep ? size_t(nb) : 0);
        if (o.ncandidates > 0) {
            cut(o.ncandidates, /*spare_direct=*/true);
            if (deep) {
                const int trusted = std::min(kTrustedPerHit * o.k, std::max(o.k, o.ncandidates / 2));
                std::vector<CutKey> at;
                st = agree_cut(cuts, trusted, st, best_keys(trusted, /*spare_direct=*/true), &at);
                for (int i = 0; st.ok() && i < nb; ++i) {
                    // (A participant of no documents has no allowed set, nor candidates.)
                    if (!a || direct(i) || !a->narrow(i) || !CutKeyBetter(at[size_t(i)], kKeepAll)) continue;
                    for (size_t s = 0; s < n; ++s) {
                        const Lists& l = calls[s].lists;
                        const int64_t first = segs[s]->data_.first_doc;
                        for (int64_t e = l.off[size_t(i)]; e < l.off[size_t(i) + 1]; ++e)
                            if (CutKeyBetter(at[size_t(i)], {l.scores[size_t(e)], first + l.docs[size_t(e)]}))
                                past[size_t(i)].push_back(first + l.docs[size_t(e)]);
                    }
                    std::sort(past[size_t(i)].begin(), past[size_t(i)].end());
                }
            }
        }
        if (st.ok()) st = run([&](size_t s) { return segs[s]->CompressedStage(b, keep, &calls[s]); }, &t.scoring);
        cut(keep, /*spare_direct=*/false);
        if (st.ok() && rerank) {
            st = run(
                [&](size_t s) {
                    Lists& l = calls[s].lists;
                    return l.docs.empty() ? Status::OK() : segs[s]->ExactLocal(b, l.off, l.docs, &l.scores);
                },
                &t.rerank);
        }
        std::vector<std::vector<std::vector<SearchHit>>> parts(n, std::vector<std::vector<SearchHit>>(size_t(nb)));
        for (size_t s = 0; st.ok() && s < n; ++s) {
            const index::IndexData& d = segs[s]->data_;
            const Lists& l = calls[s].lists;
            // Each query's best k live hits of the segment (only they can reach the merged
            // top-k), named by their external ids.
#pragma omp parallel for schedule(dynamic, 4)
            for (int i = 0; i < nb; ++i) {
                std::vector<std::pair<CutKey, int32_t>> live;
                for (int64_t e = l.off[size_t(i)]; e < l.off[size_t(i) + 1]; ++e) {
                    const int32_t id = l.docs[size_t(e)];
                    if (!d.deleted[size_t(id)]) live.push_back({{l.scores[size_t(e)], d.first_doc + id}, id});
                }
                const size_t top = std::min(live.size(), size_t(o.k));
                std::partial_sort(live.begin(), live.begin() + ptrdiff_t(top), live.end(),
                                  [](const auto& x, const auto& y) { return CutKeyBetter(x.first, y.first); });
                auto& hits = parts[s][size_t(i)];
                for (size_t j = 0; j < top; ++j)
                    hits.push_back({d.doc_ids[size_t(live[j].second)], live[j].first.id, live[j].first.score});
            }
        }
        if (deep) {
            // The queries whose top-k (over every participant) holds a document of `past`.
            std::vector<std::vector<CutKey>> best(static_cast<size_t>(nb)), mine(static_cast<size_t>(nb));
            for (int i = 0; st.ok() && i < nb; ++i)
                for (size_t s = 0; s < n; ++s)
                    for (const SearchHit& h : parts[s][size_t(i)]) best[size_t(i)].push_back({h.score, h.internal_id});
            std::vector<CutKey> kth, any;
            st = agree_cut(cuts, o.k, st, best, &kth);
            for (int i = 0; st.ok() && i < nb; ++i) {
                for (const CutKey& h : best[size_t(i)]) {
                    if (!CutKeyBetter(kth[size_t(i)], h) &&
                        std::binary_search(past[size_t(i)].begin(), past[size_t(i)].end(), h.id)) {
                        mine[size_t(i)].push_back(h);
                        break;
                    }
                }
            }
            st = agree_cut(cuts, 1, st, std::move(mine), &any);
            for (int i = 0; st.ok() && i < nb; ++i)
                if (CutKeyBetter(any[size_t(i)], kKeepAll)) deep->push_back(i);
        }
        if (st.ok()) MergeHits(&parts, nb, o.k, out);
    };
    results->assign(size_t(q.n_queries), {});
    for (int64_t q0 = 0; q0 < q.n_queries; q0 += chunk) {
        const int nb = int(std::min<int64_t>(chunk, q.n_queries - q0));
        const QueryBatch b = q.Slice(int(q0), nb);
        const Allowed a = allowed ? allowed->From(int(q0)) : Allowed{};
        std::vector<std::vector<SearchHit>> out;
        std::vector<int> again;
        pass(b, allowed ? &a : nullptr, opts, &out, deepen ? &again : nullptr);
        TMS_RETURN_IF_ERROR(st);
        if (!again.empty()) {
            // Those queries (and their rows of the allowed documents) gathered into one batch.
            QueryCopy g(b, int(again.size()));
            for (const int i : again) g.Append(b, i, 1);
            Allowed ga = a;
            if (allowed && a.per_query()) {
                const int64_t words = DocSet::Words(a.set->n_docs);
                auto set = std::make_shared<DocSet>(a.set->n_docs, int(again.size()));
                auto dr = std::make_shared<std::vector<char>>(again.size());
                auto nr = std::make_shared<std::vector<char>>(again.size());
                for (size_t j = 0; j < again.size(); ++j) {
                    std::copy_n(a.set->Row(a.row(again[j])), words, set->bits.begin() + ptrdiff_t(j * size_t(words)));
                    (*dr)[j] = a.direct(again[j]);
                    (*nr)[j] = a.narrow(again[j]);
                }
                ga.set = std::move(set);
                ga.direct_rows = std::move(dr);
                ga.narrow_rows = std::move(nr);
                ga.row0 = 0;
            }
            SearchOptions wide = opts;
            wide.ncandidates = 0;
            wide.nprobe = std::min(kMaxWidenedProbes, std::max(opts.nprobe, opts.nprobe * kDeepenProbes));
            std::vector<std::vector<SearchHit>> again_out;
            pass(g.batch(), allowed ? &ga : nullptr, wide, &again_out, nullptr);
            TMS_RETURN_IF_ERROR(st);
            for (size_t j = 0; j < again.size(); ++j) out[size_t(again[j])] = std::move(again_out[j]);
        }
        std::move(out.begin(), out.end(), results->begin() + q0);
    }
    t.total = SecondsSince(t_start);
    if (timings) *timings = t;
    return Status::OK();
}

// The public Searcher: shards placed on devices, each device's consecutive shards one segment; a
// batch runs on every device at once (one host thread per GPU), then the per-segment top-k lists
// are merged.
class ShardedSearcher final : public Searcher {
public:
    const IndexInfo& info() const override { return info_; }
    Device device() const override { return device_; }
    const std::vector<ShardPlacement>& placement() const override { return placement_; }
    Status Search(const QueryBatch& q, const SearchOptions& given, std::vector<std::vector<SearchHit>>* results,
                  SearchTimings* timings) const override {
        TMS_RETURN_IF_ERROR(check_finite(q));
        // The index's measured settings for the target recall (with the vectors it was measured with).
        const SearchOptions opts = tune_ ? ApplyTargetRecall(estimate_, given) : given;
        // Per-query sets name queries by their place in the caller's batch: they go alone.
        const bool per_query = opts.allow && opts.allow->rows > 1;
        if (gather_ && !per_query && q.n_queries > 0 && q.n_queries < kGatherMax) {
            TMS_RETURN_IF_ERROR(validate_search(info_, q, opts));  // a bad request fails alone
            TMS_RETURN_IF_ERROR(Gathered(q, opts, results, timings));
        } else {
            TMS_RETURN_IF_ERROR(SearchShards(q, opts, results, timings));
        }
        // A query of no tokens matches nothing (its MaxSim would be 0 for every document).
        for (int i = 0; q.lengths && i < q.n_queries; ++i)
            if (q.lengths[i] == 0) (*results)[size_t(i)].clear();
        return Status::OK();
    }

    // Concurrent callers' small batches, gathered (SearcherOptions::gather): each request waits
    // in `pending_`; the first one not served leads: it waits its window (gather_us), then for
    // the gathered search in flight to end (or the batch to fill), takes the requests of its
    // shape and options and searches them as one batch. One gathered search runs at a time, so
    // callers arriving during it make the next batch; a lone caller starts at once. Each wait
    // is woken alone (a request's own condition, the leader's): with many callers a shared
    // condition would wake every waiter at every arrival.
    static constexpr int kGatherMax = 256;  // requests of this many queries or more go alone
    struct Request {
        const QueryBatch* q;
        const SearchOptions* opts;
        std::vector<std::vector<SearchHit>>* out;
        SearchTimings* timings;
        Status st;
        bool taken = false;  // in a leader's batch (done once that batch is searched)
        bool done = false;
        std::condition_variable cv;  // taken, done, or this request is to lead
    };
    static bool same_shape(const Request& a, const Request& b) {
        const SearchOptions &x = *a.opts, &y = *b.opts;
        return a.q->q_tokens == b.q->q_tokens && a.q->dtype == b.q->dtype && a.q->dim == b.q->dim &&
               (a.q->lengths == nullptr) == (b.q->lengths == nullptr) && x.k == y.k && x.exhaustive == y.exhaustive &&
               x.nprobe == y.nprobe && x.ncandidates == y.ncandidates && x.rerank == y.rerank &&
               x.pruning == y.pruning && x.max_batch_queries == y.max_batch_queries && x.allow == y.allow &&
               x.filter == y.filter && x.direct_max == y.direct_max;
    }

    Status Gathered(const QueryBatch& q, const SearchOptions& opts, std::vector<std::vector<SearchHit>>* results,
                    SearchTimings* timings) const {
        Request me{&q, &opts, results, timings, Status::OK(), false, false, {}};
        std::unique_lock<std::mutex> lock(gather_mu_);
        pending_.push_back(&me);
        if (leading_) leader_cv_.notify_one();  // a leader waiting for a full batch counts it
        while (!me.done) {
            if (leading_ || me.taken) {  // another thread gathers, or searches this request
                me.cv.wait(lock);
                continue;
            }
            // This thread serves a batch: of the oldest pending request's shape (its own is pending,
            // so pending_ is not empty).
            leading_ = true;
            auto full = [&] {
                int n = 0;
                for (const Request* r : pending_) n += r->q->n_queries;
                return n >= kGatherMax;
            };
            if (gather_us_ > 0) leader_cv_.wait_until(lock, Clock::now() + std::chrono::microseconds(gather_us_), full);
            leader_cv_.wait(lock, [&] { return !running_ || full(); });
            std::vector<Request*> batch;
            int n = 0;
            const Request* oldest = pending_.front();
            for (auto it = pending_.begin(); it != pending_.end();) {
                if (same_shape(**it, *oldest) && n + (*it)->q->n_queries <= kGatherMax) {
                    n += (*it)->q->n_queries;
                    (*it)->taken = true;
                    batch.push_back(*it);
                    it = pending_.erase(it);
                } else {
                    ++it;
                }
            }
            leading_ = false;
            ++running_;
            for (Request* r : pending_) {  // the oldest other request leads the ones left
                if (r == &me) continue;
                r->cv.notify_one();
                break;
            }
            lock.unlock();
            RunGathered(batch, n);
            lock.lock();
            --running_;
            for (Request* r : batch) {
                r->done = true;
                r->cv.notify_one();
            }
            leader_cv_.notify_one();  // a leader waiting for this search to end
        }
        return me.st;
    }

    // One search of the requests' queries, copied side by side; each gets its own results.
    void RunGathered(const std::vector<Request*>& batch, int n) const {
        if (batch.size() == 1) {  // alone: its own queries, no copy
            Request* r = batch.front();
            SearchTimings t;
            r->st = SearchShards(*r->q, *r->opts, r->out, &t);
            if (r->timings) *r->timings = t;
            return;
        }
        QueryCopy all(*batch.front()->q, n);
        for (const Request* r : batch) all.Append(*r->q, 0, r->q->n_queries);
        std::vector<std::vector<SearchHit>> res;
        SearchTimings t;
        const Status st = SearchShards(all.batch(), *batch.front()->opts, &res, &t);
        size_t at = 0;
        for (Request* r : batch) {
            r->st = st;
            if (st.ok()) {
                r->out->assign(std::make_move_iterator(res.begin() + at),
                               std::make_move_iterator(res.begin() + at + r->q->n_queries));
            }
            if (r->timings) *r->timings = t;  // the batch's, which it shared
            at += size_t(r->q->n_queries);
        }
    }

    Status Filter(const std::string& where, DocSet* out) const override {
        if (!metadata_) {
            return Status::NotSupported("filter: this index has no metadata (index or add documents with --metadata)");
        }
        DocSet d(metadata_->n_docs());  // the whole index's documents (its ids)
        int64_t count = 0;
        TMS_RETURN_IF_ERROR(metadata_->Filter(where, &d.bits, &count));
        *out = std::move(d);
        return Status::OK();
    }

    // The documents a search may return: opts.allow and opts.filter together (null when
    // neither is set), with *o the options the search runs with (nprobe widened for them).
    Status Resolve(const QueryBatch& q, const SearchOptions& opts, SearchOptions* o, std::optional<Allowed>* out) const {
        *o = opts;
        out->reset();
        if (!opts.allow && opts.filter.empty()) return Status::OK();
        int64_t end = 0;  // documents of this searcher's shards are below it
        for (const ShardPlacement& p : placement_) end = std::max(end, p.first_doc + p.n_docs);
        std::shared_ptr<DocSet> set;
        if (!opts.filter.empty()) {
            set = std::make_shared<DocSet>();
            TMS_RETURN_IF_ERROR(Filter(opts.filter, set.get()));
        }
        if (opts.allow) {
            const DocSet& a = *opts.allow;
            if (a.n_docs < end || a.rows < 1 || (a.rows > 1 && a.rows != q.n_queries) ||
                a.bits.size() != size_t(a.rows) * size_t(DocSet::Words(a.n_docs))) {
                return Status::InvalidArgument("allow: a set of " + std::to_string(a.rows) + " rows over " +
                                               std::to_string(a.n_docs) + " documents (" + std::to_string(a.bits.size()) +
                                               " words) for " + std::to_string(q.n_queries) + " queries over " +
                                               std::to_string(end) + " documents; want 1 or " +
                                               std::to_string(q.n_queries) + " rows of Words(n_docs) words");
            }
            if (!set) {
                set = std::const_pointer_cast<DocSet>(opts.allow);  // read only below
            } else {  // both: the filter's row and each of allow's
                auto both = std::make_shared<DocSet>(std::min(a.n_docs, set->n_docs), a.rows);
                const int64_t words = DocSet::Words(both->n_docs);
                for (int r = 0; r < a.rows; ++r)
                    for (int64_t w = 0; w < words; ++w)
                        both->bits[size_t(r) * size_t(words) + size_t(w)] = a.Row(r)[w] & set->Row(0)[w];
                if (both->n_docs % 32) {
                    for (int r = 0; r < a.rows; ++r)
                        both->bits[size_t(r + 1) * size_t(words) - 1] &= (1u << (both->n_docs % 32)) - 1u;
                }
                set = std::move(both);
            }
        }
        // Per row: a query allowed no more than direct_max documents (SearchOptions) scores
        // them all. Otherwise, allowed a share f of the documents, it finds about f of its usual
        // candidates in the lists it probes, so it probes nprobe / sqrt(f) lists (at most
        // kMaxWidenedProbes, the most the GPU's candidate generation takes). Either way its best
        // documents score closer to the rest than an unfiltered query's, so it reranks
        // rerank / sqrt(f) of them (at most kMaxWidenedRerank). The batch runs as its widest
        // row needs.
        const int64_t n = std::max<int64_t>(1, set->n_docs);
        const int64_t keeps = std::max<int64_t>({opts.ncandidates, opts.rerank, opts.k});
        const double widest = double(q.q_tokens) * kMaxWidenedProbes * double(n) / std::max(1, n_centroids());
        const double direct_max = opts.direct_max >= 0 ? double(opts.direct_max) : std::max(widest, kDirectMinDocs);
        auto direct = std::make_shared<std::vector<char>>(size_t(set->rows), 0);
        auto narrow = std::make_shared<std::vector<char>>(size_t(set->rows), 0);
        for (int r = 0; r < set->rows; ++r) {
            const int64_t c = set->Count(r);
            (*narrow)[size_t(r)] = 2 * c <= n;
            const double widen = 1.0 / std::sqrt(std::max(double(c), 1.0) / double(n));
            if (opts.rerank > 0) {
                const double wide = std::min<double>({std::ceil(opts.rerank * widen), double(c), kMaxWidenedRerank});
                o->rerank = std::max(o->rerank, int(wide));
            }
            (*direct)[size_t(r)] = c <= keeps || double(c) <= direct_max;
            if ((*direct)[size_t(r)] || opts.nprobe >= kMaxWidenedProbes) continue;
            o->nprobe = std::max(o->nprobe, int(std::min<double>(kMaxWidenedProbes, std::ceil(opts.nprobe * widen))));
        }
        Allowed al;
        al.set = set;
        al.direct_rows = direct;
        al.narrow_rows = narrow;
        *out = std::move(al);
        return Status::OK();
    }
    static constexpr int kMaxWidenedRerank = 4096;
    // Scoring this many allowed documents for every query of a batch of 256 takes ~65 ms on
    // one GPU, and probing finds a narrow filter's documents poorly where they cluster in topics
    // (a 5% filter of 1M synthetic documents, 131,072 centroids: recall@10 0.36 probing, above
    // 0.99 scoring all): the default direct_max never goes below it, whatever the centroid
    // count makes the widest probing cost.
    static constexpr double kDirectMinDocs = 65536;

    Status SearchShards(const QueryBatch& q, const SearchOptions& opts_in, std::vector<std::vector<SearchHit>>* results,
                        SearchTimings* timings) const {
        SearchOptions opts;
        std::optional<Allowed> allowed;
        TMS_RETURN_IF_ERROR(Resolve(q, opts_in, &opts, &allowed));
        const Allowed* al = allowed ? &*allowed : nullptr;
        if (segments_.size() == 1 && (!al || opts.exhaustive)) return segments_[0]->Search(q, opts, results, timings, al);
        if (!opts.exhaustive) {
            TMS_RETURN_IF_ERROR(validate_search(info_, q, opts));
            // Capped by the index's size, as ShardSearcher::Search caps them.
            const int64_t n_docs = std::max<int64_t>(1, info_.n_docs);
            opts.k = int(std::min<int64_t>(opts.k, n_docs));
            opts.rerank = int(std::min<int64_t>(opts.rerank, n_docs));
            return search_cut(segment_ptrs(), by_device_, info_.n_docs, n_centroids(), q, opts, Status::OK(), nullptr,
                              results, timings, al);
        }
        const auto t0 = Clock::now();
        const size_t n = segments_.size();
        std::vector<std::vector<std::vector<SearchHit>>> parts(n);
        std::vector<SearchTimings> ts(n);
        // Exhaustive search: each segment's exact top-k, merged.
        const std::vector<Status> sts = run_on_devices(
            by_device_, n, [&](size_t s) { return segments_[s]->Search(q, opts, &parts[s], &ts[s], al); });
        for (size_t s = 0; s < n; ++s) TMS_RETURN_IF_ERROR(sts[s]);
        const int k = int(std::min<int64_t>(opts.k, std::max<int64_t>(1, info_.n_docs)));
        MergeHits(&parts, q.n_queries, k, results);
        if (timings) {
            // Each step: summed over a device's shards (they run in turn), the slowest device.
            SearchTimings t;
            for (const auto& group : by_device_) {
                SearchTimings d;
                for (size_t s : group) {
                    d.candidates += ts[s].candidates;
                    d.scoring += ts[s].scoring;
                    d.rerank += ts[s].rerank;
                }
                t.candidates = std::max(t.candidates, d.candidates);
                t.scoring = std::max(t.scoring, d.scoring);
                t.rerank = std::max(t.rerank, d.rerank);
            }
            t.total = SecondsSince(t0);
            *timings = t;
        }
        return Status::OK();
    }

    Status Rerank(const QueryBatch& q, const std::vector<std::vector<int64_t>>& candidates, int k,
                  std::vector<std::vector<SearchHit>>* results) const override {
        TMS_RETURN_IF_ERROR(validate_search(info_, q, SearchOptions{}));  // the queries' shape and lengths
        if (int64_t(candidates.size()) != q.n_queries) {
            return Status::InvalidArgument(std::to_string(candidates.size()) + " candidate lists for " +
                                           std::to_string(q.n_queries) + " queries");
        }
        if (k < 0) return Status::InvalidArgument("k must be >= 0, got " + std::to_string(k));
        for (const auto& sh : segments_) TMS_RETURN_IF_ERROR(sh->CheckExact());
        TMS_RETURN_IF_ERROR(check_finite(q));
        const int nq = q.n_queries;
        // Each query's candidates, once each, ascending (so that each shard's are contiguous).
        std::vector<std::vector<int64_t>> cand(static_cast<size_t>(nq));
        for (int i = 0; i < nq; ++i) {
            cand[size_t(i)] = candidates[size_t(i)];
            auto& c = cand[size_t(i)];
            std::sort(c.begin(), c.end());
            c.erase(std::unique(c.begin(), c.end()), c.end());
            if (!c.empty() && (c.front() < 0 || c.back() >= info_.n_docs)) {
                return Status::InvalidArgument("query " + std::to_string(i) + ": candidate id " +
                                               std::to_string(c.front() < 0 ? c.front() : c.back()) + " outside [0, " +
                                               std::to_string(info_.n_docs) + ")");
            }
        }
        // Each shard's hits (parts[s][q]), merged as a search's are.
        std::vector<std::vector<std::vector<SearchHit>>> parts;
        for (const auto& sh : segments_) {
            const index::IndexData& d = sh->data_;
            std::vector<int64_t> off(1, 0);
            std::vector<int32_t> docs;
            for (int i = 0; i < nq; ++i) {
                const auto& c = cand[size_t(i)];
                const auto lo = std::lower_bound(c.begin(), c.end(), d.first_doc);
                const auto hi = std::lower_bound(lo, c.end(), d.first_doc + d.info.n_docs);
                for (auto it = lo; it != hi; ++it) {
                    const int32_t local = int32_t(*it - d.first_doc);
                    if (!d.deleted[size_t(local)]) docs.push_back(local);
                }
                off.push_back(int64_t(docs.size()));
            }
            if (docs.empty()) continue;
            std::vector<float> scores;
            TMS_RETURN_IF_ERROR(sh->ExactLocal(q, off, docs, &scores));
            auto& part = parts.emplace_back(static_cast<size_t>(nq));
            for (int i = 0; i < nq; ++i) {
                for (int64_t e = off[size_t(i)]; e < off[size_t(i) + 1]; ++e) {
                    part[size_t(i)].push_back(
                        {d.doc_ids[size_t(docs[size_t(e)])], d.first_doc + docs[size_t(e)], scores[size_t(e)]});
                }
            }
        }
        MergeHits(&parts, nq, k > 0 ? k : std::numeric_limits<int>::max(), results);
        for (int i = 0; q.lengths && i < nq; ++i)
            if (q.lengths[i] == 0) (*results)[size_t(i)].clear();  // a query of no tokens matches nothing
        return Status::OK();
    }

    void FindDocs(const std::vector<std::string>& doc_ids, std::vector<int64_t>* internal_ids) const override {
        std::call_once(by_id_once_, [this] {
            for (const auto& sh : segments_) {
                const index::IndexData& d = sh->data_;
                for (int64_t i = 0; i < d.info.n_docs; ++i)
                    if (!d.deleted[size_t(i)]) by_id_.emplace(d.doc_ids[size_t(i)], d.first_doc + i);
            }
        });
        internal_ids->resize(doc_ids.size());
        for (size_t i = 0; i < doc_ids.size(); ++i) {
            const auto it = by_id_.find(doc_ids[i]);
            (*internal_ids)[i] = it == by_id_.end() ? -1 : it->second;
        }
    }

    std::vector<const ShardSearcher*> segment_ptrs() const {
        std::vector<const ShardSearcher*> out;
        for (const auto& sg : segments_) out.push_back(sg.get());
        return out;
    }
    int n_centroids() const { return segments_.empty() ? 0 : segments_[0]->data_.model.n_centroids; }

    IndexInfo info_;
    std::unique_ptr<index::MetadataSnapshot> metadata_;  // null: the index has no metadata
    RecallEstimate estimate_;  // the index's, when it has one
    bool tune_ = false;        // estimate_ applies: it has points and the vectors are loaded
    Device device_ = Device::kCpu;
    std::vector<ShardPlacement> placement_;
    bool gather_ = true;  // SearcherOptions::gather
    int gather_us_ = 0;   // SearcherOptions::gather_us
    mutable std::mutex gather_mu_;
    mutable std::condition_variable leader_cv_;  // the leader's: arrivals, the search in flight ended
    mutable std::vector<Request*> pending_;
    mutable bool leading_ = false;
    mutable int running_ = 0;  // gathered searches in flight (at most one)
    mutable std::once_flag by_id_once_;
    mutable std::unordered_map<std::string, int64_t> by_id_;  // FindDocs' lookup, built once
    std::vector<std::unique_ptr<ShardSearcher>> segments_;
    std::vector<std::vector<size_t>> by_device_;  // segments per device (one group: the CPU)
};

// GPUs for the shards: opts.gpus (each present) or every visible one.
Status choose_gpus(const SearcherOptions& opts, std::vector<int>* gpus) {
    int n = 0;
    TMS_RETURN_IF_ERROR(engine::GpuDeviceCount(&n));
    gpus->clear();
    if (opts.gpus.empty()) {
        for (int g = 0; g < n; ++g) gpus->push_back(g);
        return Status::OK();
    }
    for (int g : opts.gpus) {
        if (g < 0 || g >= n) {
            return Status::InvalidArgument("GPU " + std::to_string(g) + " is not present (" + std::to_string(n) +
                                           " visible: " + (n ? "0-" + std::to_string(n - 1) : std::string("none")) + ")");
        }
        if (std::find(gpus->begin(), gpus->end(), g) != gpus->end()) {
            return Status::InvalidArgument("GPU " + std::to_string(g) + " is listed twice");
        }
        gpus->push_back(g);
    }
    return Status::OK();
}

// Shards in order onto the GPUs in order, cut where the running byte count passes each GPU's
// even share (a shard goes where its middle byte falls): each GPU holds consecutive shards,
// searched as one, and about the same bytes.
std::vector<int> place_by_size(const std::vector<int64_t>& bytes, const std::vector<int>& gpus) {
    int64_t total = 0;
    for (int64_t b : bytes) total += b;
    std::vector<int> out(bytes.size(), -1);
    const int64_t g = int64_t(gpus.size());
    int64_t before = 0;
    for (size_t s = 0; s < bytes.size(); ++s) {
        const double middle = double(before) + 0.5 * double(bytes[s]);
        const int64_t at = total > 0 ? int64_t(middle * double(g) / double(total)) : int64_t(s) * g / int64_t(bytes.size());
        out[s] = gpus[size_t(std::clamp<int64_t>(at, 0, g - 1))];
        before += bytes[s];
    }
    return out;
}

}  // namespace

Searcher::~Searcher() = default;

int64_t DocSet::Count(int r) const {
    int64_t n = 0;
    const uint32_t* row = Row(r);
    for (int64_t w = 0; w < Words(n_docs); ++w) n += __builtin_popcount(row[w]);
    return n;
}
SearchCuts::~SearchCuts() = default;

Status SearchWithCuts(const Searcher* searcher, const QueryBatch& q, const SearchOptions& opts, SearchCuts* cuts,
                      std::vector<std::vector<SearchHit>>* results, SearchTimings* timings) {
    if (cuts == nullptr) return Status::InvalidArgument("SearchWithCuts: no cuts");
    const auto* s = dynamic_cast<const ShardedSearcher*>(searcher);
    if (searcher && !s) return Status::InvalidArgument("SearchWithCuts: not a Searcher of this library");
    if (opts.exhaustive) {  // exact per participant: no cuts
        if (s) return s->Search(q, opts, results, timings);
        results->assign(size_t(std::max(q.n_queries, 0)), {});
        return Status::OK();
    }
    Status st;
    std::vector<const ShardSearcher*> segs;
    std::vector<std::vector<size_t>> groups;
    SearchOptions o = opts;
    std::optional<Allowed> allowed;
    if (s) {
        st = validate_search(s->info_, q, opts);
        if (st.ok()) st = check_finite(q);
        if (st.ok()) st = s->Resolve(q, opts, &o, &allowed);
        segs = s->segment_ptrs();
        groups = s->by_device_;
    }
    TMS_RETURN_IF_ERROR(search_cut(segs, groups, cuts->n_docs(), cuts->n_centroids(), q, o, st, cuts, results,
                                   timings, allowed ? &*allowed : nullptr));
    for (int i = 0; q.lengths && i < q.n_queries; ++i)
        if (q.lengths[i] == 0) (*results)[size_t(i)].clear();  // a query of no tokens matches nothing
    return Status::OK();
}

void MergeHits(std::vector<std::vector<std::vector<SearchHit>>>* parts, int n_queries, int k,
               std::vector<std::vector<SearchHit>>* out) {
    out->assign(size_t(n_queries), {});
#pragma omp parallel for schedule(static) if (int64_t(n_queries) * k > 4096)
    for (int q = 0; q < n_queries; ++q) {
        auto& r = (*out)[q];
        for (auto& p : *parts) std::move(p[q].begin(), p[q].end(), std::back_inserter(r));
        const size_t keep = std::min(r.size(), size_t(std::max(k, 0)));
        std::partial_sort(r.begin(), r.begin() + keep, r.end(), [](const SearchHit& a, const SearchHit& b) {
            return a.score > b.score || (a.score == b.score && a.internal_id < b.internal_id);
        });
        r.resize(keep);
    }
}

namespace {

std::string gib(int64_t bytes) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f GiB", double(bytes) / double(int64_t(1) << 30));
    return b;
}

// The vectors' tier opts ask for, kAuto resolved, checked against the memory it needs (the
// opened shards' vectors; on GPUs with their codes and lists, spread evenly).
Status choose_tier(const SearcherOptions& opts, const std::string& path, Device device, const std::vector<int>& gpus,
                   VectorTier* out) {
    VectorTier want = opts.load_vectors ? opts.vectors : VectorTier::kNone;
    if (device == Device::kCpu && want == VectorTier::kGpu) want = VectorTier::kHost;  // as documented
    *out = VectorTier::kNone;
    if (want == VectorTier::kNone) return Status::OK();
    IndexInfo info;
    if (!index::ReadIndexInfo(path, &info).ok()) {
        // The whole index's metadata cannot be read (a subset of shards is opened where the
        // others are missing, or the index is damaged: the read that follows says so): the
        // vectors are read into memory, on the GPU for kAuto on a GPU, unmeasured.
        *out = want != VectorTier::kAuto ? want : device == Device::kGpu ? VectorTier::kGpu : VectorTier::kHost;
        return Status::OK();
    }
    if (!info.has_vectors) {
        if (want == VectorTier::kAuto) return Status::OK();
        return Status::NotSupported(std::string("vectors ") + VectorTierName(want) +
                                    ": this index has no stored vectors (rebuild with --keep-vectors)");
    }
    int64_t tokens = 0;
    for (size_t i = 0; i < info.shards.size(); ++i) {
        if (opts.shards.empty() || std::find(opts.shards.begin(), opts.shards.end(), int(i)) != opts.shards.end()) {
            tokens += info.shards[i].n_tokens;
        }
    }
    const int64_t vec = tokens * info.dim * 2;
    // Centroid ids and codes (the IVF lists are smaller), and the decoded tokens' scales.
    const int64_t codes = int64_t(double(tokens) * (info.code_bytes_per_token + (info.unit_norm ? 4 : 0)));
    const int64_t host_avail = HostAvailableMemory();
    int64_t gpu_free = 0;
    int free_gpu = -1;  // the GPU with the least free memory
    if (device == Device::kGpu) {
        for (int g : gpus) {
            int64_t f = 0;
            TMS_RETURN_IF_ERROR(engine::GpuFreeMemory(g, &f));
            if (free_gpu < 0 || f < gpu_free) {
                gpu_free = f;
                free_gpu = g;
            }
        }
    }
    const int64_t per_gpu = gpus.empty() ? 0 : (vec + codes) / int64_t(gpus.size());
    // kAuto leaves room (kGpuShare, kHostShare); an explicit tier needs only to fit.
    const auto gpu_fits = [&](double share) { return device == Device::kGpu && per_gpu <= share * double(gpu_free); };
    const auto host_fits = [&](double share) { return vec <= share * double(host_avail); };
    if (want == VectorTier::kAuto) {
        *out = gpu_fits(kGpuShare) ? VectorTier::kGpu : host_fits(kHostShare) ? VectorTier::kHost : VectorTier::kDisk;
        return Status::OK();
    }
    if (want == VectorTier::kGpu && !gpu_fits(0.95)) {
        return Status::ResourceExhausted("vectors gpu: " + gib(per_gpu) + " of vectors and codes per GPU do not fit in GPU " +
                                         std::to_string(free_gpu) + "'s " + gib(gpu_free) + " free; --vectors " +
                                         (host_fits(0.9) ? "host" : "disk") + " would hold them");
    }
    if (want == VectorTier::kHost && !host_fits(0.9)) {
        return Status::ResourceExhausted("vectors host: " + gib(vec) + " of vectors do not fit in the host's " +
                                         gib(host_avail) + " available; --vectors disk reads them from the index");
    }
    *out = want;
    return Status::OK();
}

}  // namespace

Status ResolveVectorTier(const SearcherOptions& opts, const std::string& path, VectorTier* out) {
    Device device;
    TMS_RETURN_IF_ERROR(engine::ResolveDevice(opts.device, &device));
    std::vector<int> gpus;
    if (device == Device::kGpu) TMS_RETURN_IF_ERROR(choose_gpus(opts, &gpus));
    return choose_tier(opts, path, device, gpus, out);
}

Status Searcher::Open(const SearcherOptions& opts, const std::string& path, std::unique_ptr<Searcher>* out) {
    if (opts.threads < 0 || opts.threads > kMaxThreads) {
        return Status::InvalidArgument("threads must be in [0, " + std::to_string(kMaxThreads) + "], got " +
                                       std::to_string(opts.threads));
    }
    if (opts.stream_bytes <= 0) {
        return Status::InvalidArgument("stream_bytes must be > 0, got " + std::to_string(opts.stream_bytes));
    }
    if (opts.gather_us < 0 || opts.gather_us > 1000000) {
        return Status::InvalidArgument("gather_us must be in [0, 1000000], got " + std::to_string(opts.gather_us));
    }
    auto s = std::make_unique<ShardedSearcher>();
    s->gather_ = opts.gather;
    s->gather_us_ = opts.gather_us;
    if (opts.threads > 0) omp_set_num_threads(opts.threads);
    index::SingleThreadedBlas();
    Trace trace = LoadTrace();
    TMS_RETURN_IF_ERROR(engine::ResolveDevice(opts.device, &s->device_));
    std::vector<int> gpus;
    if (s->device_ == Device::kGpu) TMS_RETURN_IF_ERROR(choose_gpus(opts, &gpus));
    trace.Mark("device");
    VectorTier tier;
    TMS_RETURN_IF_ERROR(choose_tier(opts, path, s->device_, gpus, &tier));
    trace.Mark("vector tier");
    std::vector<index::IndexData> data;
    // Vectors for the GPU stay in their files until they upload (read and copied at once, with
    // no host copy of the whole).
    const index::VectorLoad load = tier == VectorTier::kNone   ? index::VectorLoad::kNone
                                   : tier == VectorTier::kDisk ? index::VectorLoad::kFile
                                   : tier == VectorTier::kGpu  ? index::VectorLoad::kFileOrMemory
                                                               : index::VectorLoad::kMemory;
    TMS_RETURN_IF_ERROR(index::ReadIndexShards(path, load, opts.progress, &data, opts.shards, &s->metadata_));
    trace.Mark("read (total)");
    s->info_ = index::SumShardInfos(data);
    std::vector<int> numbers = opts.shards;  // the shards read, in shard order
    std::sort(numbers.begin(), numbers.end());
    numbers.erase(std::unique(numbers.begin(), numbers.end()), numbers.end());
    std::vector<int64_t> bytes;
    for (const auto& d : data) bytes.push_back(shard_bytes(d, tier == VectorTier::kGpu));
    const std::vector<int> where = s->device_ == Device::kGpu ? place_by_size(bytes, gpus) : std::vector<int>(data.size(), -1);
    for (size_t i = 0; i < data.size(); ++i) {
        ShardPlacement p;
        p.shard = opts.shards.empty() ? int(i) : numbers[i];
        p.device = s->device_;
        p.gpu = where[i];
        p.first_doc = data[i].first_doc;
        p.n_docs = data[i].info.n_docs;
        p.bytes = bytes[i];
        p.vectors = data[i].info.has_vectors ? tier : VectorTier::kNone;
        p.vector_bytes = p.vectors == VectorTier::kNone ? 0 : data[i].info.n_tokens * data[i].info.dim * 2;
        s->placement_.push_back(p);
    }
    // Segments: runs of consecutive shards on one device (a subset of the shards breaks runs
    // at its gaps), each concatenated into one ShardSearcher. On a GPU the vectors stay in
    // their shards' files (or arrays) until they are uploaded (no host copy of the whole).
    struct Segment {
        int gpu;
        std::vector<index::IndexData> shards;
    };
    std::vector<Segment> runs;
    for (size_t i = 0; i < data.size(); ++i) {
        const bool joins = opts.join_shards && i > 0 && where[i] == where[i - 1] &&
                           data[i].first_doc == data[i - 1].first_doc + data[i - 1].info.n_docs;
        if (!joins) runs.push_back({where[i], {}});
        runs.back().shards.push_back(std::move(data[i]));
    }
    data.clear();
    std::vector<std::vector<index::PodVector<uint16_t>>> vectors(runs.size());
    for (size_t r = 0; r < runs.size(); ++r) {
        auto sh = std::make_unique<ShardSearcher>();
        index::ConcatShards(&runs[r].shards, &sh->data_, s->device_ == Device::kGpu ? &vectors[r] : nullptr);
        sh->stream_bytes_ = opts.stream_bytes;
        s->segments_.push_back(std::move(sh));
    }
    trace.Mark("segments");
    // One context per GPU, shared by its segments; GPUs are filled side by side (one thread each).
    if (s->device_ == Device::kGpu) {
        std::vector<std::shared_ptr<kernels::GpuContext>> ctx(gpus.size());
        std::vector<size_t> ctx_of;  // by_device_ group -> index into gpus
        for (size_t g = 0; g < gpus.size(); ++g) {
            std::vector<size_t> mine;
            for (size_t r = 0; r < runs.size(); ++r)
                if (runs[r].gpu == gpus[g]) mine.push_back(r);
            if (mine.empty()) continue;
            TMS_RETURN_IF_ERROR(engine::MakeGpuContext(gpus[g], &ctx[g]));
            s->by_device_.push_back(mine);
            ctx_of.push_back(g);
        }
        std::vector<Status> sts(s->by_device_.size());
        std::vector<std::thread> up;
        for (size_t gi = 0; gi < s->by_device_.size(); ++gi) {
            up.emplace_back([&, gi] {
                for (size_t r : s->by_device_[gi]) {
                    sts[gi] = s->segments_[r]->Place(ctx[ctx_of[gi]], opts.warm_up, tier, &vectors[r]);
                    if (!sts[gi].ok()) return;
                }
            });
        }
        for (auto& t : up) t.join();
        for (const Status& st : sts) TMS_RETURN_IF_ERROR(st);
    } else {
        s->by_device_.emplace_back();
        for (size_t r = 0; r < s->segments_.size(); ++r) {
            TMS_RETURN_IF_ERROR(s->segments_[r]->Place(nullptr, false, tier, &vectors[r]));
            s->by_device_[0].push_back(r);
        }
        // Every searching thread runs BLAS products (the centroid scores).
        TMS_RETURN_IF_ERROR(kernels::check_blas_room(omp_get_max_threads(), int64_t(32) << 20, path));
    }
    if (s->device_ == Device::kGpu) trace.Mark("gpu upload and warm-up");
    const Status est = ReadRecallEstimate(path, &s->estimate_);
    if (!est.ok() && est.code() != Status::Code::kNotFound) return est;
    s->tune_ = est.ok() && tier != VectorTier::kNone && !s->estimate_.points.empty();
    *out = std::move(s);
    return Status::OK();
}

}  // namespace tms

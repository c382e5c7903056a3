// Copyright TileMaxSim authors. One device's documents (ShardSearcher): its stages of the query
// pipeline and the types they pass between them. A batch flows through one file per stage:
//   candidates.cpp   centroid scores (BLAS) -> per-token top-nprobe centroids -> the documents
//                    the probes reach (IVF union), pruned to ncandidates (probe scores, or the
//                    union's centroid interaction);
//   compressed.cpp   compressed scoring (codes) of the candidates, each query's best `rerank`;
//   rerank.cpp       exact MaxSim of those on the stored vectors (resident, or rows read from
//                    the host or disk tier);
//   topk.cpp         top-k selection and the merge of partial top-k lists;
// pipeline.cpp runs them for a batch over one segment or several (devices, MPI participants),
// the candidates cut together between stages; exhaustive.cpp scores every document instead;
// searcher.cpp is the public Searcher over the placed shards. Each stage runs on the GPU of the
// shard (engine::GpuShard) or on the host (kernels' CPU paths).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/cuts.h"
#include "tilemaxsim/searcher.h"

#include "engine/gpu_shard.h"
#include "engine/vector_rows.h"
#include "index/index_data.h"
#include "kernels/candidates.h"
#include "kernels/cuda/gpu_context.h"
#include "kernels/maxsim.h"

namespace tms::engine {

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

// One segment's state through the stages of a pass (ShardSearcher's PruneStage,
// CompressedStage, RerankStage; pipeline.cpp).
struct SegmentCall {
    // The pass's only segment, of its only participant, unfiltered: nothing is cut between its
    // stages, so on a GPU the candidate lists stay on the device from the pruning to the
    // compressed scoring (only each query's best come back), and the device is held from the
    // first stage to the last (`held`). Otherwise each stage returns its lists to the host and
    // holds the device for its own step.
    bool alone = false;
    std::unique_lock<std::mutex> held;
    std::vector<float> qconv;  // the queries as fp32, when they are not and the host needs them
    std::vector<float> cs;     // the host's centroid scores (host candidate generation)
    bool on_gpu = false;       // candidates were generated (and are scored) on the GPU
    uint64_t ticket = 0;       // that generation's device state (GpuCodeScorer::ScoreLists)
    Lists lists;
    // Certification (pipeline.cpp): the candidates' probe scores come back to the host even when
    // alone, with each query's frame (empty where the pruning is not by probe scores).
    bool certify = false;
    std::vector<kernels::ProbeFrame> frames;
};

// The queries as fp32 on the host: q's own data, or its conversion into *conv.
inline const float* HostF32(const QueryBatch& q, std::vector<float>* conv) {
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
        : row_(size_t(shape.q_tokens) * size_t(shape.dim) * size_t(DTypeSize(shape.dtype))),
          data_(size_t(n) * row_),
          lengths_(shape.lengths ? size_t(n) : 0),
          batch_(shape) {
        batch_.data = data_.data();
        batch_.n_queries = n;
        batch_.lengths = shape.lengths ? lengths_.data() : nullptr;
    }
    QueryCopy(const QueryCopy&) = delete;
    QueryCopy& operator=(const QueryCopy&) = delete;
    /// Queries [first, first + n) of src, after those appended before.
    void Append(const QueryBatch& src, int first, int n) {
        std::memcpy(data_.data() + at_ * row_, static_cast<const char*>(src.data) + size_t(first) * row_,
                    size_t(n) * row_);
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
    /// The consecutive shards `shards` (moved from) as one segment (index::ConcatShards);
    /// vector_parts: as ConcatShards' (their vectors left in parts, for Place), or null.
    /// stream_bytes: SearcherOptions::stream_bytes.
    ShardSearcher(std::vector<index::IndexData>* shards, std::vector<index::PodVector<uint16_t>>* vector_parts,
                  int64_t stream_bytes);
    ShardSearcher(const ShardSearcher&) = delete;
    ShardSearcher& operator=(const ShardSearcher&) = delete;
    /// Its documents' counts (n_deleted: of deleted()).
    const IndexInfo& info() const { return info_; }
    /// The segment's documents: ids, offsets, model, codes (read only). Its tombstones are
    /// deleted(), not data().deleted (the ones its IVF lists skip, as placed).
    const index::IndexData& data() const { return p_->data; }
    /// Its tombstones [n_docs] (a deleted document is never returned).
    const std::vector<char>& deleted() const { return deleted_; }
    /// The same placed documents (their memory shared, on the host and the GPU) with the
    /// tombstones `deleted` [n_docs], a superset of data().deleted: a searcher refreshed after
    /// deletions. The ones its IVF lists still hold are kept from every candidate list.
    std::unique_ptr<ShardSearcher> WithTombstones(std::vector<char> deleted) const;
    /// The GPU it is on (null: the host).
    const std::shared_ptr<kernels::GpuContext>& context() const { return ctx_; }
    /// This segment alone: approximate search is the pipeline's pass over one segment
    /// (search_cut), exhaustive search Exhaustive's.
    Status Search(const QueryBatch& queries, const SearchOptions& opts, std::vector<std::vector<SearchHit>>* results,
                  SearchTimings* timings, const Allowed* allowed = nullptr) const;

    /// One search of 256 synthetic queries of 32 tokens (centroids as tokens), results dropped,
    /// as fp32 and as fp16 (the GPU scorers take 16-bit queries as they are, through other
    /// kernel instances): loads the kernels and sizes the scratch buffers of the default batch
    /// shape.
    Status WarmUp() const {
        const int nq = 256, qt = 32, dim = info_.dim, K = p_->data.model.n_centroids;
        std::vector<float> q(size_t(nq) * qt * dim);
        for (int64_t r = 0; r < int64_t(nq) * qt; ++r) {
            const float* c = p_->data.model.centroids.data() + size_t(r * 7919 % K) * dim;
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
    bool have_vectors() const { return gpu_exact() || !p_->data.vectors.empty() || !p_->rows.empty(); }
    Status CheckExact() const {
        if (have_vectors()) return Status::OK();
        return Status::NotSupported(
            info_.has_vectors ? "rerank needs the stored vectors, which were not loaded"
                              : "rerank needs stored vectors: this index has none (rebuild with --keep-vectors)");
    }
    /// The stored rows of local document `doc` into *out ([tokens, dim] fp16 bits), from host
    /// memory or the vectors files; NotSupported when they are only on the GPU.
    Status DocRows(int32_t doc, std::vector<uint16_t>* out) const;
    /// Local document `doc`'s tokens decoded from its codes (centroid plus residual; scaled to
    /// unit norm where the codec scores them so), [tokens, dim] fp32, into *out.
    void DecodedRows(int32_t doc, std::vector<float>* out) const;
    /// Vectors not where scoring runs (host or disk tier on a GPU, disk tier on the CPU): each
    /// exact step reads its documents' rows through the placed rows.
    bool streamed() const { return !p_->rows.empty(); }

    // The stages of the approximate search (pipeline.cpp runs them, on every segment at once,
    // cutting the candidates of all segments and participants together between them; see
    // SegmentCall for the one segment alone).
    /// The documents the probes reach, each query's cut to its ncandidates best by pruning
    /// score (c->lists.scores), or all of them (no scores) when ncandidates == 0. With
    /// `allowed`: only allowed documents; a query allowed few (Allowed::direct) gets them all,
    /// each with pruning score 0. c->alone on a GPU: the lists stay there (c->lists.off only).
    Status PruneStage(const QueryBatch& q, const SearchOptions& opts, SegmentCall* c,
                      const Allowed* allowed = nullptr) const;
    /// Compressed scores of c's lists, each query's `keep` best.
    Status CompressedStage(const QueryBatch& q, int keep, SegmentCall* c) const;
    /// Exact scores of c's lists (CheckExact first).
    Status RerankStage(const QueryBatch& q, SegmentCall* c) const;
    /// The device for one stage of `c` (nothing on the CPU): when `c` is alone, taken at its
    /// first stage into c->held for the whole pass (and nothing returned); otherwise, unless
    /// held already, locked for this stage by the lock returned.
    std::unique_lock<std::mutex> LockDevice(SegmentCall* c, bool first_stage = false) const {
        if (!ctx_) return {};
        if (first_stage && c->alone) c->held = std::unique_lock<std::mutex>(ctx_->mutex());
        if (c->held.owns_lock()) return {};
        return std::unique_lock<std::mutex>(ctx_->mutex());
    }
    /// Exhaustive search of a validated batch with options capped by the index's size, in
    /// chunks of chunk_queries.
    Status Exhaustive(const QueryBatch& queries, const SearchOptions& opts,
                      std::vector<std::vector<SearchHit>>* results, SearchTimings* timings,
                      const Allowed* allowed) const;

    /// Puts the shard on the GPU of `ctx` (null: it stays on the host) and warms it up;
    /// `vector_parts`: its vectors when data() holds none (ConcatShards'): uploaded and freed
    /// (tier kGpu), or kept on the host (kHost). A segment on disk (kDisk) reads
    /// p_->data.vector_files.
    Status Place(std::shared_ptr<kernels::GpuContext> ctx, bool warm_up, VectorTier tier,
                 std::vector<index::PodVector<uint16_t>>* vector_parts);

private:
    ShardSearcher() = default;
    /// scales for the host path (IndexModel::unit_norm with codes), when the codes stay here.
    Status HostScales();

    // What the segment holds once placed, shared by its views (WithTombstones).
    struct Placed {
        index::IndexData data;  // data.deleted: the tombstones its IVF lists skip
        // The host path's token_scales (IndexModel::unit_norm; the GPU shard holds its own).
        index::PodVector<float> scales;
        // Streamed tiers: where the rows are read from (host_parts on a GPU's host tier, else
        // data.vector_files).
        engine::VectorRows rows;
        std::vector<index::PodVector<uint16_t>> host_parts;
        // host_parts are registered with the GPU: it reads the rows a step needs itself.
        bool mapped = false;
        std::unique_ptr<engine::GpuShard> dev;  // the shard's data on its GPU
    };
    std::shared_ptr<Placed> p_ = std::make_shared<Placed>();
    IndexInfo info_;             // p_->data.info, n_deleted of deleted_
    std::vector<char> deleted_;  // this view's tombstones
    // Where the IVF lists hold documents of deleted_: the live documents' bitmap, which every
    // candidate generation is restricted to (empty otherwise).
    std::vector<uint32_t> live_;
    int64_t stream_bytes_ = 0;  // SearcherOptions::stream_bytes
    // The GPU scorers run on the context's stream with its shared scratch, and keep per-call
    // state (device lists between Candidates and ScoreCandidatesTop): a search holds the
    // context's mutex.
    std::shared_ptr<kernels::GpuContext> ctx_;
    bool gpu_codes() const { return p_->dev && p_->dev->has_codes(); }
    bool gpu_exact() const { return p_->dev && p_->dev->has_vectors(); }

    /// On the host: centroid scores (*cs), probing, and the documents the probes reach, cut to
    /// ncandidates per query by probe score (kProbe) or, when a query has more than ncandidates
    /// (or cut_all), by centroid-only score (kInteraction): lists->scores then holds the
    /// pruning scores, else it is empty.
    /// allow, allow_stride: kernels::IvfUnionParams's (local ids). frames (kProbe): each query's
    /// kernels::ProbeFrame.
    Status HostCandidates(const float* qf, const QueryBatch& q, const SearchOptions& opts, bool cut_all,
                          std::vector<float>* cs, Lists* lists, const uint32_t* allow = nullptr,
                          int64_t allow_stride = 0, std::vector<kernels::ProbeFrame>* frames = nullptr) const;
    /// The allowed documents of this segment for the batch's queries (local ids): one row of
    /// bitmap_words(n_docs) words for every query, or one per query (per_query()).
    std::vector<uint32_t> LocalAllow(const Allowed& a, int n_queries) const;
    /// Query q's row of `local` (LocalAllow's).
    const uint32_t* AllowRow(const std::vector<uint32_t>& local, const Allowed& a, int q) const {
        return local.data() + (a.per_query() ? size_t(q) * size_t(kernels::bitmap_words(info_.n_docs)) : 0);
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
    // the placed rows, each chunk's top-k merged into the whole's.
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
            return {
                tokens,        offsets.data(), int64_t(offsets.size()) - 1, sources.empty() ? nullptr : sources.data(),
                device_tokens, ready};
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
        p.dim = info_.dim;
        p.query_lens = lens;
        p.doc_tokens = p_->data.vectors.data();
        p.d_dtype = DType::kF16;
        p.doc_offsets = p_->data.doc_offsets.data();
        p.n_docs = info_.n_docs;
        return p;
    }
    // qf: the queries as fp32 on the host; read only without a GPU (which takes q as it is).
    Status exact_candidates(const float* qf, const QueryBatch& q, const std::vector<int64_t>& off,
                            const std::vector<int32_t>& docs, std::vector<float>* scores) const;
};

// Top-k per segment on the CPU (kernels::topk_cpu): offsets == nullptr means dense rows of row_len.
Status select_topk(const float* scores, const int64_t* offsets, int64_t row_len, int64_t n_segments, const int32_t* ids,
                   int k, int32_t* out_ids, float* out_scores);
// Keeps the top `keep` candidates of each query by score: rewrites (off, docs, scores).
Status select_top(int n_queries, int keep, std::vector<int64_t>* off, std::vector<int32_t>* docs,
                  std::vector<float>* scores);
Status select_top(int n_queries, int keep, Lists* l);
// Merges a chunk's top-k (ids local to the chunk, plus `base`) into the running top-k of one
// query (ids, scores): best first, ties to the lower id, -1 / -inf padding last.
void merge_top(int k, int32_t* ids, float* scores, const int32_t* c_ids, const float* c_scores, int32_t base);

// A request's shape and options in range for an index of `info`'s dimension.
Status validate_search(const IndexInfo& info, const QueryBatch& q, const SearchOptions& opts);
// The first non-finite value among the used token rows of a batch, as an error naming the query.
Status check_finite(const QueryBatch& q);
// Queries searched together (SearchOptions::max_batch_queries, or what bounds the per-batch
// scores; shard_searcher.cpp).
int64_t chunk_queries(const SearchOptions& opts, int q_tokens, int n_centroids, int64_t n_docs);
// Bytes a shard holds once loaded: codes, centroid ids and scales, IVF lists, vectors (with
// `file_vectors`, those still in their files, which the GPU tier uploads).
int64_t shard_bytes(const index::IndexData& d, bool file_vectors);

// step(i) for every segment i of `groups` (segment indices per device, n in all), the devices at
// once (pipeline.cpp).
std::vector<Status> run_on_devices(const std::vector<std::vector<size_t>>& groups, size_t n,
                                   const std::function<Status(size_t)>& step);
// The approximate search of segments `segs` cut together between stages (pipeline.cpp).
Status search_cut(const std::vector<const ShardSearcher*>& segs, const std::vector<std::vector<size_t>>& groups,
                  int64_t n_docs, int n_centroids, const QueryBatch& q, const SearchOptions& opts, Status st,
                  SearchCuts* cuts, std::vector<std::vector<SearchHit>>* results, SearchTimings* timings,
                  const Allowed* allowed = nullptr);

}  // namespace tms::engine

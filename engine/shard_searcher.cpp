// Copyright TileMaxSim authors. One segment searched alone (the pipeline's pass over it, or
// exhaustive search), its placement on a device, and request checks (engine/shard_searcher.h).
#include "engine/shard_searcher.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/progress.h"
#include "engine/backend.h"
#include "engine/plan.h"
#include "index/ingest/input_checks.h"
#include "index/store/shards.h"
#include "kernels/maxsim.h"

namespace tms::engine {

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
                return Status::InvalidArgument("query " + std::to_string(i) + ": length " +
                                               std::to_string(q.lengths[i]) + " outside [0, " +
                                               std::to_string(q.q_tokens) + "]");
            }
        }
    }
    if (opts.nprobe <= 0) return Status::InvalidArgument("nprobe must be > 0");
    if (opts.ncandidates < 0 || opts.rerank < 0) return Status::InvalidArgument("ncandidates and rerank must be >= 0");
    if (opts.certify_steps < -1 || opts.certify_steps > 8) {
        return Status::InvalidArgument("certify_steps must be in [-1, 8], got " + std::to_string(opts.certify_steps));
    }
    if (opts.max_batch_queries < 0) return Status::InvalidArgument("max_batch_queries must be >= 0");
    return Status::OK();
}

ShardSearcher::ShardSearcher(std::vector<index::IndexData>* shards,
                             std::vector<index::PodVector<uint16_t>>* vector_parts, int64_t stream_bytes)
    : stream_bytes_(stream_bytes) {
    index::ConcatShards(shards, &p_->data, vector_parts);
    info_ = p_->data.info;
    deleted_ = p_->data.deleted;
}

std::unique_ptr<ShardSearcher> ShardSearcher::WithTombstones(std::vector<char> deleted) const {
    std::unique_ptr<ShardSearcher> v(new ShardSearcher());
    v->p_ = p_;
    v->stream_bytes_ = stream_bytes_;
    v->ctx_ = ctx_;
    v->info_ = info_;
    v->info_.n_deleted = std::count(deleted.begin(), deleted.end(), char(1));
    const std::vector<char>& skipped = p_->data.deleted;  // the IVF lists hold every other document
    bool late = false;
    for (size_t d = 0; d < deleted.size() && !late; ++d) late = deleted[d] && !skipped[d];
    if (late) {
        const int64_t n = info_.n_docs;
        v->live_.assign(size_t(kernels::bitmap_words(n)), 0u);
        for (int64_t d = 0; d < n; ++d)
            if (!deleted[size_t(d)]) v->live_[size_t(d / 32)] |= 1u << (d % 32);
    }
    v->deleted_ = std::move(deleted);
    return v;
}

Status ShardSearcher::Search(const QueryBatch& q, const SearchOptions& opts,
                             std::vector<std::vector<SearchHit>>* results, SearchTimings* timings,
                             const Allowed* allowed) const {
    const IndexInfo& info = info_;
    TMS_RETURN_IF_ERROR(validate_search(info, q, opts));
    // No request asks for more than the index holds: k, rerank and candidates beyond the
    // number of documents would only size buffers (k = 10^8 over 300 documents: gigabytes).
    const int64_t n_docs = std::max<int64_t>(1, info.n_docs);
    SearchOptions capped = opts;
    capped.k = int(std::min<int64_t>(opts.k, n_docs));
    capped.rerank = int(std::min<int64_t>(opts.rerank, n_docs));
    capped.ncandidates = int(std::min<int64_t>(opts.ncandidates, n_docs));
    if (capped.exhaustive) return Exhaustive(q, capped, results, timings, allowed);
    return search_cut({this}, {{0}}, info.n_docs, info.n_centroids, q, capped, Status::OK(), nullptr, results, timings,
                      allowed);
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

Status ShardSearcher::Exhaustive(const QueryBatch& q, const SearchOptions& opts,
                                 std::vector<std::vector<SearchHit>>* results, SearchTimings* timings,
                                 const Allowed* allowed) const {
    const auto t_start = Clock::now();
    const IndexInfo& info = info_;
    if (!have_vectors()) {
        return Status::NotSupported(
            info.has_vectors
                ? "exhaustive search needs the stored vectors, which were not loaded"
                : "exhaustive search needs stored vectors: this index has none (rebuild with --keep-vectors)");
    }
    std::unique_lock<std::mutex> gpu_lock;
    if (ctx_) gpu_lock = std::unique_lock<std::mutex>(ctx_->mutex());
    const int k = opts.k;
    const int64_t chunk = chunk_queries(opts, q.q_tokens, info.n_centroids, info.n_docs);
    results->assign(size_t(q.n_queries), {});
    // TMS_TRACE_SEARCH=1: host time of each step of the batch on stderr.
    Trace trace("TMS_TRACE_SEARCH", "search", Trace::Unit::kMilliseconds);
    SearchTimings t;
    for (int64_t q0 = 0; q0 < q.n_queries; q0 += chunk) {
        const int nq = int(std::min<int64_t>(chunk, q.n_queries - q0));
        const QueryBatch b = q.Slice(int(q0), nq);
        const Allowed a = allowed ? allowed->From(int(q0)) : Allowed{};
        // fp32 queries are used in place; fp16 / bf16 ones are converted for the host only
        // (the GPU scorers take them as they are).
        std::vector<float> qconv;
        std::vector<int32_t> top_ids;
        std::vector<float> top_scores;
        const auto t0 = Clock::now();
        TMS_RETURN_IF_ERROR(exhaustive(gpu_exact() ? nullptr : HostF32(b, &qconv), b, k, &top_ids, &top_scores,
                                       allowed ? &a : nullptr));
        t.scoring += SecondsSince(t0);
        trace.Mark("exhaustive");
#pragma omp parallel for schedule(static) if (int64_t(nq) * k > 4096)
        for (int qi = 0; qi < nq; ++qi) {
            auto& r = (*results)[size_t(q0 + qi)];
            r.reserve(size_t(std::min<int64_t>(k, info.n_docs)));
            for (int j = 0; j < k; ++j) {
                const int32_t id = top_ids[size_t(qi) * k + j];
                if (id < 0 || deleted_[id]) break;  // padding; deleted documents rank last (-inf)
                r.push_back({p_->data.doc_ids[id], p_->data.first_doc + id, top_scores[size_t(qi) * k + j]});
            }
        }
        trace.Mark("results");
    }
    t.total = SecondsSince(t_start);
    if (timings) *timings = t;
    return Status::OK();
}

Status ShardSearcher::Place(std::shared_ptr<kernels::GpuContext> ctx, bool warm_up, VectorTier tier,
                            std::vector<index::PodVector<uint16_t>>* vector_parts) {
    p_->rows.dim = info_.dim;
    for (const index::VectorFileSpan& f : p_->data.vector_files) p_->rows.AddFile(f);
    if (!ctx) return HostScales();
    ctx_ = ctx;
    const std::vector<index::PodVector<uint16_t>> none;
    const bool to_gpu = tier == VectorTier::kGpu;
    TMS_RETURN_IF_ERROR(
        engine::MakeGpuShard(ctx, p_->data, to_gpu ? *vector_parts : none, to_gpu ? &p_->rows : nullptr, &p_->dev));
    // The device copy is the one used (MakeGpuShard uploads every vector it is given).
    if (p_->dev->has_vectors()) {
        index::PodVector<uint16_t>().swap(p_->data.vectors);
        p_->rows = engine::VectorRows();
        p_->data.vector_files.clear();
    }
    if (tier == VectorTier::kHost) {
        p_->host_parts = std::move(*vector_parts);
        int64_t t0 = 0;
        p_->mapped = true;
        for (const auto& part : p_->host_parts) {
            const int64_t n = int64_t(part.size()) / info_.dim;
            p_->rows.AddHost(t0, part.data(), n);
            p_->mapped = p_->dev->RegisterHost(part.data(), part.size() * sizeof(uint16_t)) && p_->mapped;
            t0 += n;
        }
    }
    vector_parts->clear();
    if (!gpu_codes()) TMS_RETURN_IF_ERROR(HostScales());
    if (warm_up && info_.n_docs > 0) TMS_RETURN_IF_ERROR(WarmUp());
    return Status::OK();
}

Status ShardSearcher::HostScales() {
    const index::IndexModel& m = p_->data.model;
    if (!m.unit_norm || m.n_code_bytes == 0) return Status::OK();
    kernels::DecodedScaleParams p;
    p.centroids = m.centroids.data();
    p.n_centroids = m.n_centroids;
    p.dim = m.dim;
    p.token_centroids = p_->data.token_centroids.data();
    p.codes = p_->data.codes.data();
    p.n_code_bytes = m.n_code_bytes;
    p.codebook = m.codebook.data();
    p.n_tokens = int64_t(p_->data.token_centroids.size());
    try {
        p_->scales.resize(size_t(p.n_tokens));
    } catch (...) {
        return Status::ResourceExhausted("out of host memory for the token scales");
    }
    p.scales = p_->scales.data();
    return kernels::decoded_scales_cpu(p);
}

int64_t shard_bytes(const index::IndexData& d, bool file_vectors) {
    const int64_t scale = d.model.unit_norm && d.model.n_code_bytes > 0 ? 4 : 0;
    int64_t vec = int64_t(d.vectors.size());
    for (const index::VectorFileSpan& f : d.vector_files) vec += file_vectors ? f.file->n_tokens() * d.info.dim : 0;
    return int64_t(d.token_centroids.size()) * (4 + scale) + int64_t(d.codes.size()) + int64_t(d.ivf_docs.size()) * 4 +
           vec * 2 + int64_t(d.doc_offsets.size()) * 8;
}

Status ShardSearcher::DocRows(int32_t doc, std::vector<uint16_t>* out) const {
    TMS_RETURN_IF_ERROR(CheckExact());
    const int64_t dim = info_.dim, t0 = p_->data.doc_offsets[size_t(doc)];
    const int64_t n = p_->data.doc_offsets[size_t(doc) + 1] - t0;
    out->resize(size_t(n * dim));
    if (!p_->data.vectors.empty()) {
        std::copy_n(p_->data.vectors.data() + t0 * dim, n * dim, out->data());
        return Status::OK();
    }
    if (!p_->rows.empty()) return p_->rows.Range(t0, n, out->data());
    return Status::NotSupported(
        "the vectors are on the GPU only: open the index with vectors host or disk to read them");
}

void ShardSearcher::DecodedRows(int32_t doc, std::vector<float>* out) const {
    const index::IndexData& d = p_->data;
    const index::IndexModel& m = d.model;
    const int dim = m.dim, nb = m.n_code_bytes, dsub = nb ? dim / nb : 0;
    const int64_t t0 = d.doc_offsets[size_t(doc)], t1 = d.doc_offsets[size_t(doc) + 1];
    out->assign(size_t((t1 - t0) * dim), 0.f);
    for (int64_t t = t0; t < t1; ++t) {
        float* x = out->data() + (t - t0) * dim;
        const float* c = m.centroids.data() + size_t(d.token_centroids[size_t(t)]) * dim;
        std::copy(c, c + dim, x);
        for (int b = 0; b < nb; ++b) {
            const float* r = m.codebook.data() + (size_t(b) * 256 + d.codes[size_t(t) * nb + b]) * dsub;
            for (int j = 0; j < dsub; ++j) x[b * dsub + j] += r[j];
        }
        if (m.unit_norm && nb > 0) {
            double n2 = 0;
            for (int j = 0; j < dim; ++j) n2 += double(x[j]) * x[j];
            const float inv = n2 > 0 ? float(1 / std::sqrt(n2)) : 0.f;
            for (int j = 0; j < dim; ++j) x[j] *= inv;
        }
    }
}

// Values must be finite and within kMaxEmbeddingValue: fp16 by its exponent bits (every finite
// fp16 is within it), bf16 and fp32 by their magnitude bits.
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
                if (!(std::abs(x[e]) <= kMaxEmbeddingValue)) {
                    bad[size_t(i)] = e;
                    break;
                }
        } else {
            const uint16_t* x = static_cast<const uint16_t*>(q.data) + base;
            const bool f16 = q.dtype == DType::kF16;
            const uint16_t mask = f16 ? 0x7c00 : 0x7fff, limit = f16 ? 0x7bff : 0x477f;
            for (int64_t e = 0; e < n; ++e)
                if ((x[e] & mask) > limit) {
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
        return Status::InvalidArgument("query " + std::to_string(i) + ": " + index::BadValueText(v) + " at token " +
                                       std::to_string(e / q.dim) + ", dimension " + std::to_string(e % q.dim));
    }
    return Status::OK();
}

}  // namespace tms::engine

// Copyright TileMaxSim authors. The exact rerank stage: MaxSim of candidates on the stored vectors,
// resident or read from the host or disk tier (engine/shard_searcher.h).
#include "engine/shard_searcher.h"

#include <algorithm>
#include <omp.h>
#include <vector>

#include "kernels/maxsim.h"

namespace tms::engine {

Status ShardSearcher::RerankStage(const QueryBatch& q, SegmentCall* c) const {
    TMS_RETURN_IF_ERROR(CheckExact());
    Lists& l = c->lists;
    if (l.docs.empty()) return Status::OK();
    std::unique_lock<std::mutex> gpu_lock = LockDevice(c);
    return exact_candidates(gpu_exact() ? nullptr : HostF32(q, &c->qconv), q, l.off, l.docs, &l.scores);
}

Status ShardSearcher::exact_candidates(const float* qf, const QueryBatch& q, const std::vector<int64_t>& off,
                                       const std::vector<int32_t>& docs, std::vector<float>* scores) const {
    if (gpu_exact()) {
        return p_->dev->ExactScore(q.data, q.dtype, q.n_queries, q.q_tokens, q.lengths, off.data(), docs.data(),
                                   scores);
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

Status ShardSearcher::read_rows(int slot, const int32_t* docs, int64_t n, int64_t d0, int64_t d1, RowBuffer* rb) const {
    const int dim = info_.dim;
    const int64_t* doff = p_->data.doc_offsets.data();
    // The documents' rows back to back: their offsets in the buffer.
    const int64_t m = docs ? n : d1 - d0;
    const auto doc = [&](int64_t i) { return docs ? int64_t(docs[i]) : d0 + i; };
    rb->offsets.resize(size_t(m) + 1);
    rb->offsets[0] = 0;
    for (int64_t i = 0; i < m; ++i)
        rb->offsets[size_t(i) + 1] = rb->offsets[size_t(i)] + doff[doc(i) + 1] - doff[doc(i)];
    const int64_t tokens = rb->offsets.back();
    if (p_->mapped) {  // the GPU reads the rows where they are
        rb->tokens = nullptr;
        rb->sources.resize(size_t(m));
        for (int64_t i = 0; i < m; ++i) rb->sources[size_t(i)] = p_->rows.HostRow(doff[doc(i)]);
        return Status::OK();
    }
    const size_t elems = std::max<size_t>(size_t(tokens) * dim, 1);
    if (ctx_) {
        TMS_RETURN_IF_ERROR(p_->dev->PinnedRows(slot, elems, &rb->tokens));
    } else {
        try {
            rb->own.resize(elems);
        } catch (const std::bad_alloc&) {
            return Status::ResourceExhausted("no host memory for " + std::to_string(tokens) + " token rows");
        }
        rb->tokens = rb->own.data();
    }
    if (docs) return p_->rows.Gather(doff, docs, n, rb->offsets.data(), rb->tokens);
    // A range in pieces of 4 MB, read or copied on every thread.
    const int64_t piece = std::max<int64_t>(1, (int64_t(4) << 20) / (int64_t(dim) * 2));
    const int64_t n_pieces = (tokens + piece - 1) / piece;
    std::vector<Status> sts(static_cast<size_t>(n_pieces));
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_pieces; ++i) {
        const int64_t t = i * piece;
        sts[size_t(i)] = p_->rows.Range(doff[d0] + t, std::min(piece, tokens - t), rb->tokens + size_t(t) * dim);
    }
    for (const Status& st : sts) TMS_RETURN_IF_ERROR(st);
    return Status::OK();
}

Status ShardSearcher::score_rows(const float* qf, const QueryBatch& q, const RowBuffer& rb, const int64_t* off,
                                 const int32_t* docs, std::vector<float>* scores) const {
    const int64_t n_docs = int64_t(rb.offsets.size()) - 1;
    if (ctx_) {
        const engine::GpuShard::Rows rows = rb.rows();
        return p_->dev->ExactScore(q.data, q.dtype, q.n_queries, q.q_tokens, q.lengths, off, docs, scores, &rows);
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

}  // namespace tms::engine

// Copyright TileMaxSim authors. Exhaustive search: exact MaxSim of every document, resident or
// streamed from the host or disk tier in steps (engine/shard_searcher.h).
#include "engine/shard_searcher.h"

#include <algorithm>
#include <cmath>
#include <future>
#include <vector>

#include "base/progress.h"
#include "kernels/maxsim.h"

namespace tms::engine {

Status ShardSearcher::exhaustive_streamed(const float* qf, const QueryBatch& q, int k, std::vector<int32_t>* ids,
                                          std::vector<float>* scores, const Allowed* allowed) const {
    const int64_t n_docs = info_.n_docs;
    const int64_t* doff = p_->data.doc_offsets.data();
    const int nq = q.n_queries;
    constexpr int kGpuMaxTopK = 1024;
    // Chunks of at most stream_bytes_ of rows (a document alone may be more).
    const int64_t max_tokens = std::max<int64_t>(1, stream_bytes_ / (int64_t(info_.dim) * 2));
    const std::vector<uint32_t> local = allowed ? LocalAllow(*allowed, nq) : std::vector<uint32_t>();
    // Without deletions or a filter a GPU scores each chunk densely and selects its top-k.
    const bool dense = ctx_ && info_.n_deleted == 0 && !allowed && k <= kGpuMaxTopK;
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
            if (p_->mapped) {
                // Registered host memory in one piece (a range within one part): copied at
                // the link's speed, not gathered by the scoring kernel's stream.
                if (rb.sources.empty()) return Status::OK();
                const size_t row = size_t(info_.dim) * sizeof(uint16_t);
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
            const Status st = p_->dev->StageRows(slot, size_t(rb.offsets.back()) * info_.dim, &r);
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
            TMS_RETURN_IF_ERROR(p_->dev->ExactScoreTopK(q.data, q.dtype, nq, q.q_tokens, q.lengths, nullptr, nullptr, k,
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
                    if (!deleted_[d] && (!row || kernels::bitmap_has(row, d))) cand.push_back(int32_t(d - d0));
                }
                off.push_back(int64_t(cand.size()));
            }
            if (ctx_ && k <= kGpuMaxTopK) {
                TMS_RETURN_IF_ERROR(p_->dev->ExactScoreTopK(q.data, q.dtype, nq, q.q_tokens, q.lengths, off.data(),
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
    const int64_t n_docs = info_.n_docs;
    const int64_t n_deleted = info_.n_deleted;
    // The GPU selects the top-k itself up to kGpuMaxTopK; past that, or with deletions or a
    // filter, it scores candidate lists of live (allowed) documents and the CPU selects.
    constexpr int kGpuMaxTopK = 1024;
    if (gpu_exact() && n_deleted == 0 && !allowed && k <= kGpuMaxTopK) {
        return p_->dev->ExactScoreTopK(q.data, q.dtype, q.n_queries, q.q_tokens, q.lengths, nullptr, nullptr, k, ids,
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
                if (!deleted_[d]) live.push_back(static_cast<int32_t>(d));
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
                    p_->dev->ExactScoreTopK(qb, q.dtype, nq, q.q_tokens, lb, off.data(), cand.data(), k, &bi, &bs));
                std::copy(bi.begin(), bi.end(), ids->begin() + size_t(q0) * k);
                std::copy(bs.begin(), bs.end(), scores->begin() + size_t(q0) * k);
                continue;
            }
            TMS_RETURN_IF_ERROR(p_->dev->ExactScore(qb, q.dtype, nq, q.q_tokens, lb, off.data(), cand.data(), &s));
            TMS_RETURN_IF_ERROR(select_topk(s.data(), off.data(), 0, nq, cand.data(), k, ids->data() + size_t(q0) * k,
                                            scores->data() + size_t(q0) * k));
        }
        return Status::OK();
    }
    ids->assign(size_t(q.n_queries) * k, -1);
    scores->assign(size_t(q.n_queries) * k, -INFINITY);
    // Queries in blocks so that the dense score matrix stays under ~256 MB.
    const int block =
        static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(q.n_queries, (int64_t(64) << 20) / n_docs)));
    std::vector<float> dense;
    for (int q0 = 0; q0 < q.n_queries; q0 += block) {
        const int nq = std::min(block, q.n_queries - q0);
        dense.resize(size_t(nq) * n_docs);
        kernels::MaxSimParams p =
            exact_params(qf + size_t(q0) * q.q_tokens * q.dim, nq, q.q_tokens, q.lengths ? q.lengths + q0 : nullptr);
        p.scores = dense.data();
        TMS_RETURN_IF_ERROR(kernels::maxsim_cpu(p));
        if (n_deleted > 0) {
            for (int i = 0; i < nq; ++i)
                for (int64_t d = 0; d < n_docs; ++d)
                    if (deleted_[d]) dense[size_t(i) * n_docs + d] = -INFINITY;
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

}  // namespace tms::engine

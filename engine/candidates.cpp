// Copyright TileMaxSim authors. The candidate stage: centroid scores, probing, the IVF union and
// its pruning to ncandidates, with filters (engine/shard_searcher.h).
#include "engine/shard_searcher.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/plan.h"
#include "kernels/candidates.h"
#include "kernels/maxsim.h"
#include "kernels/nearest.h"

namespace tms::engine {

Status ShardSearcher::HostCandidates(const float* qf, const QueryBatch& q, const SearchOptions& opts, bool cut_all,
                                     std::vector<float>* cs, Lists* lists, const uint32_t* allow, int64_t allow_stride,
                                     std::vector<kernels::ProbeFrame>* frames) const {
    const int nq = q.n_queries, qt = q.q_tokens;
    const int K = p_->data.model.n_centroids;
    const int nprobe = engine::ProbesPerToken(opts, K);
    const bool by_probes = opts.ncandidates > 0 && opts.pruning == Pruning::kProbe;
    cs->resize(size_t(nq) * qt * K);
    kernels::inner_products_cpu(qf, int64_t(nq) * qt, p_->data.model.centroids.data(), p_->data.model.n_centroids,
                                p_->data.model.dim, cs->data());
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
    up.ivf_offsets = p_->data.ivf_offsets.data();
    up.ivf_docs = p_->data.ivf_docs.data();
    up.n_centroids = K;
    up.n_docs = info_.n_docs;
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
        if (frames) {
            frames->resize(size_t(nq));
            for (int qi = 0; qi < nq; ++qi) (*frames)[size_t(qi)] = kernels::probe_frame(pp, qi);
        }
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

Status ShardSearcher::PruneStage(const QueryBatch& q, const SearchOptions& opts, SegmentCall* c,
                                 const Allowed* allowed) const {
    std::unique_lock<std::mutex> gpu_lock = LockDevice(c, /*first_stage=*/true);
    SearchOptions o = opts;  // more candidates than documents would only size buffers
    if (o.ncandidates > 0) o.ncandidates = int(std::min<int64_t>(o.ncandidates, std::max<int64_t>(1, info_.n_docs)));
    const int nprobe = engine::ProbesPerToken(o, info_.n_centroids);
    const int nq = q.n_queries;
    // With the codes and IVF lists on the GPU, probing, the union and the pruning run there;
    // the [nq, qt, K] centroid scores never exist on the host.
    c->on_gpu = gpu_codes() && nprobe <= 64;
    // Alone: nothing is cut across segments, so the lists need no pruning scores (on a GPU
    // they stay there; CompressedStage brings back each query's best).
    const bool keep_on_device = c->alone && c->on_gpu && !c->certify;
    c->frames.clear();
    std::vector<kernels::ProbeFrame>* frames = c->certify ? &c->frames : nullptr;
    std::vector<uint32_t> local;
    int n_direct = 0;
    if (allowed) {
        local = LocalAllow(*allowed, nq);
        for (int i = 0; i < nq; ++i) n_direct += allowed->direct(i);
    }
    const int64_t stride = allowed && allowed->per_query() ? kernels::bitmap_words(info_.n_docs) : 0;
    // Documents deleted since the lists were placed: every list is restricted to the live ones.
    if (!live_.empty()) {
        if (!allowed) local = live_;
        for (size_t w = 0; allowed && w < local.size(); ++w) local[w] &= live_[w % live_.size()];
    }
    const uint32_t* allow = allowed || !live_.empty() ? local.data() : nullptr;
    if (n_direct < nq) {  // some query probes
        if (c->on_gpu) {
            TMS_RETURN_IF_ERROR(p_->dev->Candidates(q.data, q.dtype, nq, q.q_tokens, q.lengths, nprobe, o.ncandidates,
                                                    o.pruning, &c->lists.off, keep_on_device ? nullptr : &c->lists.docs,
                                                    keep_on_device ? nullptr : &c->lists.scores,
                                                    keep_on_device ? nullptr : &c->ticket, allow, stride > 0, frames));
        } else {
            TMS_RETURN_IF_ERROR(HostCandidates(HostF32(q, &c->qconv), q, o, /*cut_all=*/!c->alone, &c->cs, &c->lists,
                                               allow, stride, frames));
        }
    } else {  // the compressed stage scores the lists below: on the host, with these centroid scores
        c->ticket = 0;
        if (!c->on_gpu) {
            c->cs.resize(size_t(nq) * q.q_tokens * p_->data.model.n_centroids);
            kernels::inner_products_cpu(HostF32(q, &c->qconv), int64_t(nq) * q.q_tokens,
                                        p_->data.model.centroids.data(), p_->data.model.n_centroids, p_->data.model.dim,
                                        c->cs.data());
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
    const int64_t n = info_.n_docs, words = kernels::bitmap_words(n), first = p_->data.first_doc;
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
    const int64_t words = kernels::bitmap_words(info_.n_docs);
    const uint32_t* row = AllowRow(local, a, q);
    out->clear();
    for (int64_t w = 0; w < words; ++w) {
        for (uint32_t x = row[w]; x; x &= x - 1) {
            const int32_t d = int32_t(w * 32 + __builtin_ctz(x));
            if (!deleted_[size_t(d)]) out->push_back(d);
        }
    }
}

}  // namespace tms::engine

// Copyright TileMaxSim authors. The segments of a Searcher on their devices: searches and stages
// run on every device at once, the results merged (engine/shard_set.h).
#include "engine/shard_set.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <thread>
#include <vector>

#include "base/progress.h"

namespace tms {

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

namespace engine {

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

size_t ShardSet::Add(std::unique_ptr<ShardSearcher> segment) {
    segments_.push_back(std::move(segment));
    return segments_.size() - 1;
}

Status ShardSet::CheckExact() const {
    for (const auto& sg : segments_) TMS_RETURN_IF_ERROR(sg->CheckExact());
    return Status::OK();
}

Status ShardSet::Search(const QueryBatch& q, const SearchOptions& opts, const Allowed* allowed, int64_t n_docs,
                        int n_centroids, SearchCuts* cuts, Status st, std::vector<std::vector<SearchHit>>* results,
                        SearchTimings* timings) const {
    if (!opts.exhaustive) {
        std::vector<const ShardSearcher*> segs;
        for (const auto& sg : segments_) segs.push_back(sg.get());
        return search_cut(segs, by_device_, n_docs, n_centroids, q, opts, st, cuts, results, timings, allowed);
    }
    TMS_RETURN_IF_ERROR(st);
    if (segments_.size() == 1) return segments_[0]->Search(q, opts, results, timings, allowed);
    const auto t0 = Clock::now();
    const size_t n = segments_.size();
    std::vector<std::vector<std::vector<SearchHit>>> parts(n);
    std::vector<SearchTimings> ts(n);
    // Each segment's exact top-k, merged (exact too).
    const std::vector<Status> sts =
        RunOnDevices([&](size_t s) { return segments_[s]->Search(q, opts, &parts[s], &ts[s], allowed); });
    for (size_t s = 0; s < n; ++s) TMS_RETURN_IF_ERROR(sts[s]);
    MergeHits(&parts, q.n_queries, opts.k, results);
    if (timings) {
        // Each step: summed over a device's segments (they run in turn), the slowest device.
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

Status ShardSet::Rerank(const QueryBatch& q, const std::vector<std::vector<int64_t>>& cand, int k,
                        std::vector<std::vector<SearchHit>>* results) const {
    const int nq = q.n_queries;
    // Each segment's hits (parts[s][q]), merged as a search's are.
    std::vector<std::vector<std::vector<SearchHit>>> parts;
    for (const auto& sh : segments_) {
        const index::IndexData& d = sh->data();
        SegmentCall call;  // one stage: the exact scores of the given lists
        std::vector<int64_t>& off = call.lists.off;
        std::vector<int32_t>& docs = call.lists.docs;
        off.assign(1, 0);
        for (int i = 0; i < nq; ++i) {
            const auto& c = cand[size_t(i)];
            const auto lo = std::lower_bound(c.begin(), c.end(), d.first_doc);
            const auto hi = std::lower_bound(lo, c.end(), d.first_doc + d.info.n_docs);
            for (auto it = lo; it != hi; ++it) {
                const int32_t local = int32_t(*it - d.first_doc);
                if (!sh->deleted()[size_t(local)]) docs.push_back(local);
            }
            off.push_back(int64_t(docs.size()));
        }
        if (docs.empty()) continue;
        TMS_RETURN_IF_ERROR(sh->RerankStage(q, &call));
        const std::vector<float>& scores = call.lists.scores;
        auto& part = parts.emplace_back(static_cast<size_t>(nq));
        for (int i = 0; i < nq; ++i) {
            for (int64_t e = off[size_t(i)]; e < off[size_t(i) + 1]; ++e) {
                part[size_t(i)].push_back(
                    {d.doc_ids[size_t(docs[size_t(e)])], d.first_doc + docs[size_t(e)], scores[size_t(e)]});
            }
        }
    }
    MergeHits(&parts, nq, k > 0 ? k : std::numeric_limits<int>::max(), results);
    return Status::OK();
}

const ShardSearcher* ShardSet::Find(int64_t doc, int32_t* local) const {
    for (const auto& sg : segments_) {
        const index::IndexData& d = sg->data();
        if (doc < d.first_doc || doc >= d.first_doc + d.info.n_docs) continue;
        *local = int32_t(doc - d.first_doc);
        return sg->deleted()[size_t(*local)] ? nullptr : sg.get();
    }
    return nullptr;
}

}  // namespace engine
}  // namespace tms

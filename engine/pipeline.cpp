// Copyright TileMaxSim authors. The approximate search pipeline: the stages (pruning, compressed
// scoring, exact rerank, top-k) of one segment, or of several (devices, or MPI participants
// through SearchCuts) as one, each stage on every device at once, the candidates cut together
// between stages (engine/shard_searcher.h).
#include "engine/shard_searcher.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/progress.h"
#include "engine/plan.h"
#include "kernels/maxsim.h"

namespace tms::engine {

namespace {

constexpr CutKey kKeepAll{-INFINITY, std::numeric_limits<int64_t>::max()};

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
// cut to ncandidates drops some of its best), so it is searched again deeper (DeepenedSearch).
// Documents of one topic rank in any order within its first few k, which is
// not a reason to search again.
constexpr int kTrustedPerHit = 4;

}  // namespace

// Approximate search of the segments `segs` (`groups`: their indices per device) as one segment
// over all of them, and with `cuts` over every participant's, would search: each stage runs on
// every device at once, and between stages the host cuts the candidates to the best
// ncandidates (by pruning score), then to the best rerank-or-k (by compressed score), keys
// (score, global id) compared across segments. Results: these segments' share of the top-k.
// One segment of one participant, unfiltered, has nothing to cut: its stages run back to back
// on its device (SegmentCall::alone).
// n_docs, n_centroids: of the whole (they size the chunks, which must be the same everywhere).
// st: the caller's error so far, still taken through the cuts (the other participants wait
// in them). With a filter (opts.allow or opts.filter: the same on every participant), the
// queries the pruning ranked poorly are searched again (DeepenedSearch).
Status search_cut(const std::vector<const ShardSearcher*>& segs, const std::vector<std::vector<size_t>>& groups,
                  int64_t n_docs, int n_centroids, const QueryBatch& q, const SearchOptions& opts, Status st,
                  SearchCuts* cuts, std::vector<std::vector<SearchHit>>* results, SearchTimings* timings,
                  const Allowed* allowed) {
    const auto t_start = Clock::now();
    const size_t n = segs.size();
    bool have_vectors = true;
    for (const ShardSearcher* sg : segs) have_vectors = have_vectors && sg->CheckExact().ok();
    const bool rerank = have_vectors && opts.rerank > 0;
    const int keep = rerank ? std::max(opts.rerank, opts.k) : opts.k;
    const int64_t chunk = chunk_queries(opts, q.q_tokens, n_centroids, n_docs);
    const bool deepen = (opts.allow || !opts.filter.empty()) && opts.ncandidates > 0;
    SearchTimings t;
    // TMS_TRACE_SEARCH=1: host time of each stage of a pass on stderr.
    Trace trace("TMS_TRACE_SEARCH", "search", Trace::Unit::kMilliseconds);
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
        const bool alone = n == 1 && !cuts && !a;
        for (SegmentCall& c : calls) c.alone = alone;
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
                        bq.push_back({l.scores[size_t(e)], segs[s]->data().first_doc + l.docs[size_t(e)]});
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
                const int64_t first = segs[s]->data().first_doc;
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
            trace.Mark("candidates");
        }
        // Per query (with deep): the global ids of the candidates kept past the pruning's
        // trusted best, ascending.
        std::vector<std::vector<int64_t>> past(deep ? size_t(nb) : 0);
        if (o.ncandidates > 0 && !alone) {
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
                        const int64_t first = segs[s]->data().first_doc;
                        for (int64_t e = l.off[size_t(i)]; e < l.off[size_t(i) + 1]; ++e)
                            if (CutKeyBetter(at[size_t(i)], {l.scores[size_t(e)], first + l.docs[size_t(e)]}))
                                past[size_t(i)].push_back(first + l.docs[size_t(e)]);
                    }
                    std::sort(past[size_t(i)].begin(), past[size_t(i)].end());
                }
            }
        }
        if (st.ok()) st = run([&](size_t s) { return segs[s]->CompressedStage(b, keep, &calls[s]); }, &t.scoring);
        trace.Mark("compressed scoring");
        if (!alone) cut(keep, /*spare_direct=*/false);
        if (st.ok() && rerank) {
            st = run([&](size_t s) { return segs[s]->RerankStage(b, &calls[s]); }, &t.rerank);
            trace.Mark("exact rerank");
        }
        std::vector<std::vector<std::vector<SearchHit>>> parts(n, std::vector<std::vector<SearchHit>>(size_t(nb)));
        for (size_t s = 0; st.ok() && s < n; ++s) {
            const index::IndexData& d = segs[s]->data();
            const Lists& l = calls[s].lists;
            // Each query's best k live hits of the segment (only they can reach the merged
            // top-k), named by their external ids.
#pragma omp parallel for schedule(dynamic, 4) if (l.docs.size() > 8192)
            for (int i = 0; i < nb; ++i) {
                std::vector<std::pair<CutKey, int32_t>> live;
                live.reserve(size_t(l.off[size_t(i) + 1] - l.off[size_t(i)]));
                for (int64_t e = l.off[size_t(i)]; e < l.off[size_t(i) + 1]; ++e) {
                    const int32_t id = l.docs[size_t(e)];
                    if (!segs[s]->deleted()[size_t(id)]) live.push_back({{l.scores[size_t(e)], d.first_doc + id}, id});
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
        // One segment's lists are the top-k already, in order.
        if (st.ok() && n == 1) {
            *out = std::move(parts[0]);
        } else if (st.ok()) {
            MergeHits(&parts, nb, o.k, out);
        }
        trace.Mark("top-k");
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
            const SearchOptions wide = engine::DeepenedSearch(opts);
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

}  // namespace tms::engine

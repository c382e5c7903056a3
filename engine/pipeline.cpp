// Copyright TileMaxSim authors. The approximate search pipeline: the stages (pruning, compressed
// scoring, exact rerank, top-k) of one segment, or of several (devices, or MPI participants
// through SearchCuts) as one, each stage on every device at once, the candidates cut together
// between stages (engine/shard_searcher.h).
#include "engine/shard_searcher.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <iterator>
#include <limits>
#include <unordered_set>
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

// How a query's certification ended in a pass (SearchOptions::certify).
enum Verdict : int8_t {
    kCertified = 0,
    kRerankBound = 1,    // a document the rerank did not reach may score above the k-th
    kPruningBound = 2,   // one the candidates did not keep may (the rerank's bound may fail too)
    kUncertifiable = 3,  // the pass could not tell (no probe scores: a direct or deepened query)
};

// Multiplies the excess of exact over approximate scores measured on a query's reranked
// documents (their largest) before it bounds the documents left out, who outnumber the reranked
// (their largest excess can be larger): by the rerank or by the candidates' cut (documents like
// the reranked ones, scored by the same codes or probes), half again; where nothing was cut,
// those no probe reaches (the least like the reranked, every one of which was reached), twice.
// Set so that no query of tests/engine/certify.h's corpora (short ragged queries the hardest)
// is certified without its exhaustive top-k.
constexpr float kExcess = 1.5f, kUnreachedExcess = 2.0f;

// *into becomes the best k of *from and *into (each sorted, best first; a document in both has
// the same exact score in each); *from is left empty.
void MergeBest(std::vector<SearchHit>* from, std::vector<SearchHit>* into, int k) {
    std::vector<SearchHit> all;
    all.reserve(from->size() + into->size());
    std::merge(from->begin(), from->end(), into->begin(), into->end(), std::back_inserter(all),
               [](const SearchHit& x, const SearchHit& y) {
                   return CutKeyBetter({x.score, x.internal_id}, {y.score, y.internal_id});
               });
    std::vector<SearchHit> best;
    std::unordered_set<int64_t> seen;
    for (SearchHit& h : all) {
        if (int(best.size()) == k) break;
        if (seen.insert(h.internal_id).second) best.push_back(std::move(h));
    }
    from->clear();
    *into = std::move(best);
}

// A segment's lists of one stage, each query's range sorted by document (for lookups by id).
Lists by_document(const Lists& l) {
    Lists s = l;
    const int nq = int(l.off.size()) - 1;
    if (l.scores.size() != l.docs.size()) s.scores.assign(l.docs.size(), std::numeric_limits<float>::quiet_NaN());
#pragma omp parallel for schedule(dynamic, 16) if (l.docs.size() > 65536)
    for (int i = 0; i < nq; ++i) {
        const int64_t b = l.off[size_t(i)], e = l.off[size_t(i) + 1];
        std::vector<std::pair<int32_t, float>> v(size_t(e - b));
        for (int64_t j = b; j < e; ++j) v[size_t(j - b)] = {s.docs[size_t(j)], s.scores[size_t(j)]};
        std::sort(v.begin(), v.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
        for (int64_t j = b; j < e; ++j) std::tie(s.docs[size_t(j)], s.scores[size_t(j)]) = v[size_t(j - b)];
    }
    return s;
}

// Document d's score in query i's range of `s` (by_document's), or NaN.
float score_of(const Lists& s, int i, int32_t d) {
    const auto b = s.docs.begin() + s.off[size_t(i)], e = s.docs.begin() + s.off[size_t(i) + 1];
    const auto it = std::lower_bound(b, e, d);
    return it != e && *it == d ? s.scores[size_t(it - s.docs.begin())] : std::numeric_limits<float>::quiet_NaN();
}

// The most a document of approximate score at most x could score exactly, judged by the query's
// reranked documents `seen` ((exact, approximate...) each; `col` the approximate score's column,
// NaN where unknown): the least-squares line of exact on approximate through them, at x, plus
// `margin` times their largest excess over that line. A line, not a shift: an index's
// approximate scores may run on another scale than its exact ones (codes of unnormalised
// vectors; centroids of unit norm). The line is not followed below the lowest approximate score
// seen: its slope, fitted on few distinct scores (a query of one or two tokens has a few probe
// scores), could fall below what the documents left out score. +inf where fewer than 3 are known.
float ExactBound(const std::vector<std::array<float, 3>>& seen, int col, float x, float margin) {
    double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0, lowest = INFINITY;
    for (const auto& v : seen) {
        if (std::isnan(v[size_t(col)])) continue;
        const double a = v[size_t(col)], e = v[0];
        lowest = std::min(lowest, a);
        n += 1;
        sx += a;
        sy += e;
        sxx += a * a;
        sxy += a * e;
    }
    if (n < 3) return INFINITY;
    const double var = sxx - sx * sx / n, cov = sxy - sx * sy / n;
    // A flat or falling line would not bound anything below the reranked: slope at least 0.
    const double slope = var > 0 ? std::max(0.0, cov / var) : 0.0;
    const double icept = (sy - slope * sx) / n;
    double excess = 0;
    for (const auto& v : seen) {
        if (std::isnan(v[size_t(col)])) continue;
        excess = std::max(excess, double(v[0]) - (slope * v[size_t(col)] + icept));
    }
    return float(slope * std::max(double(x), lowest) + icept + margin * excess);
}

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
    // query's top-k into *out, with deep the queries to search again (agreed by every
    // participant), and with verdicts each query's certification (one participant only:
    // SearchWithCuts does not certify), or with `settle` whether its top-k was settled
    // (kCertified) or not (kPruningBound; agreed by every participant). Errors go to st.
    auto pass = [&](const QueryBatch& b, const Allowed* a, const SearchOptions& o,
                    std::vector<std::vector<SearchHit>>* out, std::vector<int>* deep, std::vector<int8_t>* verdicts,
                    bool settle) {
        const int nb = b.n_queries;
        const int keep = rerank ? std::max(o.rerank, o.k) : o.k;
        std::vector<SegmentCall> calls(n);
        const bool alone = n == 1 && !cuts && !a;
        const bool certify = verdicts != nullptr && !settle;
        settle = verdicts != nullptr && settle;
        for (SegmentCall& c : calls) {
            c.alone = alone;
            c.certify = certify;
        }
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
        // Cuts every segment's lists to the best `keep_n` of each query over all of them; *at_out
        // (when given): each query's cut (kKeepAll where every key is kept).
        auto cut = [&](int keep_n, bool spare_direct, std::vector<CutKey>* at_out) {
            std::vector<CutKey> at;
            st = agree_cut(cuts, keep_n, st, best_keys(keep_n, spare_direct), &at);
            if (!st.ok()) return;
            bool cuts_any = false;
            for (int i = 0; i < nb; ++i) {
                if (spare_direct && direct(i)) at[size_t(i)] = kKeepAll;
                cuts_any = cuts_any || CutKeyBetter(at[size_t(i)], kKeepAll);
            }
            if (at_out) *at_out = at;
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
        // Certification: the pruning's cut of each query (kKeepAll: nothing cut), the candidates
        // by document with their probe scores, the compressed scores of the reranked documents
        // and the rerank's cut.
        std::vector<CutKey> prune_at(size_t(nb), kKeepAll), rerank_at(size_t(nb), kKeepAll);
        std::vector<Lists> probed(certify ? n : 0);
        std::vector<std::vector<float>> approx(certify || settle ? n : 0);
        if (certify && alone) {  // the device kept each query's ncandidates best
            st = agree_cut(cuts, o.ncandidates, st, best_keys(o.ncandidates, /*spare_direct=*/true), &prune_at);
        }
        if (o.ncandidates > 0 && !alone) {
            cut(o.ncandidates, /*spare_direct=*/true, certify ? &prune_at : nullptr);
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
        for (size_t s = 0; certify && st.ok() && s < n; ++s) probed[s] = by_document(calls[s].lists);
        if (st.ok()) st = run([&](size_t s) { return segs[s]->CompressedStage(b, keep, &calls[s]); }, &t.scoring);
        trace.Mark("compressed scoring");
        if (!alone) {
            cut(keep, /*spare_direct=*/false, certify ? &rerank_at : nullptr);
        } else if (certify) {
            st = agree_cut(cuts, keep, st, best_keys(keep, /*spare_direct=*/false), &rerank_at);
        }
        for (size_t s = 0; (certify || settle) && st.ok() && s < n; ++s) approx[s] = calls[s].lists.scores;
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
        if (certify) {
            // Each query's k-th score against its bounds on what a document left out could score
            // (one participant: SearchWithCuts does not certify).
            const kernels::ProbeFrame* frames = nullptr;
            for (size_t s = 0; s < n && !frames; ++s)
                if (calls[s].frames.size() == size_t(nb)) frames = calls[s].frames.data();
            verdicts->assign(size_t(nb), kUncertifiable);
#pragma omp parallel for schedule(dynamic, 4) if (nb > 16)
            for (int i = 0; i < nb; ++i) {
                if (!st.ok()) continue;
                std::vector<float> top;                  // the exact scores of the query's hits
                std::vector<std::array<float, 3>> seen;  // (exact, compressed, probe) of the reranked
                const kernels::ProbeFrame* f = frames ? &frames[i] : nullptr;
                for (size_t s = 0; s < n; ++s) {
                    for (const SearchHit& h : parts[s][size_t(i)]) top.push_back(h.score);
                    const Lists& l = calls[s].lists;
                    for (int64_t e = l.off[size_t(i)]; e < l.off[size_t(i) + 1]; ++e) {
                        const float p = f ? score_of(probed[s], i, l.docs[size_t(e)]) : NAN;
                        const float ps = std::isnan(p) ? NAN : f->base + (f->scale > 0 ? p / f->scale : 0.f);
                        seen.push_back({l.scores[size_t(e)], approx[s][size_t(e)], ps});
                    }
                }
                // Fewer than k hits: certified only where nothing was left out.
                float kth = -INFINITY;
                if (top.size() >= size_t(o.k)) {
                    std::nth_element(top.begin(), top.begin() + (o.k - 1), top.end(), std::greater<float>());
                    kth = top[size_t(o.k - 1)];
                }
                const bool rerank_ok = !CutKeyBetter(rerank_at[size_t(i)], kKeepAll) ||
                                       kth > ExactBound(seen, 1, rerank_at[size_t(i)].score, kExcess);
                bool pruning_ok = direct(i);
                if (!pruning_ok && f) {
                    // A document the candidates did not keep has a probe score of at most the
                    // cut's (0 where nothing was cut: no probe reaches it), each row truncated.
                    const bool cut = CutKeyBetter(prune_at[size_t(i)], kKeepAll);
                    const float x = cut ? prune_at[size_t(i)].score : 0.f;
                    pruning_ok =
                        kth > ExactBound(seen, 2, f->base + (f->scale > 0 ? (x + float(f->rows)) / f->scale : 0.f),
                                         cut ? kExcess : kUnreachedExcess);
                }
                if (!f && !direct(i)) continue;  // kUncertifiable
                (*verdicts)[size_t(i)] = !pruning_ok ? kPruningBound : !rerank_ok ? kRerankBound : kCertified;
            }
        }
        // With settle or deep: each query's hits on these segments (exact score, global id) and
        // its k-th best over every participant; `anyone`: per query, whether some participant
        // named a key for it.
        std::vector<std::vector<CutKey>> hit_keys(settle || deep ? size_t(nb) : 0);
        std::vector<CutKey> kth;
        if (settle || deep) {
            for (int i = 0; st.ok() && i < nb; ++i)
                for (size_t s = 0; s < n; ++s)
                    for (const SearchHit& h : parts[s][size_t(i)])
                        hit_keys[size_t(i)].push_back({h.score, h.internal_id});
            st = agree_cut(cuts, o.k, st, hit_keys, &kth);
        }
        const auto in_top = [&](int i, const CutKey& h) { return !CutKeyBetter(kth[size_t(i)], h); };
        const auto anyone = [&](std::vector<std::vector<CutKey>> named) {
            std::vector<CutKey> any;
            st = agree_cut(cuts, 1, st, std::move(named), &any);
            std::vector<char> yes(size_t(nb), 0);
            for (int i = 0; st.ok() && i < nb; ++i) yes[size_t(i)] = CutKeyBetter(any[size_t(i)], kKeepAll);
            return yes;
        };
        if (settle) {
            // Settled: each document of the query's top-k (over every participant) is among the
            // first SettledRanks(k) of the compressed ranking of its live reranked documents.
            std::vector<std::vector<CutKey>> ranked(static_cast<size_t>(nb));
            for (int i = 0; st.ok() && i < nb; ++i) {
                for (size_t s = 0; s < n; ++s) {
                    const Lists& l = calls[s].lists;
                    for (int64_t e = l.off[size_t(i)]; e < l.off[size_t(i) + 1]; ++e) {
                        if (segs[s]->deleted()[size_t(l.docs[size_t(e)])]) continue;
                        ranked[size_t(i)].push_back(
                            {approx[s][size_t(e)], segs[s]->data().first_doc + l.docs[size_t(e)]});
                    }
                }
            }
            std::vector<CutKey> last;
            st = agree_cut(cuts, SettledRanks(o.k), st, ranked, &last);
            // Per query, one of this participant's documents of the top-k ranked past `last`.
            std::vector<std::vector<CutKey>> past_last(static_cast<size_t>(nb));
            for (int i = 0; st.ok() && i < nb; ++i) {
                if (!CutKeyBetter(last[size_t(i)], kKeepAll)) continue;  // fewer reranked: all settled
                for (const CutKey& c : ranked[size_t(i)]) {
                    const auto& top = hit_keys[size_t(i)];
                    if (CutKeyBetter(last[size_t(i)], c) && std::any_of(top.begin(), top.end(), [&](const CutKey& h) {
                            return h.id == c.id && in_top(i, h);
                        })) {
                        past_last[size_t(i)].push_back(c);
                        break;
                    }
                }
            }
            const std::vector<char> unsettled = anyone(std::move(past_last));
            verdicts->assign(size_t(nb), kCertified);
            for (int i = 0; st.ok() && i < nb; ++i)
                if (unsettled[size_t(i)]) (*verdicts)[size_t(i)] = kPruningBound;
        }
        if (deep) {
            // The queries whose top-k (over every participant) holds a document of `past`.
            std::vector<std::vector<CutKey>> mine(static_cast<size_t>(nb));
            for (int i = 0; st.ok() && i < nb; ++i) {
                for (const CutKey& h : hit_keys[size_t(i)]) {
                    if (in_top(i, h) && std::binary_search(past[size_t(i)].begin(), past[size_t(i)].end(), h.id)) {
                        mine[size_t(i)].push_back(h);
                        break;
                    }
                }
            }
            const std::vector<char> again = anyone(std::move(mine));
            for (int i = 0; st.ok() && i < nb; ++i)
                if (again[size_t(i)]) deep->push_back(i);
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
    const bool certify = rerank && Certifies(opts);
    // Queries not settled are searched again (SearchOptions::adaptive), agreed by every participant.
    const bool adapt = rerank && !certify && Adapts(opts);
    if (certify) t.certified.assign(size_t(q.n_queries), 0);
    if (certify || adapt) t.depth.assign(size_t(q.n_queries), 0);
    // Queries `idx` of src (allowed sa) searched again with options o: their results replace
    // theirs in *dst (with `merge`, the best k of both do), and (with a non-empty *verdict) their
    // verdicts.
    auto again_on = [&](const QueryBatch& src, const Allowed& sa, const std::vector<int>& idx, const SearchOptions& o,
                        bool certified, bool merge, std::vector<std::vector<SearchHit>>* dst,
                        std::vector<int8_t>* verdict) {
        // Those queries (and their rows of the allowed documents) gathered into one batch.
        QueryCopy g(src, int(idx.size()));
        for (const int i : idx) g.Append(src, i, 1);
        Allowed ga = sa;
        if (allowed && sa.per_query()) {
            const int64_t words = DocSet::Words(sa.set->n_docs);
            auto set = std::make_shared<DocSet>(sa.set->n_docs, int(idx.size()));
            auto dr = std::make_shared<std::vector<char>>(idx.size());
            auto nr = std::make_shared<std::vector<char>>(idx.size());
            for (size_t j = 0; j < idx.size(); ++j) {
                std::copy_n(sa.set->Row(sa.row(idx[j])), words, set->bits.begin() + ptrdiff_t(j * size_t(words)));
                (*dr)[j] = sa.direct(idx[j]);
                (*nr)[j] = sa.narrow(idx[j]);
            }
            ga.set = std::move(set);
            ga.direct_rows = std::move(dr);
            ga.narrow_rows = std::move(nr);
            ga.row0 = 0;
        }
        std::vector<std::vector<SearchHit>> again_out;
        std::vector<int8_t> again_verdict;
        pass(g.batch(), allowed ? &ga : nullptr, o, &again_out, nullptr, certified ? &again_verdict : nullptr,
             /*settle=*/false);
        if (!st.ok()) return;
        for (size_t j = 0; j < idx.size(); ++j) {
            if (merge) MergeBest(&(*dst)[size_t(idx[j])], &again_out[j], o.k);
            (*dst)[size_t(idx[j])] = std::move(again_out[j]);
            if (verdict && !verdict->empty())
                (*verdict)[size_t(idx[j])] = certified ? again_verdict[j] : int8_t(kUncertifiable);
        }
    };
    std::vector<int> unsettled;  // (adapt) over the whole batch
    for (int64_t q0 = 0; q0 < q.n_queries; q0 += chunk) {
        const int nb = int(std::min<int64_t>(chunk, q.n_queries - q0));
        const QueryBatch b = q.Slice(int(q0), nb);
        const Allowed a = allowed ? allowed->From(int(q0)) : Allowed{};
        std::vector<std::vector<SearchHit>> out;
        std::vector<int8_t> verdict;
        auto again_with = [&](const std::vector<int>& idx, const SearchOptions& o, bool certified) {
            again_on(b, a, idx, o, certified, /*merge=*/false, &out, &verdict);
        };
        std::vector<int> again;
        pass(b, allowed ? &a : nullptr, opts, &out, deepen ? &again : nullptr, certify || adapt ? &verdict : nullptr,
             /*settle=*/adapt);
        TMS_RETURN_IF_ERROR(st);
        // Filtered queries whose pruning was not trusted: once, scoring every document reached.
        if (!again.empty()) again_with(again, engine::DeepenedSearch(opts), /*certified=*/false);
        TMS_RETURN_IF_ERROR(st);
        for (int i = 0; adapt && i < nb; ++i)
            if (verdict[size_t(i)] != kCertified) unsettled.push_back(int(q0) + i);
        // The queries not certified, searched once more, `steps` steps deeper: those whose
        // rerank's bound failed reranking more, the others probing and keeping more too.
        if (certify) {
            const int steps = opts.certify_steps < 0 ? kCertifySteps : opts.certify_steps;
            std::vector<int> rerank_more, prune_more;
            for (int i = 0; i < nb; ++i) {
                if (verdict[size_t(i)] == kRerankBound) rerank_more.push_back(i);
                if (verdict[size_t(i)] == kPruningBound) prune_more.push_back(i);
            }
            for (const bool pruning : {false, true}) {
                const std::vector<int>& idx = pruning ? prune_more : rerank_more;
                if (idx.empty() || steps == 0) continue;
                SearchOptions d = opts;
                for (int s = 0; s < steps; ++s) d = CertifyDeeper(d, pruning);
                again_with(idx, d, /*certified=*/true);
                TMS_RETURN_IF_ERROR(st);
                for (const int i : idx) t.depth[size_t(q0 + i)] = uint8_t(steps);
            }
        }
        for (int i = 0; certify && i < nb; ++i) t.certified[size_t(q0 + i)] = verdict[size_t(i)] == kCertified;
        std::move(out.begin(), out.end(), results->begin() + q0);
    }
    // The queries not settled, searched once more, `steps` steps deeper, together (a pass's
    // fixed costs paid once, not per chunk); each keeps the best of both searches (those of the
    // first are exact scores too).
    const int steps = opts.certify_steps < 0 ? kAdaptiveSteps : opts.certify_steps;
    if (adapt && !unsettled.empty() && steps > 0) {
        SearchOptions d = opts;
        for (int s = 0; s < steps; ++s) d = CertifyDeeper(d, /*pruning=*/true);
        const int64_t deep_chunk = chunk_queries(d, q.q_tokens, n_centroids, n_docs);
        const Allowed whole = allowed ? *allowed : Allowed{};
        for (size_t c0 = 0; c0 < unsettled.size(); c0 += size_t(deep_chunk)) {
            const std::vector<int> idx(
                unsettled.begin() + ptrdiff_t(c0),
                unsettled.begin() + ptrdiff_t(std::min(unsettled.size(), c0 + size_t(deep_chunk))));
            again_on(q, whole, idx, d, /*certified=*/false, /*merge=*/true, results, nullptr);
            TMS_RETURN_IF_ERROR(st);
        }
        for (const int i : unsettled) t.depth[size_t(i)] = uint8_t(steps);
    }
    t.total = SecondsSince(t_start);
    if (timings) *timings = t;
    return Status::OK();
}

}  // namespace tms::engine

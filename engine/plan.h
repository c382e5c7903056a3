// Copyright TileMaxSim authors. The search plan: every rule that turns the options a caller gave
// into the nprobe, ncandidates, rerank and exhaustiveness a search runs with, in one place.
// Internal to the engine (Searcher::Plan is the public view).
//
//   PlanSearch         the index's recall estimate for target_recall; small indexes exhaustive
//   WidenForAllowed    a filter or subset: more lists probed, more candidates reranked
//   DeepenedSearch     the second search of filtered queries whose pruning was not trusted
//   CertifyDeeper      the next search of a query whose top-k was not certified or settled
//   Adapts             whether a search searches its unsettled queries again (SettledRanks)
//   ProbesPerToken     the lists a query token probes on an index
#pragma once

#include <algorithm>
#include <cstdint>

#include "tilemaxsim/estimate.h"
#include "tilemaxsim/options.h"
#include "tilemaxsim/types.h"

namespace tms {

/// `opts` with nprobe, ncandidates and rerank taken from est.For(opts.target_recall), each only
/// where it holds SearchOptions' default (a value set otherwise is kept); `opts` as given when
/// target_recall is 0, when the search is exhaustive or when `est` has no points.
SearchOptions ApplyTargetRecall(const RecallEstimate& est, const SearchOptions& opts);
/// The search a call runs (Searcher::Plan): with target_recall > 0 and not exhaustive, `opts`
/// with the estimate's setting for the target (ApplyTargetRecall; `est` may be null) when it was
/// measured as the search runs (with the vectors loaded, or `compressed` without them), and then
/// exhaustive when the index's `live_docs` are at most SmallIndexDocs (exhaustive search scores
/// them all exactly, for less); else `opts` as given. With adaptive (or certify) and `vectors`,
/// the start is no deeper than the defaults and certify_steps reaches the estimate's setting;
/// `adaptive` stays true only where the search searches unsettled queries again. `device`:
/// where the search runs (kCpu or kGpu).
SearchOptions PlanSearch(const RecallEstimate* est, int64_t live_docs, bool vectors, Device device,
                         const SearchOptions& opts);
/// The live documents up to which exhaustive search is cheaper than `o`'s approximate search on
/// `device`: o.rerank on a CPU, 2 * o.ncandidates on a GPU.
int64_t SmallIndexDocs(Device device, const SearchOptions& o);

namespace engine {

/// The most lists a query token probes, the most the GPU's candidate generation takes: a filter
/// widens probing up to it (WidenForAllowed), and so does a second search (DeepenedSearch).
constexpr int kMaxWidenedProbes = 64;
/// The most documents a filtered query reranks (WidenForAllowed).
constexpr int kMaxWidenedRerank = 4096;
/// A second search probes this many times the lists of the first (DeepenedSearch).
constexpr int kDeepenProbes = 2;

/// A query allowed `allowed` of the `n_docs` documents (a share f) finds about f of its usual
/// candidates in the lists it probes, so it probes given.nprobe / sqrt(f) lists (at most
/// kMaxWidenedProbes; not when `direct`: it scores every allowed document), and its best
/// documents score closer to the rest than an unfiltered query's, so it reranks
/// given.rerank / sqrt(f) of them (at most kMaxWidenedRerank and `allowed`). *o keeps the widest
/// of its rows (a batch runs as its widest row needs).
void WidenForAllowed(const SearchOptions& given, int64_t allowed, int64_t n_docs, bool direct, SearchOptions* o);

/// The second search of a filtered query whose pruning did not rank its best documents
/// (pipeline.cpp): kDeepenProbes times the lists (at most kMaxWidenedProbes), every document they
/// reach scored (ncandidates 0).
SearchOptions DeepenedSearch(const SearchOptions& opts);

/// A query not certified is searched again this many steps deeper (SearchOptions::certify)
/// where neither the caller nor an estimate says.
constexpr int kCertifySteps = 3;
/// The next search of a query not certified after a search with `o`: where only the rerank's
/// bound failed (`pruning` false), twice the rerank (and the candidates at least that); else
/// half again the probes (at most kMaxWidenedProbes), twice the candidates and the rerank.
SearchOptions CertifyDeeper(const SearchOptions& o, bool pruning);
/// Whether a search with `o` (and vectors loaded) certifies its queries.
inline bool Certifies(const SearchOptions& o) {
    return o.certify && !o.exhaustive && o.rerank > 0 && o.ncandidates > 0 && o.pruning == Pruning::kProbe;
}
/// A query not settled (SearchOptions::adaptive) is searched again at least this many, and where
/// neither the caller nor an estimate says, this many, steps deeper: on the MiniLM text of
/// BENCHMARKS.md one step left its unsettled queries at 0.990-0.994, two at 0.997-0.999.
constexpr int kAdaptiveSteps = 2;
/// ... and at most this many (as deep as the estimate's setting: 8 / 1,024 / 256 to 27 / 8,192 /
/// 2,048).
constexpr int kMaxAdaptiveSteps = 3;
/// A query's top-k is settled when each of its documents is among the first this many of its
/// compressed ranking (SearchOptions::adaptive): where the codes rank the best documents first,
/// deeper searches find the same ones.
inline int SettledRanks(int k) { return k + (3 * k + 4) / 5; }
/// Whether a search with `o` (as PlanSearch planned it: adaptive only with target_recall and
/// vectors; vectors loaded) searches again the queries it did not settle.
inline bool Adapts(const SearchOptions& o) { return o.adaptive && !o.certify && !o.exhaustive && o.rerank > 0; }

/// The lists each query token probes on an index of `n_centroids`.
inline int ProbesPerToken(const SearchOptions& o, int n_centroids) { return std::min(o.nprobe, n_centroids); }

}  // namespace engine
}  // namespace tms

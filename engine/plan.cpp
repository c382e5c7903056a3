// Copyright TileMaxSim authors. The search plan (plan.h).
#include "engine/plan.h"

#include <algorithm>
#include <cmath>

namespace tms {

int64_t SmallIndexDocs(Device device, const SearchOptions& o) {
    // Exhaustive search scores every live document exactly; the approximate pipeline's fixed costs
    // (centroid scores, probing, pruning, gathering candidates) make it the slower of the two on a
    // small index: on a CPU up to about the documents it reranks exactly, on a GPU up to about
    // twice the candidates it keeps (tools/experiments/small_corpus_crossover.sh; BENCHMARKS.md,
    // "Small indexes").
    return device == Device::kGpu ? 2 * int64_t(o.ncandidates) : int64_t(o.rerank);
}

SearchOptions PlanSearch(const RecallEstimate* est, int64_t live_docs, bool vectors, Device device,
                         const SearchOptions& opts) {
    if (opts.exhaustive || !(opts.target_recall > 0)) {
        SearchOptions o = opts;
        o.adaptive = false;  // the settings as given, for every query
        return o;
    }
    // An estimate measured with the vectors plans searches that rerank with them; one measured
    // without (RecallEstimate::compressed), searches of the compressed ranking alone.
    const bool applies = est != nullptr && est->compressed != vectors;
    SearchOptions o = applies ? ApplyTargetRecall(*est, opts) : opts;
    const bool certify = engine::Certifies(o);
    if (vectors && (certify || engine::Adapts(o))) {
        // The queries that need it go deeper: the search starts no deeper than the defaults
        // (where the estimate is cheaper, there), and goes as far as the estimate's setting
        // (at least the least steps).
        const SearchOptions planned = o;
        o.nprobe = std::min(o.nprobe, std::max(opts.nprobe, SearchOptions().nprobe));
        o.ncandidates = std::min(o.ncandidates, std::max(opts.ncandidates, SearchOptions().ncandidates));
        o.rerank = std::min(o.rerank, std::max(opts.rerank, SearchOptions().rerank));
        if (o.certify_steps < 0) {
            const int least = certify ? 1 : engine::kAdaptiveSteps;
            const int most = certify ? engine::kCertifySteps : engine::kMaxAdaptiveSteps;
            o.certify_steps = certify ? engine::kCertifySteps : engine::kAdaptiveSteps;
            if (applies && est->For(opts.target_recall) != nullptr) {
                o.certify_steps = most;
                SearchOptions d = o;
                for (int s = 1; s <= most; ++s) {
                    d = engine::CertifyDeeper(d, /*pruning=*/true);
                    if (s >= least && d.nprobe >= planned.nprobe && d.ncandidates >= planned.ncandidates &&
                        d.rerank >= planned.rerank) {
                        o.certify_steps = s;
                        break;
                    }
                }
            }
        }
    }
    if (vectors && o.rerank > 0 && live_docs <= SmallIndexDocs(device, o)) o.exhaustive = true;
    o.adaptive = vectors && engine::Adapts(o);  // true only where the search does adapt
    return o;
}

SearchOptions ApplyTargetRecall(const RecallEstimate& est, const SearchOptions& opts) {
    const RecallPoint* p = est.For(opts.target_recall);
    if (opts.exhaustive || !(opts.target_recall > 0) || p == nullptr) return opts;
    const SearchOptions d;
    SearchOptions o = opts;
    if (o.nprobe == d.nprobe) o.nprobe = p->nprobe;
    if (o.ncandidates == d.ncandidates) o.ncandidates = p->ncandidates;
    if (o.rerank == d.rerank) o.rerank = p->rerank;
    return o;
}

namespace engine {

void WidenForAllowed(const SearchOptions& given, int64_t allowed, int64_t n_docs, bool direct, SearchOptions* o) {
    const double widen = 1.0 / std::sqrt(std::max(double(allowed), 1.0) / double(n_docs));
    if (given.rerank > 0) {
        const double wide = std::min<double>({std::ceil(given.rerank * widen), double(allowed), kMaxWidenedRerank});
        o->rerank = std::max(o->rerank, int(wide));
    }
    if (direct || given.nprobe >= kMaxWidenedProbes) return;
    o->nprobe = std::max(o->nprobe, int(std::min<double>(kMaxWidenedProbes, std::ceil(given.nprobe * widen))));
}

SearchOptions DeepenedSearch(const SearchOptions& opts) {
    SearchOptions wide = opts;
    wide.ncandidates = 0;
    wide.nprobe = std::min(kMaxWidenedProbes, std::max(opts.nprobe, opts.nprobe * kDeepenProbes));
    return wide;
}

SearchOptions CertifyDeeper(const SearchOptions& o, bool pruning) {
    SearchOptions d = o;
    d.rerank = 2 * o.rerank;
    if (pruning) {
        d.nprobe = std::max(o.nprobe, std::min(kMaxWidenedProbes, o.nprobe + std::max(1, o.nprobe / 2)));
        d.ncandidates = 2 * o.ncandidates;
    }
    d.ncandidates = std::max(d.ncandidates, d.rerank);
    return d;
}

}  // namespace engine
}  // namespace tms

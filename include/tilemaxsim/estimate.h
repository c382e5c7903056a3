// Copyright TileMaxSim authors. An index's measured approximation: how closely its approximate
// search finds the exact top-k, measured once (at the end of `tms index`, or by `tms estimate`)
// and used to choose the search's parameters for a target recall.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tilemaxsim/options.h"
#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms {

struct QueryBatch;

/// recall@k of approximate search against exhaustive search at one setting.
struct RecallPoint {
    int nprobe = 0, ncandidates = 0, rerank = 0;
    double recall = 0;
};

/// The measurement: pseudo-queries (token sets drawn from the index's documents, perturbed)
/// searched exactly and at a ladder of settings, cheapest first; points[0] is SearchOptions'
/// default setting. Stored beside the index (estimate.json; `tms compact` keeps it).
struct RecallEstimate {
    int queries = 0;
    /// The queries were EstimateOptions::sample, not pseudo-queries.
    bool sampled = false;
    int k = 10;
    std::vector<RecallPoint> points;
    /// The cheapest point whose recall reaches `target`, or the last (the deepest) when none
    /// does; null without points.
    const RecallPoint* For(double target) const;
};

struct EstimateOptions {
    /// Pseudo-queries (0: 256 when the search runs on a GPU, 64 on the CPU).
    int queries = 0;
    /// Where the searches run (as SearcherOptions::device).
    Device device = Device::kAuto;
    uint64_t seed = 1234;
    /// Tokens of each pseudo-query (at most those of its document).
    int query_tokens = 32;
    /// The perturbation: each token is its document's token plus Gaussian noise of this norm,
    /// renormalised (0.5: cosine ~0.9 to the token it came from).
    float noise = 0.5f;
    /// The share of each pseudo-query's tokens drawn from other random documents instead of
    /// its own: real queries match no one document as closely as its own tokens do. With 0.6
    /// (and noise 0.5) the estimate came within 0.036 of the recall real queries measured on
    /// `tms synth` and on man pages encoded by MiniLM (BENCHMARKS.md, "Recall estimate").
    float mix = 0.6f;
    /// With n > 0 the mixed-in tokens come from the n documents that the pseudo-query's own
    /// tokens retrieve (a default search of them), not from random documents.
    int related = 0;
    /// With m > 0 a pseudo-query is a span of m of its document's tokens and, for its other
    /// tokens, their mean (as ColBERT pads a query with [MASK]s that encode its sense).
    int content_tokens = 0;
    /// Queries of your own (a sample of real ones) measured instead of pseudo-queries: all of them
    /// are searched, and the estimate is of their recall. Null: pseudo-queries.
    const QueryBatch* sample = nullptr;
};

/// Measures the index at `path` (it must keep its vectors: exhaustive search is the truth) and
/// stores the result beside it, atomically.
Status EstimateRecall(const std::string& path, const EstimateOptions& opts, RecallEstimate* out);
/// The stored measurement of the index at `path`; NotFound when it has none.
Status ReadRecallEstimate(const std::string& path, RecallEstimate* out);
/// `opts` with nprobe, ncandidates and rerank taken from est.For(opts.target_recall), each only
/// where it holds SearchOptions' default (a value set otherwise is kept); `opts` as given when
/// target_recall is 0, when the search is exhaustive or when `est` has no points.
SearchOptions ApplyTargetRecall(const RecallEstimate& est, const SearchOptions& opts);

}  // namespace tms

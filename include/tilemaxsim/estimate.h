// Copyright TileMaxSim authors. An index's measured approximation: how closely its approximate
// search finds the exact top-k, measured once (at the end of `tms index`, or by `tms estimate`)
// and used to choose the search's parameters for a target recall.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "tilemaxsim/options.h"
#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms {

struct QueryBatch;
class Searcher;

/// recall@k of approximate search against exhaustive search at one setting.
struct RecallPoint {
    int nprobe = 0, ncandidates = 0, rerank = 0;
    double recall = 0;
    /// The standard error of `recall`, a mean over the queries measured (0: unknown, an estimate
    /// stored before it was recorded).
    double se = 0;
    /// What the queries' recall is at least, at one-sided 95% confidence, as far as the queries
    /// measured tell: recall - 1.645 se.
    double Lower() const { return recall - 1.645 * se; }
};

/// The measurement: pseudo-queries (token sets drawn from the index's documents, perturbed)
/// searched exactly and at a ladder of settings, cheapest first: a few cheaper than
/// SearchOptions' default setting, the default (Default()), then deeper ones. Stored beside the
/// index (estimate.json; `tms compact` keeps it).
struct RecallEstimate {
    int queries = 0;
    /// The queries were EstimateOptions::sample, not pseudo-queries.
    bool sampled = false;
    /// When it was measured, UTC, ISO 8601 ("2026-12-06T12:00:00Z"); empty for an estimate
    /// written before the time was recorded.
    std::string measured_at;
    int k = 10;
    /// Measured without stored vectors (EstimateOptions::documents: the truth from the build's
    /// input): the compressed ranking alone, as an index without vectors searches. Such an
    /// estimate plans the searches of an index opened without vectors, the other kind those of
    /// one opened with them.
    bool compressed = false;
    /// Live documents of the index it was measured on.
    int64_t documents = 0;
    std::vector<RecallPoint> points;
    /// The cheapest point whose recall reaches `target` beyond its sampling error (Lower()): 64
    /// queries that measure 0.994 do not tell 0.99 from 0.98; when none does, the cheapest within
    /// kSaturated of the best point's recall (deeper settings past where the curve flattens buy
    /// almost nothing: a codec that bounds the recall, say); null without points. For targets at
    /// or above SearchOptions' default one, only points from the default setting on (the
    /// defaults are the floor of the default search).
    const RecallPoint* For(double target) const;
    /// Whether For(target) reaches `target` beyond its sampling error (its Lower()).
    bool Reaches(double target) const {
        const RecallPoint* p = For(target);
        return p != nullptr && p->Lower() >= target;
    }
    /// The point of SearchOptions' default setting; null when it was not measured.
    const RecallPoint* Default() const;
    static constexpr double kSaturated = 0.002;
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
    /// its own (content_tokens 0): real queries match no one document as closely as its own
    /// tokens do.
    float mix = 0.6f;
    /// With m > 0 a pseudo-query is a span of m of its document's tokens (11: a short query's
    /// wordpieces with [CLS] [Q] ... [SEP]), and its other query_tokens - m tokens are copies of
    /// one vector far from them that the corpus matches only weakly, as the [MASK]s that pad a
    /// ColBERT query are when a BERT not trained for ColBERT encodes them. Which recipe fits
    /// depends on the query encoder (BENCHMARKS.md, "Recall estimate"); `sample` knows it.
    int content_tokens = 0;
    /// The padding vector of span queries: a token of a random document moved by Gaussian noise
    /// of this norm, renormalised (1.7: cosine ~0.5 to it).
    float pad_noise = 1.7f;
    /// Queries of your own (a sample of real ones) measured instead of pseudo-queries: all of them
    /// are searched, and the estimate is of their recall. Null: pseudo-queries.
    const QueryBatch* sample = nullptr;
    /// An open searcher of the index at `path` to measure with (its device and placement; it
    /// must have loaded the vectors), instead of opening one (twice the memory). Null: one is
    /// opened on `device`.
    const Searcher* searcher = nullptr;
    /// Set (to true) by another thread: the measurement ends before its next search with
    /// Cancelled, storing nothing (a server shutting down). Null: it runs to its end.
    const std::atomic<bool>* stop = nullptr;
    /// The documents the index was built from, in its order (a new index's input: row block d
    /// of `documents`, doc_lengths[d] rows, is internal id d), for an index without stored
    /// vectors: pseudo-queries are drawn from them and the exact top-k is computed from them
    /// (on the CPU), and the estimate is `compressed`. The index must have no deletions. Null:
    /// the index's stored vectors.
    const EmbeddingView* documents = nullptr;
    const std::vector<int64_t>* doc_lengths = nullptr;
    /// Store the result beside the index (false: only return it; StoreRecallEstimate stores it
    /// later, e.g. where writes to the index are serialized).
    bool store = true;
};

/// Measures the index at `path` (it must keep its vectors, exhaustive search the truth, unless
/// EstimateOptions::documents gives them) and stores the result beside it, atomically.
Status EstimateRecall(const std::string& path, const EstimateOptions& opts, RecallEstimate* out);
/// Stores `e` beside the index at `path`, atomically (the measurement searches plan from when
/// the index is opened next). `recipe`: the pseudo-queries' options, recorded with an estimate
/// that is not `sampled`.
Status StoreRecallEstimate(const std::string& path, const RecallEstimate& e, const EstimateOptions* recipe = nullptr);
/// The stored measurement of the index at `path`; NotFound when it has none.
Status ReadRecallEstimate(const std::string& path, RecallEstimate* out);

/// The ladder of `--codec auto` (tms index; Python build_index(codec="auto")): PQ of dim/8
/// sub-quantizers (the default), then twice and four times as many, each judged by its build's
/// compressed estimate `e`. After a build of `pq_m` sub-quantizers (the ladder's first had
/// `first_pq_m`), the next one's count, or 0 to keep this build: it Reaches(target), or the
/// ladder ends (past 4x the first, or a count that does not divide `dim`).
int NextAutoCodecPqM(const RecallEstimate& e, double target, int dim, int first_pq_m, int pq_m);
}  // namespace tms

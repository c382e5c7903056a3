// Copyright TileMaxSim authors. `tms bench search` (see bench_search.cpp).
#pragma once

#include <string>
#include <vector>

#include "tilemaxsim/options.h"
#include "tilemaxsim/status.h"

namespace tms::bench {

struct SearchBenchOptions {
    std::string index, queries;               ///< index directory, queries .npy [n, tokens, dim]
    SearcherOptions searcher;                 ///< where the shards go
    SearchOptions search;                     ///< the first row's parameters (the defaults)
    int batch = 256;                          ///< queries per call in the batch rows
    int passes = 3;                           ///< batch passes over the queries (the best is reported)
    int exhaustive_passes = 1;                ///< exhaustive passes (the best is reported; the first is cold)
    int single = 200;                         ///< one-query calls for the latency percentiles (0: none)
    std::vector<int> concurrency{1, 16, 64};  ///< caller threads, one query per call
    /// Further rows, batch queries/s and recall only: every combination of these lists (empty: the
    /// first row's value).
    std::vector<int> nprobe_list, ncandidates_list, rerank_list;
    std::vector<Pruning> pruning_list;
    bool recall = true;  ///< exhaustive search first (needs vectors), then recall@k
    /// A TREC run (qids "0", "1", ... in query order; external doc ids) taken as the truth instead
    /// of an exhaustive search: recall for an index without vectors, or against another system.
    std::string truth;
    std::string truth_out;  ///< where to write the exhaustive run (the same format)
    /// A peer system measured in the same call, on the same embeddings against the same truth:
    /// "fast-plaid" (peer_script, Python, fast-plaid importable) or empty. Its row follows ours.
    std::string peer;
    std::string peer_corpus;  ///< its embeddings (`tms synth`'s layout); empty: --queries' directory
    std::string peer_script = "tools/experiments/fast_plaid_peer.py";
    int peer_nbits = 2;
    std::string command;  ///< recorded in the JSON
};

/// One process: opens the index (timed; host and device memory after), searches exhaustively
/// for the truth, then per row the batch queries/s (best of `passes`) with its time per stage and
/// recall@k against the truth; the first row also the one-query latency p50 / p99 and the
/// queries/s of N concurrent callers of one query each. Returns the JSON of
/// data/results/search-*.json and prints a table on stderr.
Status RunSearchBench(const SearchBenchOptions& o, std::string* json);

}  // namespace tms::bench

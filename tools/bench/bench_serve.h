// Copyright TileMaxSim authors. `tms bench serve` (see bench_serve.cpp).
#pragma once

#include <string>
#include <vector>

#include "tilemaxsim/options.h"
#include "tilemaxsim/status.h"

namespace tms::bench {

struct ServeBenchOptions {
    std::string index, queries;  ///< index directory, queries .npy [n, tokens, dim]
    SearcherOptions searcher;    ///< gather is on, as the server runs
    int k = 10;
    std::vector<int> clients{1, 16, 64, 256};  ///< concurrent clients, one query per request
    double seconds = 5;                        ///< each row's measured time
    /// Rows again with a writer adding this many documents a second through the server (0: none).
    /// The documents (ids bench-write-N, copies of queries) are deleted at the end.
    double writer_rate = 0;
    int workers = 0;  ///< the server's search workers (0: the most clients, at least 64)
    std::string command;
};

/// Per client count: the in-process queries/s of that many threads calling Searcher::Search with
/// one query each, then the same index served over HTTP on loopback (tms serve's server, in this
/// process) to that many keep-alive connections sending one query each (.npy bodies): queries/s,
/// p50 / p99 latency, errors by status; with writer_rate, again while a writer adds documents.
/// Returns the JSON of data/results/serve-*.json and prints a table on stderr.
Status RunServeBench(const ServeBenchOptions& o, std::string* json);

}  // namespace tms::bench

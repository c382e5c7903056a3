// Copyright TileMaxSim authors. A synthetic corpus that behaves like ColBERT output.
#pragma once

#include <cstdint>
#include <string>

#include "tilemaxsim/status.h"

namespace tms {

/// Parameters of the synthetic corpus.
struct SynthOptions {
    /// Documents. Default: 2000
    int64_t n_docs = 2000;
    /// Queries (each has one relevant document). Default: 100
    int n_queries = 100;
    /// Embedding dimension. Default: 128
    int dim = 128;
    /// Tokens per query. Default: 32
    int q_tokens = 32;
    /// Document lengths are uniform in [min_doc_len, max_doc_len]. Default: 16, 96
    int min_doc_len = 16;
    int max_doc_len = 96;
    /// Random seed. Default: 42
    uint64_t seed = 42;
};

/// Writes DIR/docs.npy (float16 [total_tokens, dim], unit rows), DIR/doclens.npy (int32),
/// DIR/doc_ids.txt, DIR/queries.npy (float16 [n_queries, q_tokens, dim]), DIR/query_ids.txt,
/// DIR/qrels.tsv (BEIR). Documents belong to clustered topics and share topic "words";
/// a query mixes noisy copies of a few of its relevant document's tokens with words of the
/// same topic, so the relevant document is findable but competes with its topic-mates.
Status WriteSynthCorpus(const SynthOptions& opts, const std::string& dir);

}  // namespace tms

// Copyright TileMaxSim authors. The queries of a search or rerank and their options: loaded, checked, searched
// in batches and written as a TREC run (tms search, tms rerank, tms demo).
#pragma once

#include <string>
#include <vector>

#include "tools/tms/common.h"

namespace tms::cli {

struct SearchArgs {
    std::string index, queries, query_ids, out, device = "auto", devices, tag = "tms", subset, vectors = "auto",
                                                pruning = tms::PruningName(tms::SearchOptions().pruning);
    tms::SearchOptions opts;
    int batch = 256;
    int64_t stream_mib = tms::SearcherOptions().stream_bytes >> 20;
    int64_t filter_time_ms = tms::SearcherOptions().filter_time_ms;
    int64_t filter_max_bytes = tms::SearcherOptions().filter_max_bytes;
    double mpi_timeout = 600;
    bool no_progress = false;
    std::string record_queries;  // tms search --record-queries: the sample's file
    int record_max = 1000;
    std::string query_text, mode = "maxsim", fusion = "weighted";  // --query-text, --mode, --fusion
    std::string explain;                                           // --explain: the explanations' file
    std::string certificates;                                      // --certificates: each query's certification, TSV
};

// The queries of a search (--queries, --query-ids) as one batch over arr's bytes.
tms::Status load_queries(const SearchArgs& a, tms::HostArray* arr, tms::QueryBatch* all, std::vector<std::string>* ids);

// The search options and searcher options of the command line.
tms::Status search_options(const SearchArgs& a, bool quiet, tms::SearchOptions* opts, tms::SearcherOptions* so);

// --queries' dimension against the index's.
tms::Status check_query_dim(const SearchArgs& a, const tms::QueryBatch& all, const tms::IndexInfo& info);
/// --query-text's lines, one per query of `all` (modes bm25 and hybrid): one line naming the
/// file when it is missing or holds another count.
tms::Status read_query_texts(const SearchArgs& a, const tms::QueryBatch& all, std::vector<std::string>* texts);

// A recall estimate's sample of real queries (--sample FILE): `eo` measures them, not pseudo-queries.
struct EstimateSample {
    tms::HostArray arr;
    tms::QueryBatch batch;
};
tms::Status load_estimate_sample(const std::string& path, EstimateSample* s, tms::EstimateOptions* eo);

// The documents an index without vectors was built from (--docs FILE.npy, --doclens): `eo`
// draws its pseudo-queries from them and computes the truth from them (EstimateOptions::documents).
struct EstimateInput {
    std::unique_ptr<tms::index::MappedNpy> docs;
    tms::EmbeddingView view;
    std::vector<int64_t> lens;
};
tms::Status load_estimate_input(const std::string& docs, const std::string& doclens, EstimateInput* in,
                                tms::EstimateOptions* eo);

// What search and rerank start from: the queries (over arr's bytes), their ids, the options,
// and the opened index.
struct QueryJob {
    tms::HostArray arr;
    tms::QueryBatch whole;
    std::vector<std::string> qids;
    tms::SearchOptions opts;
    std::unique_ptr<tms::Searcher> searcher;
    std::vector<std::string> texts;  // --query-text's, one per query (modes bm25 and hybrid)
};
tms::Status open_query_job(const SearchArgs& a, bool quiet, QueryJob* j);

// The documents --subset allows, as internal ids: a file of external ids (one per line: one row,
// for every query) or of QUERY_ID<TAB>DOC_ID lines (a row per query; a query with no line allows
// nothing). Ids the index does not hold allow nothing; a note on stderr counts them.
tms::Status read_subset(const std::string& path, const tms::Searcher& s, const std::vector<std::string>& qids,
                        bool quiet, std::vector<std::vector<int64_t>>* rows);

// --out of a search or rerank: never one of its inputs, never inside an index ("-": stdout).
tms::Status check_run_output(const SearchArgs& a, const std::string& first_stage = "");

// Loads queries, searches in batches, writes the run. Prints a summary to stderr.
tms::Status run_search(const SearchArgs& a, bool quiet, double* qps);

inline constexpr const char* kStreamHelp =
    "With --vectors host or disk: MiB of vectors an exhaustive search reads and scores per step (the next step "
    "is read and copied while one is scored; two steps' buffers on the host and on the GPU)";

inline constexpr const char* kVectorsHelp =
    "Where the stored fp16 vectors (exact rerank, --exhaustive) live: gpu (with the codes), host (host memory; "
    "each search copies its candidates' rows to the GPU), disk (read from the index as searches need them), none, "
    "or auto (the fastest that fits)";

// The options tms search takes beyond its files (tms bench search has its own).
void add_search_options(CLI::App* c, SearchArgs* a);

}  // namespace tms::cli

// Copyright TileMaxSim authors. Evaluation: TREC run / qrels I/O and trec_eval IR metrics.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tilemaxsim/status.h"

namespace tms {

/// A retrieval run: qid -> list of (docid, score), in file order.
/// Ranking is always recomputed from the scores (see Evaluate); ranks are not stored.
using Run = std::map<std::string, std::vector<std::pair<std::string, double>>>;

/// Relevance judgments: qid -> docid -> relevance grade.
/// Grades >= 1 are relevant; 0 is judged non-relevant; negative grades mean
/// "in the pool but unjudged" (trec_eval) and count as non-relevant with gain 0.
using Qrels = std::map<std::string, std::map<std::string, int>>;

/// Reads a TREC run file: one line `qid Q0 docid rank score tag` per result,
/// 6 whitespace-separated fields (the Q0 and tag fields are not checked; rank must be
/// an integer but is otherwise ignored). Blank lines are skipped.
/// Errors (the message is one line, `PATH:LINE: ...` for a bad line):
///   - NotFound "PATH: no such file";
///   - InvalidArgument for a wrong field count, a non-integer rank, a non-numeric or
///     NaN score, or a (qid, docid) pair seen twice;
///   - InvalidArgument "PATH: no run lines" for a file without results;
///   - IOError when the file exists but cannot be read.
/// On success `*run` is replaced; on error it is left unchanged.
/// Thread-safety: reentrant.
Status ReadRun(const std::string& path, Run* run);

/// Reads relevance judgments in either format, detected from the first non-blank line:
///   - TREC qrels: `qid iter docid rel`, 4 whitespace-separated fields (iter ignored);
///   - BEIR TSV: `query-id<TAB>corpus-id<TAB>score`, with an optional header line
///     `query-id\tcorpus-id\tscore`; chosen when the first line is that header or
///     has 3 tab-separated fields.
/// Relevance must be an integer. Blank lines are skipped. A (qid, docid) pair seen twice
/// with the same grade is accepted; with a different grade it is an error.
/// Errors: NotFound "PATH: no such file"; InvalidArgument "PATH:LINE: ..." for a bad line;
/// InvalidArgument "PATH: no qrels lines" for a file without judgments; IOError when the
/// file exists but cannot be read. On success `*qrels` is replaced; on error it is unchanged.
/// Thread-safety: reentrant.
Status ReadQrels(const std::string& path, Qrels* qrels);

/// Writes a TREC run: for each i, the results[i] list of (docid, score) for query qids[i],
/// in the given order (best first), as `qid Q0 docid rank score tag` with rank starting at 1
/// and the score printed with %.9g (exact for float, so the ranking by score is preserved).
/// Note trec_eval re-ranks by score and breaks ties by docid descending, not by this order.
/// The file is written to PATH.tmp, flushed to disk and renamed to PATH, so an interrupted
/// write never leaves a partial PATH.
/// Errors: InvalidArgument when qids and results differ in length, a qid is repeated, a
/// docid repeats within a query, an id or the tag is empty or contains whitespace, or a
/// score is NaN; IOError naming the path when the file cannot be written or renamed.
/// Thread-safety: reentrant; concurrent writers to the same PATH race on PATH.tmp.
Status WriteRun(const std::string& path, const std::vector<std::string>& qids,
                const std::vector<std::vector<std::pair<std::string, float>>>& results, const std::string& tag);

/// Mean metrics over the evaluated queries.
struct EvalResult {
    /// (name, mean value) in the order asked for (by default "mrr@10", "ndcg@10", "recall@100",
    /// "recall@1000").
    std::vector<std::pair<std::string, double>> metrics;
    /// Number of queries averaged: those present in both the run and the qrels.
    int n_queries = 0;
    /// When asked for: each evaluated query's values (qid order), in the order of `metrics`.
    std::vector<std::pair<std::string, std::vector<double>>> per_query;
};

/// The metrics `tms eval` reports by default.
inline const std::vector<std::string> kDefaultMetrics = {"mrr@10", "ndcg@10", "recall@100", "recall@1000"};

/// Parses a comma-separated metric list (`map,P@5,ndcg@20,recall@50,mrr@10,success@5`): names as
/// Evaluate takes them, each once. InvalidArgument naming an unknown name or a bad cutoff.
Status ParseMetricList(const std::string& list, std::vector<std::string>* metrics);

/// Computes, with trec_eval's definitions (as pytrec_eval reports them per query), the mean
/// over queries present in both `run` and `qrels` (queries with no relevant document count
/// as 0) of:
///   - "mrr@10": recip_rank on the run truncated to its top 10;
///   - "ndcg@10": ndcg_cut_10, gain = grade (grades <= 0 give 0), discount log2(rank + 1),
///     ideal DCG from the query's positive grades in the qrels, sorted descending, top 10;
///   - "recall@100", "recall@1000": recall_N, relevant (grade >= 1) documents in the top N
///     over all relevant documents of the query in the qrels (0 when there are none).
/// Each query's documents are ranked by score descending, ties broken by docid descending
/// (byte order), exactly as trec_eval does; like trec_eval, scores are compared after
/// conversion to float, so doubles equal in float precision tie.
/// Errors: InvalidArgument "no query of the run is in the qrels"; InvalidArgument when a
/// query of the run lists a docid twice or has a NaN score. On error `*out` is unchanged.
/// Thread-safety: reentrant.
Status Evaluate(const Run& run, const Qrels& qrels, EvalResult* out);
/// The same for any of trec_eval's measures, named (K a positive cutoff):
///   - "map" (map): the mean over the query's relevant documents of the precision at each one's
///     rank (unretrieved ones count 0); "map@K" (map_cut_K): ranks up to K only;
///   - "P@K" (P_K): relevant documents in the top K over K;
///   - "ndcg" (ndcg) and "ndcg@K" (ndcg_cut_K): as ndcg@10 above, over the whole run or the top K;
///   - "recall@K" (recall_K): as above;
///   - "mrr" (recip_rank) and "mrr@K": 1 / the rank of the first relevant document (in the top K);
///   - "success@K" (success_K): 1 when a relevant document is in the top K.
/// per_query: also each query's values (EvalResult::per_query).
Status Evaluate(const Run& run, const Qrels& qrels, const std::vector<std::string>& metrics, bool per_query,
                EvalResult* out);

/// Formats `result` for printing. Text (json = false): one line `NAME\tall\tVALUE` per metric,
/// VALUE with 4 decimals, as trec_eval prints, after (with per-query values) the lines
/// `NAME\tQID\tVALUE` of every query, as `trec_eval -q`. JSON (json = true): one object
/// `{"n_queries": N, "mrr@10": V, ..., "per_query": {QID: {NAME: V, ...}, ...}}` with values
/// printed to round-trip exactly.
/// Both forms end with a newline.
std::string FormatEval(const EvalResult& result, bool json);

}  // namespace tms

// Copyright TileMaxSim authors. `tms eval`: trec_eval's measures of a TREC run.
#include "tools/tms/common.h"

namespace tms::cli {

tms::Status eval_files(const std::string& run_path, const std::string& qrels_path, bool json, bool quiet,
                       tms::EvalResult* r, const std::string& metrics, bool per_query) {
    std::vector<std::string> names = tms::kDefaultMetrics;
    if (!metrics.empty()) TMS_RETURN_IF_ERROR(tms::ParseMetricList(metrics, &names).WithContext("--metrics"));
    tms::Run run;
    tms::Qrels qrels;
    TMS_RETURN_IF_ERROR(tms::ReadRun(run_path, &run));
    TMS_RETURN_IF_ERROR(tms::ReadQrels(qrels_path, &qrels));
    TMS_RETURN_IF_ERROR(tms::Evaluate(run, qrels, names, per_query, r));
    if (!quiet) std::fputs(tms::FormatEval(*r, json).c_str(), stdout);
    return tms::Status::OK();
}

Command AddEval(CLI::App& app) {
    struct State {
        std::string run_path, qrels_path;
        bool eval_json = false;
        std::string eval_metrics;
        bool eval_per_query = false;
    };
    auto s = std::make_shared<State>();
    auto& run_path = s->run_path;
    auto& qrels_path = s->qrels_path;
    auto& eval_json = s->eval_json;
    auto& eval_metrics = s->eval_metrics;
    auto& eval_per_query = s->eval_per_query;
    auto* eval = app.add_subcommand("eval",
                                    "Evaluate a TREC run with trec_eval's measures (default: mrr@10, ndcg@10, "
                                    "recall@100, recall@1000)");
    eval->add_option("--run", run_path, "TREC run file (qid Q0 docid rank score tag)")->required();
    eval->add_option("--qrels", qrels_path, "Qrels: TREC (qid 0 docid rel) or BEIR TSV with header")->required();
    eval->add_option("--metrics", eval_metrics,
                     "Comma-separated measures, cutoffs free: map, map@K, P@K, ndcg, ndcg@K, recall@K, mrr, mrr@K, "
                     "success@K (e.g. map,P@5,ndcg@20,recall@50,mrr@10,success@5)");
    eval->add_flag("--per-query", eval_per_query, "Also every query's values (NAME<TAB>QID<TAB>VALUE lines first)");
    eval->add_flag("--json", eval_json, "Print JSON instead of lines");
    auto run = [s]() -> int {
        auto& run_path = s->run_path;
        auto& qrels_path = s->qrels_path;
        auto& eval_json = s->eval_json;
        auto& eval_metrics = s->eval_metrics;
        auto& eval_per_query = s->eval_per_query;
        tms::EvalResult r;
        tms::Status st = eval_files(run_path, qrels_path, eval_json, false, &r, eval_metrics, eval_per_query);
        return st.ok() ? 0 : fail("eval", st);
    };
    return {eval, run};
}

}  // namespace tms::cli

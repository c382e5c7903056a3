// Copyright TileMaxSim authors. `tms rerank`: exact MaxSim of a first-stage run's candidates.
#include "tools/tms/common.h"
#include "base/log.h"
#include "base/progress.h"

#include "tools/tms/query.h"

namespace tms::cli {
namespace {

// Rescores each query's candidates from a first-stage run exactly and writes the new run.
tms::Status run_rerank(const SearchArgs& a, const std::string& first_stage) {
    TMS_RETURN_IF_ERROR(check_run_output(a, first_stage));
    tms::Run run;
    TMS_RETURN_IF_ERROR(tms::ReadRun(first_stage, &run));
    QueryJob job;
    TMS_RETURN_IF_ERROR(open_query_job(a, false, &job));
    const tms::QueryBatch& whole = job.whole;
    const std::vector<std::string>& qids = job.qids;
    const tms::Searcher* searcher = job.searcher.get();
    const int nq = whole.n_queries;
    int64_t unknown = 0, n_cand = 0;
    size_t matched = 0;
    std::vector<std::vector<std::pair<std::string, float>>> all(static_cast<size_t>(nq));
    tms::Progress prog("reranking", nq, !a.no_progress, " q");
    const auto t0 = Clock::now();
    for (int q0 = 0; q0 < nq; q0 += a.batch) {
        const tms::QueryBatch b = whole.Slice(q0, std::min(a.batch, nq - q0));
        std::vector<std::vector<int64_t>> cand(static_cast<size_t>(b.n_queries));
        for (int i = 0; i < b.n_queries; ++i) {
            const auto it = run.find(qids[size_t(q0 + i)]);
            if (it == run.end()) continue;
            ++matched;
            std::vector<std::string> ids;
            for (const auto& [doc, score] : it->second) ids.push_back(doc);
            std::vector<int64_t> internal;
            searcher->FindDocs(ids, &internal);
            for (int64_t d : internal) {
                if (d < 0)
                    ++unknown;
                else
                    cand[size_t(i)].push_back(d);
            }
            n_cand += int64_t(ids.size());
        }
        std::vector<std::vector<tms::SearchHit>> res;
        TMS_RETURN_IF_ERROR(searcher->Rerank(b, cand, a.opts.k, &res));
        for (int i = 0; i < b.n_queries; ++i) {
            for (auto& h : res[size_t(i)]) all[size_t(q0 + i)].emplace_back(std::move(h.doc_id), h.score);
        }
        prog.Add(b.n_queries);
    }
    prog.Done();
    const double secs = tms::SecondsSince(t0);
    TMS_RETURN_IF_ERROR(tms::WriteRun(a.out, qids, all, a.tag));
    tms::LogInfo("tms rerank: %zu of %d queries in the run, %lld candidates in %.3f s (%s) -> %s\n", matched, nq,
                 (long long)n_cand, secs, tms::DeviceName(searcher->device()), a.out.c_str());
    if (unknown > 0) {
        tms::LogWarning("tms rerank: %lld candidates are not in the index (or deleted): dropped\n", (long long)unknown);
    }
    if (matched < run.size()) {
        tms::LogWarning("tms rerank: %zu queries of the run are not among the queries: ignored\n",
                        run.size() - matched);
    }
    return tms::Status::OK();
}

}  // namespace

Command AddRerank(CLI::App& app) {
    struct State {
        SearchArgs ra;
        std::string rerank_run;
    };
    auto s = std::make_shared<State>();
    auto& ra = s->ra;
    auto& rerank_run = s->rerank_run;
    ra.tag = "tms-rerank";
    ra.opts.k = 0;
    auto* rr = app.add_subcommand("rerank",
                                  "Rescore a first-stage run's candidates (BM25's top 1000, ...) with exact MaxSim on "
                                  "the stored vectors: queries .npy + TREC run -> TREC run");
    rr->add_option("--index", ra.index, "Index directory (built with --keep-vectors)")->required();
    rr->add_option("--queries", ra.queries, "Query embeddings .npy [n_queries, tokens, dim]")->required();
    rr->add_option("--query-ids", ra.query_ids, "Query ids, one per line, as the run names them (default: 0..n-1)");
    rr->add_option("--run", rerank_run, "First-stage TREC run: its documents per query are the candidates")->required();
    rr->add_option("--out", ra.out, "TREC run file to write")->required();
    rr->add_option("--k", ra.opts.k, "Results per query (0: every candidate, reordered)")
        ->capture_default_str()
        ->check(CLI::Range(0, 100000000));
    rr->add_option("--tag", ra.tag, "Run tag (last TREC column)")->capture_default_str();
    rr->add_option("--device", ra.device, "Where to score: auto, cpu or gpu")->capture_default_str();
    rr->add_option("--devices", ra.devices, "Where the shards go: cpu, all, or GPUs like 0 or 0,1; overrides --device");
    rr->add_option("--batch", ra.batch, "Queries per call")->capture_default_str()->check(CLI::Range(1, 1 << 20));
    rr->add_flag("--no-progress", ra.no_progress, "No progress bars");
    auto run = [s]() -> int {
        auto& ra = s->ra;
        auto& rerank_run = s->rerank_run;
        tms::Status st = run_rerank(ra, rerank_run);
        return st.ok() ? 0 : fail("rerank", st);
    };
    return {rr, run};
}

}  // namespace tms::cli

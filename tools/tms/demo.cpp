// Copyright TileMaxSim authors. `tms demo`: end to end on a synthetic corpus (synth, index, search both ways,
// eval).
#include "tools/tms/common.h"
#include "base/progress.h"

#include <unistd.h>

#include <filesystem>

#include "tools/tms/query.h"

namespace tms::cli {

namespace {

double recall_vs(const std::string& approx, const std::string& exact, int k) {
    tms::Run a, e;
    if (!tms::ReadRun(approx, &a).ok() || !tms::ReadRun(exact, &e).ok()) return -1;
    double sum = 0;
    int n = 0;
    for (auto& [qid, ev] : e) {
        auto top = [k](std::vector<std::pair<std::string, double>> v) {
            std::stable_sort(v.begin(), v.end(), [](auto& x, auto& y) { return x.second > y.second; });
            if (int(v.size()) > k) v.resize(k);
            return v;
        };
        auto et = top(ev), at = top(a[qid]);
        int hit = 0;
        for (auto& x : et)
            for (auto& y : at) hit += x.first == y.first;
        sum += et.empty() ? 1.0 : double(hit) / et.size();
        ++n;
    }
    return n ? sum / n : -1;
}

}  // namespace

Command AddDemo(CLI::App& app) {
    struct State {
        std::string demo_dir;
        tms::SynthOptions demo_so;
        std::string demo_device = "auto";
    };
    auto s = std::make_shared<State>();
    auto& demo_dir = s->demo_dir;
    auto& demo_so = s->demo_so;
    auto& demo_device = s->demo_device;
    demo_so.n_docs = 1000;
    demo_so.n_queries = 100;
    auto* demo = app.add_subcommand("demo", "End to end on a synthetic corpus: synth, index, search, eval");
    demo->add_option("--dir", demo_dir, "Work directory (default: a new temporary directory)");
    demo->add_option("--docs", demo_so.n_docs, "Documents")->capture_default_str();
    demo->add_option("--queries", demo_so.n_queries, "Queries")->capture_default_str();
    demo->add_option("--dim", demo_so.dim, "Embedding dimension")->capture_default_str();
    demo->add_option("--device", demo_device, "auto, cpu or gpu")->capture_default_str();
    auto run = [s]() -> int {
        auto& demo_dir = s->demo_dir;
        auto& demo_so = s->demo_so;
        auto& demo_device = s->demo_device;
        namespace fs = std::filesystem;
        const auto t_all = Clock::now();
        if (demo_dir.empty()) {
            demo_dir = (fs::temp_directory_path() / ("tms-demo-" + std::to_string(::getpid()))).string();
        } else if (tms::Status st = tms::CheckOutputPath(demo_dir, tms::OutputKind::kDirectory).WithContext("--dir");
                   !st.ok()) {
            return fail("demo", st);
        }
        const fs::path d(demo_dir);
        std::printf("== tms demo in %s\n", demo_dir.c_str());
        auto t0 = Clock::now();
        tms::Status st = tms::WriteSynthCorpus(demo_so, demo_dir);
        if (!st.ok()) return fail("demo", st);
        std::printf("synth   %lld docs, %d queries, dim %d: %.2f s\n", (long long)demo_so.n_docs, demo_so.n_queries,
                    demo_so.dim, tms::SecondsSince(t0));
        tms::IndexBuildOptions bo;
        bo.keep_vectors = true;
        bo.overwrite = true;
        t0 = Clock::now();
        st = build_index((d / "docs.npy").string(), (d / "doclens.npy").string(), (d / "doc_ids.txt").string(),
                         (d / "index").string(), bo);
        if (!st.ok()) return fail("demo", st);
        std::printf("index   codec pq, vectors kept: %.2f s\n", tms::SecondsSince(t0));
        SearchArgs a;
        a.index = (d / "index").string();
        a.queries = (d / "queries.npy").string();
        a.query_ids = (d / "query_ids.txt").string();
        a.device = demo_device;
        a.opts.k = 1000;
        double qps_exact = 0, qps = 0;
        a.out = (d / "exhaustive.trec").string();
        a.opts.exhaustive = true;
        st = run_search(a, true, &qps_exact);
        if (!st.ok()) return fail("demo", st);
        a.out = (d / "run.trec").string();
        a.opts.exhaustive = false;
        st = run_search(a, true, &qps);
        if (!st.ok()) return fail("demo", st);
        tms::EvalResult r, re;
        st = eval_files(a.out, (d / "qrels.tsv").string(), false, true, &r);
        if (!st.ok()) return fail("demo", st);
        st = eval_files((d / "exhaustive.trec").string(), (d / "qrels.tsv").string(), false, true, &re);
        if (!st.ok()) return fail("demo", st);
        std::printf("search  default (PLAID candidates + PQ scoring + exact rerank): %.1f queries/s\n", qps);
        std::printf("search  exhaustive exact MaxSim: %.1f queries/s\n", qps_exact);
        std::printf("\n%-12s %10s %12s\n", "metric", "default", "exhaustive");
        for (size_t i = 0; i < r.metrics.size(); ++i) {
            std::printf("%-12s %10.4f %12.4f\n", r.metrics[i].first.c_str(), r.metrics[i].second, re.metrics[i].second);
        }
        std::printf("%-12s %10.4f\n", "recall@10 vs exhaustive",
                    recall_vs(a.out, (d / "exhaustive.trec").string(), 10));
        std::printf("\ntotal %.2f s; files in %s\n", tms::SecondsSince(t_all), demo_dir.c_str());
        return 0;
    };
    return {demo, run};
}

}  // namespace tms::cli

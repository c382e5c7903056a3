// Copyright TileMaxSim authors. `tms bench kernels | index | search | serve`: the benchmark harnesses (tools/bench/).
#include "tools/tms/common.h"

#include <fstream>
#include <iostream>

#include "tools/bench/bench_index.h"
#include "tools/bench/bench_kernels.h"
#include "tools/bench/bench_search.h"
#include "tools/bench/bench_serve.h"
#include "tools/tms/query.h"

namespace tms::cli {

std::vector<Command> AddBench(CLI::App& app, const Context& ctx) {
    struct State {
        std::string bench_json, bench_filter;
        tms::bench::KernelBenchOptions kbo;
        bool bk_no_baseline = false, bk_no_tma = false;
        tms::bench::IndexBenchOptions ibo;
        std::string ib_json, ib_device = "auto";
        tms::bench::SearchBenchOptions sbo;
        std::string sb_json, sb_device = "auto", sb_devices, sb_vectors = "auto",
                             sb_pruning = tms::PruningName(tms::SearchOptions().pruning);
        std::vector<std::string> sb_prunings;
        bool sb_no_recall = false;
        int64_t sb_stream_mib = tms::SearcherOptions().stream_bytes >> 20;
    };
    auto s = std::make_shared<State>();
    auto& bench_json = s->bench_json;
    auto& bench_filter = s->bench_filter;
    auto& kbo = s->kbo;
    auto& bk_no_baseline = s->bk_no_baseline;
    auto& bk_no_tma = s->bk_no_tma;
    auto& ibo = s->ibo;
    auto& ib_json = s->ib_json;
    auto& ib_device = s->ib_device;
    auto& sbo = s->sbo;
    auto& sb_json = s->sb_json;
    auto& sb_device = s->sb_device;
    auto& sb_devices = s->sb_devices;
    auto& sb_vectors = s->sb_vectors;
    auto& sb_pruning = s->sb_pruning;
    auto& sb_prunings = s->sb_prunings;
    auto& sb_no_recall = s->sb_no_recall;
    auto& sb_stream_mib = s->sb_stream_mib;
    auto* bench = app.add_subcommand("bench", "Benchmarks");
    bench->require_subcommand(1);
    auto* bk = bench->add_subcommand(
        "kernels",
        "GPU MaxSim kernels vs the read ceiling and a cuBLAS baseline: exact cases, then compressed ones "
        "(impl tilemaxsim-code; on Hopper also tilemaxsim-code-mma, the same call through mma.sync)");
    bk->add_option("--json", bench_json, "Write the results JSON here");
    bk->add_option("--cases", bench_filter, "Only cases whose name contains this");
    bk->add_flag("--no-baseline", bk_no_baseline, "Skip the cuBLAS GEMM + reduce baseline");
    bk->add_flag("--no-tma", bk_no_tma,
                 "Exact kernel: per-thread async copies instead of bulk tensor copies (for A/B runs)");
    bk->add_option("--docs", kbo.docs,
                   "Run the dense exact cases with this many documents instead of the table's B (e.g. to see "
                   "how the split of documents over the warps bounds a case)")
        ->check(CLI::Range(int64_t(1), int64_t(2000000000)));
    bk->add_option("--dim", kbo.dim, "Run the dense exact cases at this dimension instead of the table's")
        ->check(CLI::Range(32, 1024));
    bk->add_option("--cooldown", kbo.cooldown,
                   "Idle seconds before each timing: the GPU's power cap limits average power, so without a "
                   "pause a row runs slower after heavy rows than alone (0: none)")
        ->check(CLI::Range(0.0, 60.0))
        ->capture_default_str();
    bk->add_flag("--diagnose", kbo.diagnose,
                 "Also time each exact case's copies without the tensor-core work (copy-only) and a plain "
                 "streaming read of the same bytes (read-same-bytes)");

    auto* bi = bench->add_subcommand("index", "Index build throughput, peak memory, size and load bandwidth");
    bi->add_option("--tokens", ibo.tokens, "Synthetic corpus size in tokens")->capture_default_str();
    bi->add_option("--dim", ibo.dim, "Dimension")->capture_default_str();
    bi->add_option("--centroids", ibo.centroids, "Centroids (0: PLAID's rule)")->capture_default_str();
    bi->add_option("--codecs", ibo.codecs, "Codec cases: pq16 res1 res2 res4")->capture_default_str();
    bi->add_option("--device", ib_device, "auto, cpu or gpu")->capture_default_str();
    bi->add_option("--dir", ibo.dir, "Keep the corpus and indexes here (default: a temporary directory)");
    bi->add_option("--json", ib_json, "Write the results JSON here");

    auto* bs = bench->add_subcommand("search",
                                     "Search speed in one process: batch queries/s, one-query p50/p99, concurrent "
                                     "callers, recall@k against exhaustive search, memory, open time, time per stage");
    bs->add_option("--index", sbo.index, "Index directory")->required();
    bs->add_option("--queries", sbo.queries, "Query embeddings .npy [n_queries, tokens, dim]")->required();
    bs->add_option("--device", sb_device, "Where to score: auto, cpu or gpu")->capture_default_str();
    bs->add_option("--devices", sb_devices, "Where the shards go: cpu, all, or GPUs like 0 or 0,1");
    bs->add_option("--vectors", sb_vectors, kVectorsHelp)->capture_default_str();
    bs->add_option("--stream-mib", sb_stream_mib, kStreamHelp)->capture_default_str()->check(CLI::Range(1, 1 << 20));
    bs->add_option("--k", sbo.search.k, "Results per query")->capture_default_str()->check(CLI::Range(1, 100000));
    bs->add_option("--nprobe", sbo.search.nprobe, "Centroids probed per query token")->capture_default_str();
    bs->add_option("--ncandidates", sbo.search.ncandidates, "Candidates kept after pruning")->capture_default_str();
    bs->add_option("--rerank", sbo.search.rerank, "Candidates rescored exactly")->capture_default_str();
    bs->add_option("--target-recall", sbo.search.target_recall,
                   "nprobe, ncandidates and rerank, where not given, from the index's recall estimate (0: off)")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    bs->add_flag("!--no-adaptive", sbo.search.adaptive,
                 "Every query at the setting --target-recall plans, none searched again deeper where its codes "
                 "did not settle it (tms search --no-adaptive)");
    bs->add_option("--pruning", sb_pruning, "probe or interaction")
        ->capture_default_str()
        ->check(CLI::IsMember({"interaction", "probe"}));
    bs->add_option("--filter", sbo.search.filter,
                   "Only documents whose metadata match this SQL WHERE expression (recall is within it)");
    bs->add_option("--batch", sbo.batch, "Queries per call in the batch rows")->capture_default_str();
    bs->add_option("--passes", sbo.passes, "Batch passes (the best is reported)")->capture_default_str();
    bs->add_option("--exhaustive-passes", sbo.exhaustive_passes,
                   "Exhaustive searches for the truth, timed (the best is reported: the first one is cold)")
        ->capture_default_str()
        ->check(CLI::Range(1, 100));
    bs->add_option("--single", sbo.single, "One-query calls for p50 / p99 (0: none)")->capture_default_str();
    bs->add_option("--concurrency", sbo.concurrency, "Concurrent callers, one query per call")
        ->delimiter(',')
        ->capture_default_str();
    bs->add_option("--sweep-nprobe", sbo.nprobe_list, "More rows: these nprobe values")->delimiter(',');
    bs->add_option("--sweep-ncandidates", sbo.ncandidates_list, "More rows: these ncandidates")->delimiter(',');
    bs->add_option("--sweep-rerank", sbo.rerank_list, "More rows: these rerank depths")->delimiter(',');
    bs->add_option("--sweep-pruning", sb_prunings, "More rows: these prunings")
        ->delimiter(',')
        ->check(CLI::IsMember({"interaction", "probe"}));
    bs->add_flag("!--no-gather", sbo.searcher.gather, "Every concurrent call searches alone (no shared batches)");
    bs->add_flag("!--separate-shards", sbo.searcher.join_shards,
                 "Each shard a segment of its own, their candidates cut together on the host (what several "
                 "devices or ranks do), instead of a device's shards searched as one");
    bs->add_option("--gather-us", sbo.searcher.gather_us,
                   "A gathered batch also waits up to this many us for more callers")
        ->capture_default_str()
        ->check(CLI::Range(0, 1000000));
    bs->add_flag("--no-recall", sb_no_recall, "Skip the exhaustive search (and recall)");
    bs->add_option("--truth", sbo.truth,
                   "TREC run taken as the truth for recall (qids 0, 1, ... in query order) instead of an "
                   "exhaustive search: an index without vectors, or another system's run")
        ->check(CLI::ExistingFile);
    bs->add_option("--truth-out", sbo.truth_out, "Write the exhaustive search's run here (the --truth format)");
    bs->add_option("--json", sb_json, "Write the results JSON here");
    bs->add_option("--peer", sbo.peer,
                   "Also measure this system on the same embeddings, against the same truth (its row follows)")
        ->check(CLI::IsMember({"fast-plaid"}));
    bs->add_option("--peer-corpus", sbo.peer_corpus,
                   "The corpus's embeddings for the peer (docs.npy, doclens.npy, doc_ids.txt, queries.npy; default: "
                   "the directory of --queries)");
    bs->add_option("--peer-script", sbo.peer_script, "The peer's runner")->capture_default_str();
    bs->add_option("--peer-nbits", sbo.peer_nbits, "The peer's residual bits")
        ->capture_default_str()
        ->check(CLI::IsMember({1, 2, 4}));
    auto run_kernels = [s, &ctx]() -> int {
        auto& bench_json = s->bench_json;
        auto& bench_filter = s->bench_filter;
        auto& kbo = s->kbo;
        auto& bk_no_baseline = s->bk_no_baseline;
        auto& bk_no_tma = s->bk_no_tma;
        const std::string& command_line = ctx.command_line;
        std::string json, code_rows;
        kbo.cases = bench_filter;
        kbo.command = command_line;
        kbo.baseline = !bk_no_baseline;
        kbo.tma = !bk_no_tma;
        tms::Status st = tms::bench::RunKernelBench(kbo, &json);
        if (!st.ok()) return fail("bench kernels", st);
        st = tms::bench::RunCodeKernelBench(bench_filter, &code_rows, kbo.cooldown);
        if (!st.ok()) return fail("bench kernels", st);
        if (!code_rows.empty()) {  // splice the compressed rows into "cases": [...]
            const auto pos = json.rfind(']');
            if (pos != std::string::npos)
                json.insert(pos, (json[json.find_last_not_of(" \n\t", pos - 1)] == '[' ? "" : ",") + code_rows);
        }
        std::cout << json << std::endl;
        if (!bench_json.empty()) {
            std::ofstream f(bench_json);
            f << json << '\n';
            if (!f) return fail("bench kernels", tms::Status::IOError(bench_json + ": write failed"));
        }
        return 0;
    };
    auto run_index = [s, &ctx]() -> int {
        auto& ibo = s->ibo;
        auto& ib_json = s->ib_json;
        auto& ib_device = s->ib_device;
        const std::string& command_line = ctx.command_line;
        tms::Status st = parse_device(ib_device, &ibo.device);
        ibo.command = command_line;
        std::string json;
        if (st.ok()) st = tms::bench::RunIndexBench(ibo, &json);
        if (!st.ok()) return fail("bench index", st);
        std::cout << json << std::endl;
        if (!ib_json.empty()) {
            std::ofstream f(ib_json);
            f << json << '\n';
            if (!f) return fail("bench index", tms::Status::IOError(ib_json + ": write failed"));
        }
        return 0;
    };
    auto run_search = [s, &ctx]() -> int {
        auto& sbo = s->sbo;
        auto& sb_json = s->sb_json;
        auto& sb_device = s->sb_device;
        auto& sb_devices = s->sb_devices;
        auto& sb_vectors = s->sb_vectors;
        auto& sb_pruning = s->sb_pruning;
        auto& sb_prunings = s->sb_prunings;
        auto& sb_no_recall = s->sb_no_recall;
        auto& sb_stream_mib = s->sb_stream_mib;
        const std::string& command_line = ctx.command_line;
        sbo.command = command_line;
        sbo.recall = !sb_no_recall;
        sbo.search.pruning = parse_pruning(sb_pruning);
        for (const auto& p : sb_prunings) {
            sbo.pruning_list.push_back(parse_pruning(p));
        }
        sbo.searcher.progress = false;
        tms::Status st = parse_placement(sb_device, sb_devices, sb_vectors, &sbo.searcher);
        sbo.searcher.stream_bytes = sb_stream_mib << 20;
        for (const std::string& out : {sb_json, sbo.truth_out}) {
            if (st.ok() && !out.empty()) {
                st = tms::CheckOutputPath(out, tms::OutputKind::kFile,
                                          {{"--queries", sbo.queries}, {"--truth", sbo.truth}, {"--index", sbo.index}});
            }
        }
        std::string json;
        if (st.ok()) st = tms::bench::RunSearchBench(sbo, &json);
        if (st.ok() && !sb_json.empty()) {
            std::ofstream f(sb_json);
            f << json;
            if (!f) st = tms::Status::IOError(sb_json + ": write failed");
        }
        if (!st.ok()) return fail("bench search", st);
        if (sb_json.empty()) std::fputs(json.c_str(), stdout);
        return 0;
    };
    // bench serve
    struct ServeState {
        tms::bench::ServeBenchOptions o;
        std::string json, device = "auto", vectors = "auto";
    };
    auto sv = std::make_shared<ServeState>();
    auto* bv = bench->add_subcommand("serve",
                                     "tms serve's queries/s and p50/p99 on loopback for N concurrent clients (one "
                                     "query a request), beside the engine's in-process N callers");
    bv->add_option("--index", sv->o.index, "Index directory")->required();
    bv->add_option("--queries", sv->o.queries, "Query embeddings .npy [n_queries, tokens, dim]")->required();
    bv->add_option("--device", sv->device, "Where to score: auto, cpu or gpu")->capture_default_str();
    bv->add_option("--vectors", sv->vectors, kVectorsHelp)->capture_default_str();
    bv->add_option("--k", sv->o.k, "Results per query")->capture_default_str()->check(CLI::Range(1, 10000));
    bv->add_option("--clients", sv->o.clients, "Concurrent clients (rows)")
        ->delimiter(',')
        ->capture_default_str()
        ->check(CLI::Range(1, 4096));
    bv->add_option("--seconds", sv->o.seconds, "Seconds each row runs")
        ->capture_default_str()
        ->check(CLI::Range(0.1, 3600.0));
    bv->add_option("--writer-rate", sv->o.writer_rate,
                   "Rows again while a writer adds this many documents a second through the server (they are "
                   "deleted at the end; 0: none)")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 10000.0));
    bv->add_option("--workers", sv->o.workers, "The server's search workers (0: the most clients, at least 64)")
        ->capture_default_str();
    bv->add_option("--json", sv->json, "Write the results JSON here");
    auto run_serve = [sv, &ctx]() -> int {
        sv->o.command = ctx.command_line;
        tms::Status st = parse_placement(sv->device, "", sv->vectors, &sv->o.searcher);
        if (st.ok() && !sv->json.empty()) {
            st = tms::CheckOutputPath(sv->json, tms::OutputKind::kFile,
                                      {{"--queries", sv->o.queries}, {"--index", sv->o.index}});
        }
        std::string json;
        if (st.ok()) st = tms::bench::RunServeBench(sv->o, &json);
        if (st.ok() && !sv->json.empty()) {
            std::ofstream f(sv->json);
            f << json;
            if (!f) st = tms::Status::IOError(sv->json + ": write failed");
        }
        if (!st.ok()) return fail("bench serve", st);
        if (sv->json.empty()) std::fputs(json.c_str(), stdout);
        return 0;
    };
    return {{bk, run_kernels}, {bi, run_index}, {bs, run_search}, {bv, run_serve}};
}

}  // namespace tms::cli

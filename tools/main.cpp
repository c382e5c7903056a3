// Copyright TileMaxSim authors. The `tms` command line: parse arguments, call the public API.
#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <system_error>
#include <omp.h>
#include <unistd.h>
#include <unordered_map>

#include "base/log.h"
#include "base/memory.h"
#include "base/progress.h"
#include "tilemaxsim/tilemaxsim.h"
#if TMS_WITH_MPI
#include "tilemaxsim/mpi_searcher.h"
#endif
#include "tools/bench/bench_index.h"
#include "tools/bench/bench_kernels.h"
#include "tools/bench/bench_search.h"

namespace {

using Clock = std::chrono::steady_clock;

// Set when a run ends for want of memory (or threads), so that it exits without destructors.
std::atomic<bool> g_shortage{false};

// One line, whatever the message quotes (a path with a newline in it): control characters escaped.
std::string one_line(const std::string& s) {
    std::string out;
    for (const char c : s) {
        if (static_cast<unsigned char>(c) >= 0x20 && c != 0x7f) {
            out += c;
        } else {
            char buf[8];
            std::snprintf(buf, sizeof(buf), c == '\n' ? "\\n" : c == '\t' ? "\\t" : "\\x%02x", static_cast<unsigned char>(c));
            out += buf;
        }
    }
    return out;
}

// The exit status of a failure: 3 for an internal error, 1 otherwise.
int exit_code(const tms::Status& st) { return st.code() == tms::Status::Code::kInternal ? 3 : 1; }

// Levenshtein distance (mistyped names are short).
size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            const size_t up = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
            diag = up;
        }
    }
    return row[b.size()];
}

// " (did you mean --nprobe?)" for an argument the command line left unparsed that is near a name
// the command takes (its options; the subcommands where none was given), else "".
std::string did_you_mean(const CLI::App* app) {
    const CLI::App* cmd = app;
    for (bool deeper = true; deeper;) {  // the last subcommand given
        deeper = false;
        for (const CLI::App* sub : cmd->get_subcommands()) cmd = sub, deeper = true;
    }
    std::vector<std::string> names;
    for (const CLI::App* sub : cmd->get_subcommands([](const CLI::App*) { return true; })) names.push_back(sub->get_name());
    for (const CLI::Option* o : cmd->get_options())
        for (const std::string& l : o->get_lnames()) names.push_back("--" + l);
    for (const std::string& arg : app->remaining(true)) {
        const std::string given = arg.substr(0, arg.find('='));
        const std::string* best = nullptr;
        size_t best_d = std::max<size_t>(2, given.size() / 3) + 1;
        for (const std::string& n : names) {
            const size_t d = edit_distance(given, n);
            if (d < best_d) best = &n, best_d = d;
        }
        if (best) return " (did you mean " + *best + "?)";
    }
    return "";
}

int fail(const std::string& cmd, const tms::Status& st) {
    std::fprintf(stderr, "tms %s: error: %s\n", cmd.c_str(), one_line(st.message()).c_str());
    if (st.code() == tms::Status::Code::kResourceExhausted) g_shortage = true;
    return exit_code(st);
}

tms::Status parse_device(const std::string& s, tms::Device* d) {
    if (s == "auto") *d = tms::Device::kAuto;
    else if (s == "cpu") *d = tms::Device::kCpu;
    else if (s == "gpu") *d = tms::Device::kGpu;
    else return tms::Status::InvalidArgument("--device must be auto, cpu or gpu, got '" + s + "'");
    return tms::Status::OK();
}

// --pruning's value (checked against {interaction, probe} by CLI11).
tms::Pruning parse_pruning(const std::string& s) {
    return s == "probe" ? tms::Pruning::kProbe : tms::Pruning::kInteraction;
}

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
};

// The queries of a search (--queries, --query-ids) as one batch over arr's bytes.
tms::Status load_queries(const SearchArgs& a, tms::HostArray* arr, tms::QueryBatch* all, std::vector<std::string>* ids) {
    TMS_RETURN_IF_ERROR(tms::LoadNpy(a.queries, arr));
    tms::EmbeddingView view;
    TMS_RETURN_IF_ERROR(tms::EmbeddingsFromArray(*arr, 3, a.queries, &view));
    const int nq = static_cast<int>(arr->shape[0]), qt = static_cast<int>(arr->shape[1]);
    if (qt <= 0) return tms::Status::InvalidArgument(a.queries + ": queries have 0 tokens");
    all->data = view.data;
    all->dtype = view.dtype;
    all->n_queries = nq;
    all->q_tokens = qt;
    all->dim = view.dim;
    std::vector<std::string>& qids = *ids;
    if (!a.query_ids.empty()) {
        TMS_RETURN_IF_ERROR(tms::ReadLines(a.query_ids, &qids));
        if (static_cast<int>(qids.size()) != nq) {
            return tms::Status::InvalidArgument(a.query_ids + ": " + std::to_string(qids.size()) + " ids for " +
                                                std::to_string(nq) + " queries in " + a.queries);
        }
        for (size_t i = 0; i < qids.size(); ++i) {
            const bool bad = std::any_of(qids[i].begin(), qids[i].end(), [](char c) {
                return static_cast<unsigned char>(c) <= 0x20 || c == 0x7f;
            });
            if (bad) {
                return tms::Status::InvalidArgument(a.query_ids + ":" + std::to_string(i + 1) +
                                                    ": id contains whitespace or a control character");
            }
        }
    } else {
        for (int i = 0; i < nq; ++i) qids.push_back(std::to_string(i));
    }
    return tms::Status::OK();
}

// A recall estimate's sample of real queries (--sample FILE): `eo` measures them, not pseudo-queries.
struct EstimateSample {
    tms::HostArray arr;
    tms::QueryBatch batch;
};
tms::Status load_estimate_sample(const std::string& path, EstimateSample* s, tms::EstimateOptions* eo) {
    if (path.empty()) return tms::Status::OK();
    SearchArgs a;
    a.queries = path;
    std::vector<std::string> unused_ids;
    TMS_RETURN_IF_ERROR(load_queries(a, &s->arr, &s->batch, &unused_ids));
    eo->sample = &s->batch;
    return tms::Status::OK();
}

// The search options and searcher options of the command line.
tms::Status search_options(const SearchArgs& a, bool quiet, tms::SearchOptions* opts, tms::SearcherOptions* so) {
    *opts = a.opts;
    opts->pruning = parse_pruning(a.pruning);
    TMS_RETURN_IF_ERROR(parse_device(a.device, &so->device));
    if (!a.devices.empty()) TMS_RETURN_IF_ERROR(tms::ParseDeviceList(a.devices, so).WithContext("--devices"));
    so->load_vectors = true;
    TMS_RETURN_IF_ERROR(tms::ParseVectorTier(a.vectors, &so->vectors).WithContext("--vectors"));
    so->stream_bytes = a.stream_mib << 20;
    so->filter_time_ms = a.filter_time_ms;
    so->filter_max_bytes = a.filter_max_bytes;
    so->progress = !quiet && !a.no_progress;
    return tms::Status::OK();
}

tms::Status check_query_dim(const SearchArgs& a, const tms::QueryBatch& all, const tms::IndexInfo& info) {
    if (all.dim == info.dim) return tms::Status::OK();
    return tms::Status::InvalidArgument(a.queries + ": query dimension " + std::to_string(all.dim) +
                                        " differs from the index's " + std::to_string(info.dim));
}

// What search and rerank start from: the queries (over arr's bytes), their ids, the options,
// and the opened index.
struct QueryJob {
    tms::HostArray arr;
    tms::QueryBatch whole;
    std::vector<std::string> qids;
    tms::SearchOptions opts;
    std::unique_ptr<tms::Searcher> searcher;
};

tms::Status open_query_job(const SearchArgs& a, bool quiet, QueryJob* j) {
    TMS_RETURN_IF_ERROR(load_queries(a, &j->arr, &j->whole, &j->qids));
    tms::SearcherOptions so;
    TMS_RETURN_IF_ERROR(search_options(a, quiet, &j->opts, &so));
    TMS_RETURN_IF_ERROR(tms::Searcher::Open(so, a.index, &j->searcher));
    return check_query_dim(a, j->whole, j->searcher->info());
}

// The documents --subset allows, as internal ids: a file of external ids (one per line: one row,
// for every query) or of QUERY_ID<TAB>DOC_ID lines (a row per query; a query with no line allows
// nothing). Ids the index does not hold allow nothing; a note on stderr counts them.
tms::Status read_subset(const std::string& path, const tms::Searcher& s, const std::vector<std::string>& qids,
                        bool quiet, std::vector<std::vector<int64_t>>* rows) {
    std::vector<std::string> lines;
    TMS_RETURN_IF_ERROR(tms::ReadLines(path, &lines));
    std::vector<std::string> ids;
    std::vector<size_t> row;  // per query: the query of each id
    std::unordered_map<std::string, size_t> qindex;
    for (size_t i = 0; i < qids.size(); ++i) qindex.emplace(qids[i], i);
    int64_t unknown_queries = 0, n_lines = 0;
    bool tabbed = false;
    for (size_t i = 0; i < lines.size(); ++i) {
        std::string l = lines[i];
        if (!l.empty() && l.back() == '\r') l.pop_back();
        if (l.empty()) continue;
        const size_t tab = l.find('\t');
        if (n_lines++ == 0) tabbed = tab != std::string::npos;
        if (tabbed != (tab != std::string::npos) || (tabbed && l.find('\t', tab + 1) != std::string::npos)) {
            return tms::Status::InvalidArgument(path + ":" + std::to_string(i + 1) + ": want " +
                                                (tabbed ? "QUERY_ID<TAB>DOC_ID" : "one DOC_ID") +
                                                " per line, as the first line has");
        }
        if (!tabbed) {
            ids.push_back(std::move(l));
            continue;
        }
        const auto q = qindex.find(l.substr(0, tab));
        if (q == qindex.end()) {
            ++unknown_queries;
            continue;
        }
        row.push_back(q->second);
        ids.push_back(l.substr(tab + 1));
    }
    std::vector<int64_t> internal;
    s.FindDocs(ids, &internal);
    int64_t unknown = 0;
    rows->assign(tabbed ? qids.size() : 1, {});
    for (size_t i = 0; i < internal.size(); ++i) {
        if (internal[i] < 0) ++unknown;
        else (*rows)[tabbed ? row[i] : 0].push_back(internal[i]);
    }
    if (!quiet && unknown > 0) {
        tms::LogWarning("tms search: %s: %lld of %zu documents are not in the index (or deleted): ignored\n",
                        path.c_str(), (long long)unknown, ids.size());
    }
    if (!quiet && unknown_queries > 0) {
        tms::LogWarning("tms search: %s: %lld lines name queries not among the queries: ignored\n", path.c_str(),
                        (long long)unknown_queries);
    }
    return tms::Status::OK();
}

// --out of a search or rerank: never one of its inputs, never inside an index ("-": stdout).
tms::Status check_run_output(const SearchArgs& a, const std::string& first_stage = "") {
    return tms::CheckOutputPath(a.out, tms::OutputKind::kFile,
                                {{"--queries", a.queries}, {"--query-ids", a.query_ids}, {"--subset", a.subset},
                                 {"--run", first_stage}, {"--index", a.index}})
        .WithContext("--out");
}

// Loads queries, searches in batches, writes the run. Prints a summary to stderr.
tms::Status run_search(const SearchArgs& a, bool quiet, double* qps) {
    if (a.opts.k <= 0) return tms::Status::InvalidArgument("--k must be > 0, got " + std::to_string(a.opts.k));
    TMS_RETURN_IF_ERROR(check_run_output(a));
    QueryJob job;
    TMS_RETURN_IF_ERROR(open_query_job(a, quiet, &job));
    const tms::QueryBatch& whole = job.whole;
    const std::vector<std::string>& qids = job.qids;
    tms::SearchOptions& opts = job.opts;
    const tms::Searcher* searcher = job.searcher.get();
    const int nq = whole.n_queries;
    const int64_t n_docs = searcher->info().n_docs;
    // --subset's rows: one for every query (1 row), or one per query (each batch's slice of them).
    std::vector<std::vector<int64_t>> subset;
    if (!a.subset.empty()) TMS_RETURN_IF_ERROR(read_subset(a.subset, *searcher, qids, quiet, &subset));
    const auto allow = [&](int q0, int n) {
        auto set = std::make_shared<tms::DocSet>(n_docs, n);
        for (int i = 0; i < n; ++i)
            for (int64_t d : subset[size_t(q0 + i)]) set->Add(i, d);
        opts.allow = std::move(set);
    };
    if (subset.size() == 1) allow(0, 1);
    std::vector<std::vector<std::pair<std::string, float>>> all(nq);
    tms::SearchTimings phase;
    tms::Progress prog("searching", nq, !quiet && !a.no_progress, " q");
    const auto t0 = Clock::now();
    for (int q0 = 0; q0 < nq; q0 += a.batch) {
        const tms::QueryBatch b = whole.Slice(q0, std::min(a.batch, nq - q0));
        std::vector<std::vector<tms::SearchHit>> res;
        tms::SearchTimings t;
        if (subset.size() > 1) allow(q0, b.n_queries);
        TMS_RETURN_IF_ERROR(searcher->Search(b, opts, &res, &t));
        phase.candidates += t.candidates;
        phase.scoring += t.scoring;
        phase.rerank += t.rerank;
        for (int i = 0; i < b.n_queries; ++i) {
            for (auto& h : res[i]) all[q0 + i].emplace_back(std::move(h.doc_id), h.score);
        }
        prog.Add(b.n_queries);
    }
    prog.Done();
    const double secs = tms::SecondsSince(t0);
    *qps = secs > 0 ? nq / secs : 0;
    TMS_RETURN_IF_ERROR(tms::WriteRun(a.out, qids, all, a.tag));
    if (!quiet) {
        tms::LogInfo("tms search: %d queries in %.3f s (%.1f queries/s, %s%s) -> %s\n", nq, secs, *qps,
                     tms::DeviceName(searcher->device()), a.opts.exhaustive ? ", exhaustive" : "", a.out.c_str());
        tms::LogInfo("tms search: candidates %.3f s, scoring %.3f s, rerank %.3f s\n", phase.candidates,
                     phase.scoring, phase.rerank);
        if (!a.opts.exhaustive) {
            const tms::SearchOptions t = searcher->Plan(a.opts);
            if (t.exhaustive) {
                const tms::IndexInfo& info = searcher->info();
                tms::LogInfo("tms search: exhaustive: cheaper than the approximate search on %lld "
                             "live documents (at most %lld on the %s; --target-recall 0 searches approximately)\n",
                             (long long)(info.n_docs - info.n_deleted),
                             (long long)tms::SmallIndexDocs(searcher->device(), t),
                             tms::DeviceName(searcher->device()));
            } else if (a.opts.target_recall > 0) {
                const bool moved =
                    t.nprobe != a.opts.nprobe || t.ncandidates != a.opts.ncandidates || t.rerank != a.opts.rerank;
                tms::LogInfo("tms search: target recall %.2f: nprobe %d, ncandidates %d, rerank %d%s\n",
                             a.opts.target_recall, t.nprobe, t.ncandidates, t.rerank,
                             moved ? " (the index's estimate)" : "");
            }
        }
        int64_t vbytes = 0;
        for (const tms::ShardPlacement& p : searcher->placement()) vbytes += p.vector_bytes;
        const tms::VectorTier tier =
            searcher->placement().empty() ? tms::VectorTier::kNone : searcher->placement()[0].vectors;
        tms::LogInfo("tms search: vectors %s (%.2f GB)\n", tms::VectorTierName(tier), double(vbytes) / 1e9);
        if (searcher->placement().size() > 1) {
            std::string where;
            for (const tms::ShardPlacement& p : searcher->placement()) {
                where += (where.empty() ? "" : ", ") + std::to_string(p.shard) + ":" +
                         (p.device == tms::Device::kGpu ? "gpu " + std::to_string(p.gpu) : std::string("cpu"));
            }
            tms::LogInfo("tms search: %zu shards (%s)\n", searcher->placement().size(), where.c_str());
        }
    }
    return tms::Status::OK();
}

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
                if (d < 0) ++unknown;
                else cand[size_t(i)].push_back(d);
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
    tms::LogInfo("tms rerank: %zu of %d queries in the run, %lld candidates in %.3f s (%s) -> %s\n", matched,
                 nq, (long long)n_cand, secs, tms::DeviceName(searcher->device()), a.out.c_str());
    if (unknown > 0) {
        tms::LogWarning("tms rerank: %lld candidates are not in the index (or deleted): dropped\n",
                        (long long)unknown);
    }
    if (matched < run.size()) {
        tms::LogWarning("tms rerank: %zu queries of the run are not among the queries: ignored\n",
                        run.size() - matched);
    }
    return tms::Status::OK();
}

#if TMS_WITH_MPI
// Launched by mpirun (Open MPI, or a PMI / PMIx launcher): `tms search` runs on every rank.
bool under_mpirun() {
    for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
        if (std::getenv(v)) return true;
    return false;
}

// The distributed search (tilemaxsim/mpi_searcher.h): rank r opens its run of shards; rank 0
// reads the queries, writes the run and prints the summary (and any rank's failure). The other
// ranks print nothing: *quiet_failure tells the caller so.
tms::Status run_search_mpi(const SearchArgs& a, bool* quiet_failure) {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    *quiet_failure = rank != 0;
    if (!a.subset.empty()) return tms::Status::NotSupported("--subset is not supported under mpirun (use --filter)");
    TMS_RETURN_IF_ERROR(check_run_output(a));
    tms::HostArray arr;
    tms::QueryBatch whole;
    std::vector<std::string> qids;
    tms::SearchOptions opts;
    tms::SearcherOptions so;
    tms::Status st = search_options(a, /*quiet=*/rank != 0, &opts, &so);
    // Every rank must open (a collective) even when rank 0's queries are bad: its error is
    // reported after, through the search's setup.
    tms::Status qst = rank == 0 ? load_queries(a, &arr, &whole, &qids) : tms::Status::OK();
    std::unique_ptr<tms::MpiSearcher> ms;
    TMS_RETURN_IF_ERROR(st);
    TMS_RETURN_IF_ERROR(tms::MpiSearcher::Open(MPI_COMM_WORLD, so, a.index, &ms, a.mpi_timeout));
    if (rank == 0 && qst.ok()) qst = check_query_dim(a, whole, ms->local()->info());
    if (!qst.ok()) whole = tms::QueryBatch{};  // q_tokens 0: every rank stops at the setup
    const int nq = whole.n_queries;
    std::vector<std::vector<std::pair<std::string, float>>> all(size_t(rank == 0 ? nq : 0));
    tms::Progress prog("searching", nq, rank == 0 && !a.no_progress, " q");
    const auto t0 = Clock::now();
    st = ms->SearchBatches(whole, a.batch, opts, [&](int64_t q0, std::vector<std::vector<tms::SearchHit>>& hits) {
        for (size_t i = 0; i < hits.size(); ++i) {
            for (auto& h : hits[i]) all[size_t(q0) + i].emplace_back(std::move(h.doc_id), h.score);
        }
        prog.Add(int64_t(hits.size()));
        return tms::Status::OK();
    });
    if (!qst.ok()) return qst;
    TMS_RETURN_IF_ERROR(st);
    prog.Done();
    if (rank != 0) return tms::Status::OK();
    const double secs = tms::SecondsSince(t0);
    TMS_RETURN_IF_ERROR(tms::WriteRun(a.out, qids, all, a.tag));
    const tms::MpiSearchStats& m = ms->stats();
    const double per = m.batches ? 1e6 / double(m.batches) : 0;
    tms::LogInfo("tms search: %d queries in %.3f s (%.1f queries/s, %d ranks, %d shards%s) -> %s\n", nq, secs,
                 secs > 0 ? nq / secs : 0.0, size, ms->n_shards(), a.opts.exhaustive ? ", exhaustive" : "",
                 a.out.c_str());
    tms::LogInfo("tms search: rank 0 per batch: broadcast %.0f us, own search %.0f us (cuts %.0f us), gather "
                 "%.0f us, merge %.0f us (%lld batches)\n",
                 m.broadcast_s * per, m.search_s * per, m.cut_s * per, m.gather_s * per, m.merge_s * per,
                 (long long)m.batches);
    return tms::Status::OK();
}
#endif

constexpr const char* kStreamHelp =
    "With --vectors host or disk: MiB of vectors an exhaustive search reads and scores per step (the next step "
    "is read and copied while one is scored; two steps' buffers on the host and on the GPU)";

constexpr const char* kVectorsHelp =
    "Where the stored fp16 vectors (exact rerank, --exhaustive) live: gpu (with the codes), host (host memory; "
    "each search copies its candidates' rows to the GPU), disk (read from the index as searches need them), none, "
    "or auto (the fastest that fits)";

void add_search_options(CLI::App* c, SearchArgs* a) {
    c->add_option("--k", a->opts.k, "Results per query (more than the index's documents: all of them)")
        ->capture_default_str()
        ->check(CLI::Range(1, 100000000));
    c->add_flag("--exhaustive", a->opts.exhaustive,
                "Exact MaxSim over every document (needs an index built with --keep-vectors)");
    c->add_option("--device", a->device, "Where to score: auto, cpu or gpu")->capture_default_str();
    c->add_option("--devices", a->devices,
                  "Where the shards go: cpu, all (every GPU), or GPUs like 0 or 0,1 (shards placed by size; "
                  "default: every GPU present, else cpu); overrides --device");
    c->add_option("--vectors", a->vectors, kVectorsHelp)->capture_default_str();
    c->add_option("--stream-mib", a->stream_mib, kStreamHelp)->capture_default_str()->check(CLI::Range(1, 1 << 20));
    c->add_option("--target-recall", a->opts.target_recall,
                  "The speed/recall knob. With the index's recall estimate (tms index --keep-vectors): --nprobe, "
                  "--ncandidates and --rerank, where not given, from the cheapest measured setting whose "
                  "estimated recall@10 reaches this (below the default target also settings cheaper than the "
                  "defaults, e.g. 0.9); a small index is searched exhaustively, exact and cheaper (at most "
                  "--rerank live documents on a CPU, 2 x --ncandidates on a GPU). 0: the settings exactly as "
                  "given")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    c->add_option("--nprobe", a->opts.nprobe, "Centroids probed per query token")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 24));
    c->add_option("--ncandidates", a->opts.ncandidates, "Candidates kept after pruning (0: all the probes reach)")
        ->capture_default_str()
        ->check(CLI::Range(0, 1 << 30));
    c->add_option("--pruning", a->pruning,
                  "How candidates are pruned to --ncandidates: probe (scored by the probed centroids that hold "
                  "them) or interaction (PLAID's centroid interaction over every candidate token)")
        ->capture_default_str()
        ->check(CLI::IsMember({"interaction", "probe"}));
    c->add_option("--rerank", a->opts.rerank,
                  "Top compressed candidates rescored exactly when vectors are stored (0: none)")
        ->capture_default_str()
        ->check(CLI::Range(0, 1 << 30));
    c->add_option("--batch", a->batch, "Queries per search call")->capture_default_str()->check(CLI::Range(1, 1 << 20));
    c->add_option("--filter", a->opts.filter,
                  "Only documents whose metadata match this SQL WHERE expression, e.g. \"tenant = 7 AND year >= "
                  "2024\" (columns as `tms info` lists them; applied during candidate generation)");
    c->add_option("--filter-time-ms", a->filter_time_ms,
                  "A --filter's evaluation may take this many milliseconds; past it the search fails")
        ->capture_default_str()
        ->check(CLI::Range(int64_t(1), int64_t(86400000)));
    c->add_option("--filter-max-bytes", a->filter_max_bytes,
                  "No value a --filter computes may be longer than this many bytes (bounds its memory); "
                  "past it the search fails")
        ->capture_default_str()
        ->check(CLI::Range(int64_t(1), int64_t(INT32_MAX)));
    c->add_option("--subset", a->subset,
                  "Only these documents: a file of external ids, one per line (every query), or QUERY_ID<TAB>DOC_ID "
                  "lines (per query; a query with no line gets no results); with --filter, both must hold");
    c->add_option("--direct-max", a->opts.direct_max,
                  "With --filter or --subset: a query allowed at most this many documents scores all of them "
                  "instead of probing (-1: as many as the widest probing visits, at least 65,536)")
        ->capture_default_str()
        ->check(CLI::Range(int64_t(-1), int64_t(1) << 40));
#if TMS_WITH_MPI
    c->add_option("--mpi-timeout", a->mpi_timeout,
                  "Under mpirun: seconds any rank waits for the others before ending the job")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
#endif
    c->add_flag("--no-progress", a->no_progress, "No progress bars");
}

tms::Status print_info(const std::string& path) {
    tms::IndexInfo i;
    TMS_RETURN_IF_ERROR(tms::ReadIndexInfo(path, &i));
    std::printf("index\t%s\nformat_version\t%d\ndocuments\t%lld\ntokens\t%lld\ndim\t%d\ncentroids\t%d\ncodec\t%s\n",
                path.c_str(), i.format_version, (long long)i.n_docs, (long long)i.n_tokens, i.dim, i.n_centroids,
                i.codec.c_str());
    if (i.codec == "pq") std::printf("pq_m\t%d\npq_nbits\t%d\n", i.pq_m, i.pq_nbits);
    else std::printf("residual_nbits\t%d\n", i.residual_nbits);
    std::printf("decoded_tokens\t%s\n", i.unit_norm ? "unit (normalised, as PLAID)" : "as decoded");
    std::printf("live_documents\t%lld\ndeleted\t%lld\n", (long long)(i.n_docs - i.n_deleted), (long long)i.n_deleted);
    std::printf("code_bytes_per_token\t%.2f\nvectors\t%s\nvector_bytes_per_token\t%.2f\nchunks\t%lld\nbuild_config\t%s\n",
                i.code_bytes_per_token, i.has_vectors ? "yes" : "no", i.vector_bytes_per_token, (long long)i.n_chunks,
                i.build_config_json.c_str());
    // The build config keeps what was asked (0: the default rule); these are what it resolved to.
    if (i.has_vectors) {
        // Where a search with --vectors auto would keep them on this machine now.
        tms::VectorTier tier = tms::VectorTier::kNone;
        TMS_RETURN_IF_ERROR(tms::ResolveVectorTier(tms::SearcherOptions(), path, &tier));
        std::printf("vectors_bytes\t%lld\nvectors_auto\t%s\n", (long long)(i.n_tokens * i.dim * 2),
                    tms::VectorTierName(tier));
    }
    // The recall estimate (tms index --keep-vectors, tms estimate) and the settings it chose.
    tms::RecallEstimate e;
    const tms::Status est = tms::ReadRecallEstimate(path, &e);
    if (!est.ok() && est.code() != tms::Status::Code::kNotFound) return est;
    if (est.ok() && !e.points.empty()) {
        const tms::RecallPoint* d = e.Default() ? e.Default() : &e.points[0];
        std::printf("estimated_recall@%d\t%.4f\n", e.k, d->recall);
        std::printf("estimate_queries\t%d %s\n", e.queries, e.sampled ? "sample" : "pseudo");
        for (const tms::RecallPoint& p : e.points) {
            std::printf("recall_curve\tnprobe %d\tncandidates %d\trerank %d\t%.4f\n", p.nprobe, p.ncandidates,
                        p.rerank, p.recall);
        }
        const double target = tms::SearchOptions().target_recall;
        const tms::RecallPoint* t = e.For(target);
        std::printf("target_recall\t%.2f\tnprobe %d\tncandidates %d\trerank %d\n", target, t->nprobe,
                    t->ncandidates, t->rerank);
        if (e.points.back().recall < 0.95) {
            std::printf("hint\tlow estimated recall: more codec bits (--nbits 4), PQ-32 (--pq-m 32) or more "
                        "centroids\n");
        }
    }
    std::printf("shards\t%zu\n", i.shards.size());
    for (size_t s = 0; s < i.shards.size(); ++s) {
        const tms::ShardInfo& h = i.shards[s];
        std::printf("shard\t%zu\t%s\tfirst_doc %lld\tdocuments %lld\ttokens %lld\tbytes %lld\n", s, h.dir.c_str(),
                    (long long)h.first_doc, (long long)h.n_docs, (long long)h.n_tokens, (long long)h.bytes);
    }
    std::printf("build_resolved\t{\"codec\": \"%s\", \"n_centroids\": %d, \"pq_m\": %d, \"pq_nbits\": %d, "
                "\"residual_nbits\": %d}\n",
                i.codec.c_str(), i.n_centroids, i.codec == "pq" ? i.pq_m : 0, i.codec == "pq" ? i.pq_nbits : 0,
                i.codec == "residual" ? i.residual_nbits : 0);
    // Document metadata, when the index has some: its rows, then one line per column.
    if (i.metadata_rows >= 0) {
        std::printf("metadata_rows\t%lld\n", (long long)i.metadata_rows);
        for (const tms::MetaColumn& c : i.metadata_columns) {
            std::printf("metadata_column\t%s\t%s\n", c.name.c_str(), tms::MetaTypeName(c.type));
        }
    }
    return tms::Status::OK();
}

// --metadata FILE.jsonl with --metadata-types SPEC as DocMetadata; null without --metadata.
tms::Status load_metadata(const std::string& file, const std::string& types, std::unique_ptr<tms::DocMetadata>* out) {
    out->reset();
    if (file.empty()) return tms::Status::OK();
    auto md = std::make_unique<tms::DocMetadata>();
    TMS_RETURN_IF_ERROR(tms::ParseMetaColumns(types, &md->declared));
    TMS_RETURN_IF_ERROR(tms::LoadMetadataJsonl(file, md.get()));
    *out = std::move(md);
    return tms::Status::OK();
}

// The help of --metadata and --metadata-types (tms index, tms add).
constexpr const char* kMetadataHelp =
    "Document attributes, JSONL: one object per document in order, or objects naming their documents by "
    "\"id\" (any order; documents without one get NULLs), e.g. {\"id\": \"d7\", \"tenant\": 3, \"lang\": \"en\"}; "
    "values: integers, reals, strings, booleans, null (arrays and objects kept as JSON text)";
constexpr const char* kMetadataTypesHelp =
    "Column types, e.g. \"year:integer,lang:text\" (integer, real or text); other columns: integer when "
    "every value is an integer, real when every value is a number, text otherwise";

tms::Status eval_files(const std::string& run_path, const std::string& qrels_path, bool json, bool quiet,
                       tms::EvalResult* r, const std::string& metrics = "", bool per_query = false) {
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

// The index's recall estimate and what it chose, as `tms index` and `tms estimate` print them.
void print_estimate(const char* who, const tms::RecallEstimate& e, double secs) {
    const tms::RecallPoint* t = e.For(tms::SearchOptions().target_recall);
    if (e.points.empty() || t == nullptr) return;
    tms::LogInfo("%s: estimated recall@%d of the default search %.4f (%d %s, %.1f s); for recall %.2f: "
                 "nprobe %d, ncandidates %d, rerank %d (estimated %.4f)\n",
                 who, e.k, (e.Default() ? e.Default() : &e.points[0])->recall, e.queries,
                 e.sampled ? "sample queries" : "pseudo-queries", secs, tms::SearchOptions().target_recall,
                 t->nprobe, t->ncandidates, t->rerank, t->recall);
    if (e.points.back().recall < 0.95) {
        tms::LogWarning("%s: hint: even the deepest setting measured reaches only %.4f; more codec bits "
                        "(--nbits 4), PQ-32 (--pq-m 32) or more centroids would rank candidates better\n",
                        who, e.points.back().recall);
    }
}

// Measures the index's recall (EstimateRecall) and prints it.
tms::Status estimate_index(const char* who, const std::string& path, const tms::EstimateOptions& eo) {
    tms::RecallEstimate e;
    const auto t0 = std::chrono::steady_clock::now();
    TMS_RETURN_IF_ERROR(tms::EstimateRecall(path, eo, &e));
    print_estimate(who, e, tms::SecondsSince(t0));
    return tms::Status::OK();
}

// Builds the index (as one rank of `group` when given: only rank 0 prints the summary), then,
// with `estimate`, measures its recall (rank 0).
tms::Status build_index(const std::string& docs, const std::string& doclens, const std::string& ids, const std::string& out,
                        const tms::IndexBuildOptions& o, tms::BuildGroup* group = nullptr,
                        const tms::DocMetadata* metadata = nullptr, const tms::EstimateOptions* estimate = nullptr) {
    std::unique_ptr<tms::IndexBuilder> b;
    TMS_RETURN_IF_ERROR(tms::IndexBuilder::Create(o, out, &b));
    b->SetGroup(group);
    tms::BuildStats st;
    TMS_RETURN_IF_ERROR(b->BuildFromFiles(docs, doclens, ids, &st, metadata));
    if (group && group->rank() != 0) return tms::Status::OK();
    if (group) tms::LogInfo("tms index: %d ranks\n", group->size());
    tms::LogInfo("tms index: %lld documents, %lld tokens, dim %d, %d centroids, codec %s, %.1f bytes/token -> %s\n",
                 (long long)st.n_docs, (long long)st.n_tokens, st.dim, st.n_centroids, o.codec.c_str(),
                 st.code_bytes_per_token, out.c_str());
    const bool verbose = tms::LogEnabled(tms::LogLevel::kDebug);
    std::string phases;  // at --log-level debug (tms -v): where the time went
    for (const auto& [name, s] : st.phase_seconds) phases += " " + name + " " + std::to_string(s).substr(0, 5) + "s";
    tms::LogInfo("tms index: %.2f s total (%.0f tokens/s)%s%s\n", st.seconds_total,
                 st.seconds_total > 0 ? st.n_tokens / st.seconds_total : 0.0, verbose ? ":" : "",
                 verbose ? phases.c_str() : "");
    if (estimate && o.keep_vectors) {
        // The index is complete and usable whatever happens here: a failed estimate is a warning.
        const tms::Status est = estimate_index("tms index", out, *estimate);
        if (!est.ok()) {
            tms::LogWarning("tms index: warning: no recall estimate (%s); `tms estimate` measures it later\n",
                            est.ToString().c_str());
        }
    }
    return tms::Status::OK();
}

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

namespace {
int run(int argc, char** argv);
}  // namespace

// Library calls return Status; anything thrown past them (out of memory in a container, a
// third-party library's exception) still ends in one line and a non-zero exit, never an abort.
// A run that ran short of memory or threads (ours, an exception, or a library's exit(1) such as
// libgomp's when it cannot start a thread), and any run under an address-space limit, ends
// without the libraries' destructors: they join threads that may be stuck on the shortage
// (OpenBLAS's workers retry forever to map their buffers) or that fail to allocate as they wake
// to exit (RocksDB's). Every other run, failed or not, exits normally, so that the libraries
// remove what they registered (LLVM's OpenMP runtime leaves a file in /dev/shm otherwise).
std::atomic<bool> g_exit_normally{false};

void exit_now_on_failure(int status, void*) {
    if (g_exit_normally && tms::AddressSpaceRoom() == INT64_MAX) return;
    std::fflush(nullptr);
    std::_Exit(status);
}

int main(int argc, char** argv) {
    ::on_exit(exit_now_on_failure, nullptr);
    try {
        const int rc = run(argc, argv);
        g_exit_normally = !g_shortage;
        return rc;
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "tms: error: out of host memory\n");
    } catch (const std::system_error& e) {
        if (e.code() == std::errc::resource_unavailable_try_again) {
            std::fprintf(stderr, "tms: error: cannot start a thread (%s): out of host memory or of the process's "
                                 "thread limit\n", e.code().message().c_str());
        } else {
            std::fprintf(stderr, "tms: error: internal: %s\n", e.what());
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "tms: error: internal: %s\n", e.what());
    }
    return 3;
}

namespace {
int run(int argc, char** argv) {
    // OMP_NUM_THREADS is clamped as --threads is, before the first parallel region (reading the
    // queries); the library's entry points clamp their callers' threads the same way.
    if (omp_get_max_threads() > tms::kMaxThreads) omp_set_num_threads(tms::kMaxThreads);
    CLI::App app{"tms: TileMaxSim, a late-interaction (ColBERT-style) search engine.\n"
                 "Run `tms demo` for an end-to-end example on a synthetic corpus."};
    app.require_subcommand(1);
    // Usage errors in one line, like every other failure.
    app.failure_message([](const CLI::App* a, const CLI::Error& e) {
        const std::string hint = did_you_mean(a);
        return "tms: error: " + std::string(e.what()) + (hint.empty() ? " (see --help)" : hint) + "\n";
    });
    app.set_version_flag("--version", std::string("tms ") + tms::VersionString());
    // What tms prints on stderr, given before or after the command (fallthrough).
    std::string log_level;
    bool quiet = false, verbose = false;
    app.add_option("--log-level", log_level,
                   "What tms prints on stderr: error, warning, info (default: summaries, progress bars) or debug "
                   "(also where a build's time went); the environment's TMS_LOG_LEVEL too")
        ->check(CLI::IsMember({"error", "warning", "warn", "info", "debug"}));
    app.add_flag("-q,--quiet", quiet, "Print only warnings and errors (--log-level warning)");
    app.add_flag("-v,--verbose", verbose, "Print everything (--log-level debug)");
    app.fallthrough();

    // synth
    tms::SynthOptions so;
    std::string synth_out;
    auto* synth = app.add_subcommand("synth", "Write a synthetic ColBERT-like corpus (docs, queries, qrels)");
    synth->add_option("--out", synth_out, "Output directory")->required();
    synth->add_option("--docs", so.n_docs, "Documents")->capture_default_str();
    synth->add_option("--queries", so.n_queries, "Queries")->capture_default_str();
    synth->add_option("--dim", so.dim, "Embedding dimension (32-1024)")->capture_default_str();
    synth->add_option("--seed", so.seed, "Random seed")->capture_default_str();
    synth->add_option("--min-doc-len", so.min_doc_len, "Shortest document (tokens)")->capture_default_str();
    synth->add_option("--max-doc-len", so.max_doc_len, "Longest document (tokens)")->capture_default_str();

    // index
    tms::IndexBuildOptions io;
    std::string docs, doclens, doc_ids, index_out, config;
    int n_centroids = -1, pq_m = -1, nbits = -1, shards = -1;
    std::string codec;
    auto* idx = app.add_subcommand("index", "Build an on-disk index from token embeddings");
    idx->add_option("--docs", docs,
                    "Token embeddings: .npy [n_tokens, dim] (float16/bfloat16/float32), a directory of shards "
                    "docs_*.npy + doclens_*.npy, or .safetensors (tensors 'embeddings', 'doclens')")->required();
    idx->add_option("--doclens", doclens, "Tokens per document .npy [n_docs], int32 or int64 (with a .npy --docs)");
    idx->add_option("--doc-ids", doc_ids, "Document ids, one per line (default: 0..n-1)");
    idx->add_option("--out", index_out, "Index directory to create")->required();
    idx->add_option("--config", config, "JSON preset (configs/*.json); flags override it");
    idx->add_option("--codec", codec, "Token codec: pq or residual (default pq)");
    idx->add_option("--centroids,--n-centroids", n_centroids, "k-means centroids (0 or unset: power of two near 16*sqrt(tokens))")
        ->check(CLI::Range(0, 1 << 24));
    idx->add_option("--pq-m", pq_m, "PQ sub-quantizers (0 or unset: dim/8, at most 32)")->check(CLI::Range(0, 1024));
    idx->add_option("--nbits,--residual-nbits", nbits,
                    "Residual codec bits per dimension: 1, 2 or 4 (default 2); implies --codec residual")
        ->check(CLI::IsMember({1, 2, 4}));
    idx->add_option("--shards", shards,
                    "Shards: document ranges with their own stores, loaded and searched in parallel (0 or "
                    "unset: one per 2^28 tokens, so that a corpus that needs several GPUs is spread over them)")
        ->check(CLI::Range(0, tms::kMaxShards));
    bool keep_vectors = false, overwrite = false, no_progress = false;
    idx->add_flag("--keep-vectors", keep_vectors, "Also store fp16 vectors (exhaustive search, exact rerank)");
    idx->add_flag("--overwrite", overwrite, "Replace an existing index (only once the new one is complete)");
    idx->add_flag("--no-progress", no_progress, "No progress bars");
    std::string index_meta, index_meta_types;
    auto* index_meta_opt = idx->add_option("--metadata", index_meta, kMetadataHelp);
    idx->add_option("--metadata-types", index_meta_types, kMetadataTypesHelp)->needs(index_meta_opt);
    [[maybe_unused]] double index_mpi_timeout = 86400;  // read under mpirun only
#if TMS_WITH_MPI
    idx->add_option("--mpi-timeout", index_mpi_timeout,
                    "Under mpirun: seconds any rank waits for the others (training, the slowest rank's shards) "
                    "before ending the job")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
#endif
    idx->add_option("--threads", io.threads, "Threads (0: all cores)")->check(CLI::Range(0, tms::kMaxThreads));
    std::string index_device = "auto";
    idx->add_option("--device", index_device, "Where centroid assignment runs: auto, cpu or gpu")->capture_default_str();
    bool no_estimate = false;
    tms::EstimateOptions index_eo;
    auto* no_estimate_flag = idx->add_flag("--no-estimate", no_estimate,
                  "Skip the recall estimate (with --keep-vectors the build ends by measuring its approximate search "
                  "against exhaustive search on pseudo-queries; searches take their defaults from it)");
    idx->add_option("--estimate-queries", index_eo.queries,
                    "Pseudo-queries of the recall estimate (0: 256 on a GPU, 64 on the CPU)")
        ->capture_default_str()
        ->check(CLI::Range(0, 100000));
    std::string index_sample;
    idx->add_option("--estimate-sample", index_sample,
                    "The recall estimate measures these queries of your own (.npy [n, tokens, dim], e.g. a sample of "
                    "real ones) instead of pseudo-queries")
        ->check(CLI::ExistingFile)
        ->excludes(no_estimate_flag);

    // estimate
    std::string est_path, est_device = "auto";
    tms::EstimateOptions est_o;
    auto* est = app.add_subcommand("estimate",
                                   "Measure an index's recall@10 against exhaustive search on pseudo-queries (token "
                                   "sets of its documents, perturbed), at the default and deeper settings; searches "
                                   "take their parameters for --target-recall from it");
    est->add_option("--index", est_path, "Index directory (built with --keep-vectors)")->required();
    est->add_option("--queries", est_o.queries, "Pseudo-queries (0: 256 on a GPU, 64 on the CPU)")
        ->capture_default_str()
        ->check(CLI::Range(0, 100000));
    est->add_option("--device", est_device, "Where the searches run: auto, cpu or gpu")->capture_default_str();
    est->add_option("--noise", est_o.noise,
                    "Norm of the Gaussian noise added to each pseudo-query token (unit vectors) before renormalising")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 10.0));
    est->add_option("--seed", est_o.seed, "Seed of the documents and tokens drawn")->capture_default_str();
    est->add_option("--content-tokens", est_o.content_tokens,
                    "Pseudo-queries of a span of N of a document's tokens, padded with copies of one vector that "
                    "the corpus matches weakly (as ColBERT's [MASK]s; 11 fits MiniLM-encoded queries); 0: tokens drawn "
                    "across the document, no padding")
        ->capture_default_str()
        ->check(CLI::Range(0, 1000));
    est->add_option("--pad-noise", est_o.pad_noise,
                    "Norm of the Gaussian noise that moves a random corpus token to make the padding vector")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 10.0));
    est->add_option("--mix", est_o.mix,
                    "Share of each pseudo-query's tokens drawn from other random documents (with --content-tokens 0)")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    std::string est_sample;
    est->add_option("--sample", est_sample,
                    "Measure these queries of your own (.npy [n, tokens, dim], e.g. a sample of real ones) instead "
                    "of pseudo-queries")
        ->check(CLI::ExistingFile);

    // search
    SearchArgs sa;
    auto* search = app.add_subcommand("search", "Batch search: queries .npy -> TREC run");
    search->add_option("--index", sa.index, "Index directory")->required();
    search->add_option("--queries", sa.queries, "Query embeddings .npy [n_queries, tokens, dim]")->required();
    search->add_option("--query-ids", sa.query_ids, "Query ids, one per line (default: 0..n-1)");
    search->add_option("--out", sa.out, "TREC run file to write")->required();
    search->add_option("--tag", sa.tag, "Run tag (last TREC column)")->capture_default_str();
    add_search_options(search, &sa);

    // rerank
    SearchArgs ra;
    ra.tag = "tms-rerank";
    ra.opts.k = 0;
    std::string rerank_run;
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

    // eval
    std::string run_path, qrels_path;
    bool eval_json = false;
    std::string eval_metrics;
    bool eval_per_query = false;
    auto* eval = app.add_subcommand("eval", "Evaluate a TREC run with trec_eval's measures (default: mrr@10, ndcg@10, "
                                            "recall@100, recall@1000)");
    eval->add_option("--run", run_path, "TREC run file (qid Q0 docid rank score tag)")->required();
    eval->add_option("--qrels", qrels_path, "Qrels: TREC (qid 0 docid rel) or BEIR TSV with header")->required();
    eval->add_option("--metrics", eval_metrics,
                     "Comma-separated measures, cutoffs free: map, map@K, P@K, ndcg, ndcg@K, recall@K, mrr, mrr@K, "
                     "success@K (e.g. map,P@5,ndcg@20,recall@50,mrr@10,success@5)");
    eval->add_flag("--per-query", eval_per_query, "Also every query's values (NAME<TAB>QID<TAB>VALUE lines first)");
    eval->add_flag("--json", eval_json, "Print JSON instead of lines");

    // info
    std::string info_path;
    auto* info = app.add_subcommand("info", "Print what an index holds");
    info->add_option("--index", info_path, "Index directory")->required();

    // add / delete / compact
    std::string upd_index, upd_docs, upd_doclens, upd_ids, upd_meta, upd_meta_types;
    bool upd_replace = false;
    auto* add = app.add_subcommand("add", "Add documents to an index (encoded with its centroids and codec)");
    add->add_option("--index", upd_index, "Index directory")->required();
    add->add_option("--docs", upd_docs, "Token embeddings .npy [n_tokens, dim]")->required();
    add->add_option("--doclens", upd_doclens, "Tokens per document .npy [n_docs]")->required();
    add->add_option("--doc-ids", upd_ids, "Ids of the new documents, one per line")->required();
    add->add_flag("--replace", upd_replace, "Replace documents whose id is already in the index");
    auto* upd_meta_opt = add->add_option("--metadata", upd_meta,
                                         std::string(kMetadataHelp) + "; new columns are added to the index's, and "
                                         "documents added without metadata get NULLs");
    add->add_option("--metadata-types", upd_meta_types, kMetadataTypesHelp)->needs(upd_meta_opt);
    auto* del = app.add_subcommand("delete", "Delete documents by id (tombstones; `tms compact` reclaims space)");
    del->add_option("--index", upd_index, "Index directory")->required();
    del->add_option("--doc-ids", upd_ids, "Ids to delete, one per line")->required();
    auto* compact = app.add_subcommand("compact", "Rewrite an index without its deleted documents");
    compact->add_option("--index", upd_index, "Index directory")->required();

    // bench
    auto* bench = app.add_subcommand("bench", "Benchmarks");
    bench->require_subcommand(1);
    std::string bench_json, bench_filter;
    auto* bk = bench->add_subcommand(
        "kernels",
        "GPU MaxSim kernels vs the read ceiling and a cuBLAS baseline: exact cases, then compressed ones "
        "(impl tilemaxsim-code; on Hopper also tilemaxsim-code-mma, the same call through mma.sync)");
    bk->add_option("--json", bench_json, "Write the results JSON here");
    bk->add_option("--cases", bench_filter, "Only cases whose name contains this");
    tms::bench::KernelBenchOptions kbo;
    bool bk_no_baseline = false, bk_no_tma = false;
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

    tms::bench::IndexBenchOptions ibo;
    std::string ib_json, ib_device = "auto";
    auto* bi = bench->add_subcommand("index", "Index build throughput, peak memory, size and load bandwidth");
    bi->add_option("--tokens", ibo.tokens, "Synthetic corpus size in tokens")->capture_default_str();
    bi->add_option("--dim", ibo.dim, "Dimension")->capture_default_str();
    bi->add_option("--centroids", ibo.centroids, "Centroids (0: PLAID's rule)")->capture_default_str();
    bi->add_option("--codecs", ibo.codecs, "Codec cases: pq16 res1 res2 res4")->capture_default_str();
    bi->add_option("--device", ib_device, "auto, cpu or gpu")->capture_default_str();
    bi->add_option("--dir", ibo.dir, "Keep the corpus and indexes here (default: a temporary directory)");
    bi->add_option("--json", ib_json, "Write the results JSON here");

    tms::bench::SearchBenchOptions sbo;
    std::string sb_json, sb_device = "auto", sb_devices, sb_vectors = "auto",
                sb_pruning = tms::PruningName(tms::SearchOptions().pruning);
    std::vector<std::string> sb_prunings;
    bool sb_no_recall = false;
    auto* bs = bench->add_subcommand("search",
                                     "Search speed in one process: batch queries/s, one-query p50/p99, concurrent "
                                     "callers, recall@k against exhaustive search, memory, open time, time per stage");
    bs->add_option("--index", sbo.index, "Index directory")->required();
    bs->add_option("--queries", sbo.queries, "Query embeddings .npy [n_queries, tokens, dim]")->required();
    bs->add_option("--device", sb_device, "Where to score: auto, cpu or gpu")->capture_default_str();
    bs->add_option("--devices", sb_devices, "Where the shards go: cpu, all, or GPUs like 0 or 0,1");
    bs->add_option("--vectors", sb_vectors, kVectorsHelp)->capture_default_str();
    int64_t sb_stream_mib = tms::SearcherOptions().stream_bytes >> 20;
    bs->add_option("--stream-mib", sb_stream_mib, kStreamHelp)->capture_default_str()->check(CLI::Range(1, 1 << 20));
    bs->add_option("--k", sbo.search.k, "Results per query")->capture_default_str()->check(CLI::Range(1, 100000));
    bs->add_option("--nprobe", sbo.search.nprobe, "Centroids probed per query token")->capture_default_str();
    bs->add_option("--ncandidates", sbo.search.ncandidates, "Candidates kept after pruning")->capture_default_str();
    bs->add_option("--rerank", sbo.search.rerank, "Candidates rescored exactly")->capture_default_str();
    bs->add_option("--target-recall", sbo.search.target_recall,
                   "nprobe, ncandidates and rerank, where not given, from the index's recall estimate (0: off)")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
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
    bs->add_option("--peer-nbits", sbo.peer_nbits, "The peer's residual bits")->capture_default_str()->check(CLI::IsMember({1, 2, 4}));

    // demo
    std::string demo_dir;
    tms::SynthOptions demo_so;
    demo_so.n_docs = 1000;
    demo_so.n_queries = 100;
    std::string demo_device = "auto";
    auto* demo = app.add_subcommand("demo", "End to end on a synthetic corpus: synth, index, search, eval");
    demo->add_option("--dir", demo_dir, "Work directory (default: a new temporary directory)");
    demo->add_option("--docs", demo_so.n_docs, "Documents")->capture_default_str();
    demo->add_option("--queries", demo_so.n_queries, "Queries")->capture_default_str();
    demo->add_option("--dim", demo_so.dim, "Embedding dimension")->capture_default_str();
    demo->add_option("--device", demo_device, "auto, cpu or gpu")->capture_default_str();

    CLI11_PARSE(app, argc, argv);
    if (quiet + verbose + !log_level.empty() > 1) {
        std::fprintf(stderr, "tms: error: give one of --log-level, --quiet and --verbose\n");
        return 2;
    }
    if (quiet) tms::SetLogLevel(tms::LogLevel::kWarning);
    if (verbose) tms::SetLogLevel(tms::LogLevel::kDebug);
    if (!log_level.empty()) {
        tms::LogLevel level;
        (void)tms::ParseLogLevel(log_level, &level);  // checked by IsMember
        tms::SetLogLevel(level);
    }
    // Under an address-space limit (ulimit -v) every thread maps a stack, a malloc arena and,
    // at its first product, a BLAS buffer (128 MB in Debian's OpenBLAS), RocksDB starts four
    // threads of its own, and OpenBLAS's workers (one a core but one, started with the library)
    // map their buffers at a moment of their own. Third-party threads abort or spin when such a
    // mapping fails, so work that may not fit is refused before any of it starts.
    if (!synth->parsed() && !eval->parsed()) {
        const int threads = omp_get_max_threads();
        const int64_t need = (int64_t(200) * threads + int64_t(128) * (omp_get_num_procs() - 1) + 352) << 20;
        const tms::Status st = tms::CheckAddressSpace(need, threads, "");
        if (!st.ok()) return fail(app.get_subcommands().front()->get_name(), st);
    }
    // The command line as it ran, for the benchmarks' JSON.
    std::string command_line;
    for (int i = 0; i < argc; ++i) command_line += (i ? " " : "") + std::string(argv[i]);

    if (synth->parsed()) {
        const auto t0 = Clock::now();
        tms::Status st = tms::CheckOutputPath(synth_out, tms::OutputKind::kDirectory).WithContext("--out");
        if (st.ok()) st = tms::WriteSynthCorpus(so, synth_out);
        if (!st.ok()) return fail("synth", st);
        tms::LogInfo("tms synth: %lld documents, %d queries, dim %d in %.2f s -> %s\n", (long long)so.n_docs,
                     so.n_queries, so.dim, tms::SecondsSince(t0), synth_out.c_str());
        return 0;
    }
    if (idx->parsed()) {
        if (tms::Status st = tms::CheckOutputPath(index_out, tms::OutputKind::kIndex,
                                                  {{"--docs", docs}, {"--doclens", doclens}, {"--doc-ids", doc_ids},
                                                   {"--metadata", index_meta}, {"--config", config},
                                                   {"--estimate-sample", index_sample}})
                                  .WithContext("--out");
            !st.ok()) {
            return fail("index", st);
        }
        if (!config.empty()) {
            tms::Status st = tms::LoadBuildOptionsJson(config, &io);
            if (!st.ok()) return fail("index", st);
        }
        if (!codec.empty()) io.codec = codec;
        if (n_centroids >= 0) io.n_centroids = n_centroids;
        if (pq_m >= 0) io.pq_m = pq_m;
        if (nbits >= 0) {  // the residual codec's bits: --nbits alone means that codec (fast-plaid's nbits)
            if (codec == "pq") {
                return fail("index", tms::Status::InvalidArgument("--nbits is the residual codec's bits per "
                                                                  "dimension; --codec pq takes --pq-m"));
            }
            io.codec = "residual";
            io.residual_nbits = nbits;
        }
        if (shards >= 0) io.shards = shards;
        if (keep_vectors) io.keep_vectors = true;
        io.overwrite = overwrite;
        io.progress = !no_progress;
        if (tms::Status st = parse_device(index_device, &io.device); !st.ok()) return fail("index", st);
        std::unique_ptr<tms::DocMetadata> metadata;
        if (tms::Status st = load_metadata(index_meta, index_meta_types, &metadata); !st.ok()) return fail("index", st);
        EstimateSample index_sample_q;
        if (tms::Status st = load_estimate_sample(index_sample, &index_sample_q, &index_eo); !st.ok()) {
            return fail("index", st);
        }
#if TMS_WITH_MPI
        if (under_mpirun()) {
            int provided = 0, rank = 0;
            MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
            MPI_Comm_rank(MPI_COMM_WORLD, &rank);
            if (rank != 0) io.progress = false;
            tms::Status st;
            {
                const std::unique_ptr<tms::BuildGroup> group = tms::MakeMpiBuildGroup(MPI_COMM_WORLD, index_mpi_timeout);
                index_eo.device = io.device;
                st = build_index(docs, doclens, doc_ids, index_out, io, group.get(), metadata.get(),
                                 no_estimate ? nullptr : &index_eo);
            }
            // Rank 0 says why before the job ends: once another rank has exited non-zero, mpirun
            // may end rank 0 at any moment after MPI_Finalize.
            const int rc = st.ok() ? 0 : rank != 0 ? exit_code(st) : fail("index", st);
            MPI_Finalize();
            return rc;
        }
#endif
        index_eo.device = io.device;
        tms::Status st = build_index(docs, doclens, doc_ids, index_out, io, nullptr, metadata.get(),
                                     no_estimate ? nullptr : &index_eo);
        return st.ok() ? 0 : fail("index", st);
    }
    if (est->parsed()) {
        tms::Status st = parse_device(est_device, &est_o.device);
        EstimateSample sample;
        if (st.ok()) st = load_estimate_sample(est_sample, &sample, &est_o);
        if (st.ok()) st = estimate_index("tms estimate", est_path, est_o);
        return st.ok() ? 0 : fail("estimate", st);
    }
    if (search->parsed()) {
#if TMS_WITH_MPI
        if (under_mpirun()) {
            int provided = 0;
            MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
            bool quiet_failure = false;
            const tms::Status st = run_search_mpi(sa, &quiet_failure);
            const int rc = st.ok() ? 0 : quiet_failure ? exit_code(st) : fail("search", st);  // before the end
            MPI_Finalize();
            return rc;
        }
#endif
        double qps;
        tms::Status st = run_search(sa, false, &qps);
        return st.ok() ? 0 : fail("search", st);
    }
    if (bs->parsed()) {
        sbo.command = command_line;
        sbo.recall = !sb_no_recall;
        sbo.search.pruning = parse_pruning(sb_pruning);
        for (const auto& p : sb_prunings) {
            sbo.pruning_list.push_back(parse_pruning(p));
        }
        sbo.searcher.progress = false;
        tms::Status st = parse_device(sb_device, &sbo.searcher.device);
        if (st.ok() && !sb_devices.empty()) st = tms::ParseDeviceList(sb_devices, &sbo.searcher).WithContext("--devices");
        if (st.ok()) st = tms::ParseVectorTier(sb_vectors, &sbo.searcher.vectors).WithContext("--vectors");
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
    }
    if (rr->parsed()) {
        tms::Status st = run_rerank(ra, rerank_run);
        return st.ok() ? 0 : fail("rerank", st);
    }
    if (eval->parsed()) {
        tms::EvalResult r;
        tms::Status st = eval_files(run_path, qrels_path, eval_json, false, &r, eval_metrics, eval_per_query);
        return st.ok() ? 0 : fail("eval", st);
    }
    if (info->parsed()) {
        tms::Status st = print_info(info_path);
        return st.ok() ? 0 : fail("info", st);
    }
    if (add->parsed() || del->parsed()) {
        const std::string cmd = add->parsed() ? "add" : "delete";
        const auto t0 = Clock::now();
        std::unique_ptr<tms::DocMetadata> metadata;  // read (and checked) before the index is opened
        tms::Status st = add->parsed() ? load_metadata(upd_meta, upd_meta_types, &metadata) : tms::Status::OK();
        std::unique_ptr<tms::IndexUpdater> u;
        if (st.ok()) st = tms::IndexUpdater::Open(upd_index, true, &u);
        const int64_t before_docs = st.ok() ? u->info().n_docs : 0, before_del = st.ok() ? u->info().n_deleted : 0;
        int64_t already_deleted = 0;
        if (st.ok() && add->parsed()) st = u->AddFromFiles(upd_docs, upd_doclens, upd_ids, upd_replace, metadata.get());
        if (st.ok() && del->parsed()) {
            std::vector<std::string> ids;
            st = tms::ReadLines(upd_ids, &ids);
            if (st.ok()) st = u->Delete(ids, &already_deleted);
            if (!st.ok() && st.message().rfind("doc-ids:", 0) == 0) st = tms::Status(st.code(), upd_ids + st.message().substr(7));
        }
        if (st.ok()) st = u->Commit();
        if (!st.ok()) return fail(cmd, st);
        const long long added = u->info().n_docs - before_docs, removed = u->info().n_deleted - before_del;
        std::string what = add->parsed() ? std::to_string(added) + " added" +
                                               (removed ? " (" + std::to_string(removed) + " replaced)" : "")
                                         : std::to_string(removed) + " deleted";
        if (already_deleted) what += ", " + std::to_string(already_deleted) + " already deleted (skipped)";
        tms::LogInfo("tms %s: %s in %.2f s; index has %lld live documents -> %s\n", cmd.c_str(), what.c_str(),
                     tms::SecondsSince(t0), (long long)(u->info().n_docs - u->info().n_deleted), upd_index.c_str());
        return 0;
    }
    if (compact->parsed()) {
        const auto t0 = Clock::now();
        tms::Status st = tms::CompactIndex(upd_index, true);
        if (!st.ok()) return fail("compact", st);
        tms::LogInfo("tms compact: %s rewritten in %.2f s\n", upd_index.c_str(), tms::SecondsSince(t0));
        return 0;
    }
    if (bi->parsed()) {
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
    }
    if (bk->parsed()) {
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
            if (pos != std::string::npos) json.insert(pos, (json[json.find_last_not_of(" \n\t", pos - 1)] == '[' ? "" : ",") + code_rows);
        }
        std::cout << json << std::endl;
        if (!bench_json.empty()) {
            std::ofstream f(bench_json);
            f << json << '\n';
            if (!f) return fail("bench kernels", tms::Status::IOError(bench_json + ": write failed"));
        }
        return 0;
    }
    if (demo->parsed()) {
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
        std::printf("%-12s %10.4f\n", "recall@10 vs exhaustive", recall_vs(a.out, (d / "exhaustive.trec").string(), 10));
        std::printf("\ntotal %.2f s; files in %s\n", tms::SecondsSince(t_all), demo_dir.c_str());
        return 0;
    }
    return 0;
}
}  // namespace

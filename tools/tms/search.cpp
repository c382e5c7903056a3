// Copyright TileMaxSim authors. `tms search`: batch search, queries .npy -> TREC run (under mpirun, every
// rank a share of the shards).
#include "tools/tms/common.h"
#include "base/log.h"
#include "base/progress.h"

#include "tools/tms/query.h"
#if TMS_WITH_MPI
#include "mpi/mpi_searcher.h"
#endif

namespace tms::cli {
namespace {

#if TMS_WITH_MPI
// The distributed search (mpi/mpi_searcher.h): rank r opens its run of shards; rank 0
// reads the queries, writes the run and prints the summary (and any rank's failure). The other
// ranks print nothing: *quiet_failure tells the caller so.
tms::Status run_search_mpi(const SearchArgs& a, bool* quiet_failure) {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    *quiet_failure = rank != 0;
    if (!a.subset.empty()) return tms::Status::NotSupported("--subset is not supported under mpirun (use --filter)");
    if (!a.record_queries.empty()) return tms::Status::NotSupported("--record-queries is not supported under mpirun");
    if (!a.explain.empty()) return tms::Status::NotSupported("--explain is not supported under mpirun");
    if (!a.certificates.empty()) return tms::Status::NotSupported("--certificates is not supported under mpirun");
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
    std::vector<std::string> texts;  // rank 0's, modes bm25 and hybrid
    if (rank == 0 && qst.ok() && st.ok() && opts.mode != tms::SearchMode::kMaxSim) {
        qst = read_query_texts(a, whole, &texts);
        opts.query_texts = std::make_shared<const std::vector<std::string>>(std::move(texts));
    }
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
    tms::LogInfo(
        "tms search: rank 0 per batch: broadcast %.0f us, own search %.0f us (cuts %.0f us), gather "
        "%.0f us, merge %.0f us (%lld batches)\n",
        m.broadcast_s * per, m.search_s * per, m.cut_s * per, m.gather_s * per, m.merge_s * per, (long long)m.batches);
    return tms::Status::OK();
}
#endif

}  // namespace

Command AddSearch(CLI::App& app, const Context& ctx) {
    struct State {
        SearchArgs sa;
    };
    auto s = std::make_shared<State>();
    auto& sa = s->sa;
    auto* search = app.add_subcommand("search", "Batch search: queries .npy -> TREC run");
    search->add_option("--index", sa.index, "Index directory")->required();
    search->add_option("--queries", sa.queries, "Query embeddings .npy [n_queries, tokens, dim]")->required();
    search->add_option("--query-ids", sa.query_ids, "Query ids, one per line (default: 0..n-1)");
    search->add_option("--out", sa.out, "TREC run file to write")->required();
    search->add_option("--tag", sa.tag, "Run tag (last TREC column)")->capture_default_str();
    add_search_options(search, &sa);
    search->add_option("--record-queries", sa.record_queries,
                       "Keep a uniform sample of the searched queries in this .npy (float16 [n, tokens, dim], "
                       "zero rows padding shorter queries), merged with the sample already there: tms estimate "
                       "--sample FILE then measures the recall estimate on the queries the index really gets");
    search->add_option("--record-max", sa.record_max, "Queries --record-queries keeps at most")
        ->capture_default_str()
        ->check(CLI::Range(1, 1000000));
    auto run = [s, &ctx]() -> int {
        auto& sa = s->sa;
        int& argc = *ctx.argc;
        char**& argv = *ctx.argv;
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
    };
    return {search, run};
}

}  // namespace tms::cli

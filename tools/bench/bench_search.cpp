// Copyright TileMaxSim authors. `tms bench search`: the search-speed issue's table in one process
// (batch queries/s, one-query latency, concurrent callers, recall against exhaustive search,
// memory, open time, time per stage), as JSON for data/results/search-<gpu>-<date>.json.
#include "tools/bench/bench_search.h"

#include "tilemaxsim/estimate.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <unistd.h>

#include "base/json_escape.h"
#include "base/progress.h"
#include "index/ingest/npy.h"
#include "tools/lib/eval.h"
#include "tilemaxsim/tilemaxsim.h"
#include "tools/bench/bench_kernels.h"
#include "tools/bench/latency.h"

namespace tms::bench {
namespace {

using Clock = std::chrono::steady_clock;

// The process's resident set now and at its peak (bytes), from /proc/self/status.
void host_memory(int64_t* rss, int64_t* peak) {
    *rss = *peak = 0;
    std::ifstream f("/proc/self/status");
    std::string key;
    int64_t kb = 0;
    while (f >> key) {
        if (key == "VmRSS:" && f >> kb)
            *rss = kb * 1024;
        else if (key == "VmHWM:" && f >> kb)
            *peak = kb * 1024;
    }
}

// Every query searched in batches; the hits of all and the summed stage times.
Status search_all(const Searcher& s, const QueryBatch& q, int batch, const SearchOptions& o,
                  std::vector<std::vector<SearchHit>>* hits, SearchTimings* t) {
    hits->clear();
    *t = SearchTimings{};
    for (int q0 = 0; q0 < q.n_queries; q0 += batch) {
        std::vector<std::vector<SearchHit>> r;
        SearchTimings bt;
        TMS_RETURN_IF_ERROR(s.Search(q.Slice(q0, std::min(batch, q.n_queries - q0)), o, &r, &bt));
        t->candidates += bt.candidates;
        t->scoring += bt.scoring;
        t->rerank += bt.rerank;
        for (auto& h : r) hits->push_back(std::move(h));
    }
    return Status::OK();
}

// recall@k of `got` against `truth`, averaged over the queries with any truth. With eps >= 0,
// ann-benchmarks' recall with a tolerance: a hit also counts when its score is within eps
// (relative) of the truth's last, so that documents tied with the k-th within rounding are not
// misses; only for hits with exact scores (reranked, as the truth).
double recall_at(const std::vector<std::vector<SearchHit>>& truth, const std::vector<std::vector<SearchHit>>& got,
                 double eps = -1) {
    double sum = 0;
    int n = 0;
    for (size_t q = 0; q < truth.size(); ++q) {
        if (truth[q].empty() || q >= got.size()) continue;
        std::set<std::string> t;
        for (const auto& h : truth[q]) t.insert(h.doc_id);
        const double last = truth[q].back().score;
        const double floor = eps >= 0 ? last - eps * std::fabs(last) : INFINITY;
        size_t hit = 0;
        for (const auto& h : got[q]) hit += t.count(h.doc_id) || double(h.score) >= floor;
        sum += double(std::min(hit, t.size())) / double(t.size());
        ++n;
    }
    return n ? sum / n : 0;
}

}  // namespace

// The truth as a TREC run (qids 0, 1, ... in query order): --truth-out's file, the peer's input.
Status write_truth(const std::string& path, const std::vector<std::vector<SearchHit>>& truth, const char* tag) {
    std::vector<std::string> qids;
    std::vector<std::vector<std::pair<std::string, float>>> rows;
    for (size_t i = 0; i < truth.size(); ++i) {
        qids.push_back(std::to_string(i));
        rows.emplace_back();
        for (const SearchHit& h : truth[i]) rows.back().emplace_back(h.doc_id, h.score);
    }
    return WriteRun(path, qids, rows, tag);
}

// s quoted for /bin/sh.
std::string shell_quote(const std::string& s) {
    std::string r = "'";
    for (char c : s) r += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return r + "'";
}

// The peer's row (one JSON object, the schema of ours): o.peer_script run on the same corpus and
// queries, scored against `truth` (written to a temporary TREC run for it).
std::filesystem::path peer_corpus(const SearchBenchOptions& o) {
    return o.peer_corpus.empty() ? std::filesystem::path(o.queries).parent_path()
                                 : std::filesystem::path(o.peer_corpus);
}

// What the peer needs, checked before anything is measured.
Status check_peer(const SearchBenchOptions& o) {
    namespace fs = std::filesystem;
    if (o.peer != "fast-plaid") return Status::InvalidArgument("--peer: unknown system '" + o.peer + "' (fast-plaid)");
    if (!fs::exists(o.peer_script)) {
        return Status::InvalidArgument(o.peer_script +
                                       ": not found (run from the repository root, or pass --peer-script)");
    }
    const fs::path docs = peer_corpus(o) / "docs.npy";
    if (!fs::exists(docs)) {
        return Status::InvalidArgument(docs.string() +
                                       ": not found: the peer needs the corpus's embeddings (pass --peer-corpus DIR)");
    }
    return Status::OK();
}

Status run_peer(const SearchBenchOptions& o, const std::vector<std::vector<SearchHit>>& truth, std::string* row) {
    namespace fs = std::filesystem;
    const fs::path corpus = peer_corpus(o);
    const fs::path tmp = fs::temp_directory_path() / ("tms-peer-" + std::to_string(::getpid()));
    std::error_code ec;
    fs::create_directories(tmp, ec);
    if (ec) return Status::IOError(tmp.string() + ": cannot create: " + ec.message());
    struct Cleanup {
        fs::path p;
        ~Cleanup() {
            std::error_code e;
            fs::remove_all(p, e);
        }
    } cleanup{tmp};
    const fs::path run = tmp / "truth.trec", out = tmp / "row.json";
    TMS_RETURN_IF_ERROR(write_truth(run.string(), truth, "truth"));
    const std::string cmd =
        "python3 " + shell_quote(o.peer_script) + " --corpus " + shell_quote(corpus.string()) + " --queries " +
        shell_quote(o.queries) + " --truth " + shell_quote(run.string()) + " --out " + shell_quote(out.string()) +
        " --index " + shell_quote((tmp / "index").string()) + " --nbits " + std::to_string(o.peer_nbits) + " --k " +
        std::to_string(o.search.k) + " --single " + std::to_string(std::max(1, o.single)) + " >&2";
    std::fprintf(stderr, "peer: %s\n", cmd.c_str());
    std::fflush(stderr);
    const int rc = std::system(cmd.c_str());
    if (rc != 0) {
        return Status::Internal("--peer " + o.peer + ": " + o.peer_script + " failed (status " + std::to_string(rc) +
                                "; its output is above)");
    }
    std::ifstream f(out);
    std::string line;
    std::getline(f, line);
    if (line.size() < 2 || line.front() != '{' || line.back() != '}') {
        return Status::Internal("--peer " + o.peer + ": " + out.string() + ": not one JSON object");
    }
    *row = line;
    return Status::OK();
}

Status RunSearchBench(const SearchBenchOptions& o, std::string* json) {
    if (o.batch <= 0 || o.passes <= 0 || o.single < 0) return Status::InvalidArgument("bench search: bad counts");
    if (!o.peer.empty()) TMS_RETURN_IF_ERROR(check_peer(o));
    HostArray arr;
    TMS_RETURN_IF_ERROR(LoadNpy(o.queries, &arr));
    EmbeddingView view;
    TMS_RETURN_IF_ERROR(EmbeddingsFromArray(arr, 3, o.queries, &view));
    QueryBatch q;
    q.data = view.data;
    q.dtype = view.dtype;
    q.n_queries = int(arr.shape[0]);
    q.q_tokens = int(arr.shape[1]);
    q.dim = view.dim;
    auto t0 = Clock::now();
    std::unique_ptr<Searcher> s;
    TMS_RETURN_IF_ERROR(Searcher::Open(o.searcher, o.index, &s));
    const double open_s = SecondsSince(t0);
    const IndexInfo& info = s->info();
    int64_t index_bytes = 0;  // on disk, every shard's store
    for (const ShardInfo& sh : info.shards) index_bytes += sh.bytes;
    int64_t rss = 0, peak = 0, dev_used = 0;
    host_memory(&rss, &peak);
    std::string gpu = "cpu";
    if (s->device() == Device::kGpu) {  // the GPUs the shards are on: their name, memory in use
        std::set<int> gpus;
        for (const ShardPlacement& p : s->placement()) gpus.insert(p.gpu);
        for (int g : gpus) {
            int64_t used = 0;
            if (GpuState(g, &gpu, &used).ok()) dev_used += used;
        }
    }
    // Where the vectors are, and (streamed tiers on a GPU) the link they cross.
    int64_t vector_bytes = 0;
    for (const ShardPlacement& p : s->placement()) vector_bytes += p.vector_bytes;
    const VectorTier tier = s->placement().empty() ? VectorTier::kNone : s->placement()[0].vectors;
    double h2d = 0;
    if (s->device() == Device::kGpu && (tier == VectorTier::kHost || tier == VectorTier::kDisk)) {
        (void)HostToDeviceBandwidth(s->placement()[0].gpu, &h2d);
    }
    std::fprintf(stderr,
                 "bench search: %lld documents, %lld tokens, %d queries; open %.2f s, host RSS %.2f GB, %s; "
                 "vectors %s (%.2f GB)\n",
                 (long long)info.n_docs, (long long)info.n_tokens, q.n_queries, open_s, double(rss) / 1e9, gpu.c_str(),
                 VectorTierName(tier), double(vector_bytes) / 1e9);
    int64_t allowed = info.n_docs - info.n_deleted;  // documents a query may return
    if (!o.search.filter.empty()) {
        DocSet set;
        TMS_RETURN_IF_ERROR(s->Filter(o.search.filter, &set));
        allowed = set.Count(0);
        std::fprintf(stderr, "bench search: filter \"%s\" allows %lld documents (%.3f%%)\n", o.search.filter.c_str(),
                     (long long)allowed, 100.0 * double(allowed) / double(std::max<int64_t>(1, info.n_docs)));
    }
    // The truth: exact MaxSim over every (allowed) document, or the given run (its best k per query).
    std::vector<std::vector<SearchHit>> truth;
    double exhaustive_s = 0;
    const bool exhaustive = o.truth.empty() && o.recall && tier != VectorTier::kNone;
    const bool with_recall = exhaustive || !o.truth.empty();
    if (!o.peer.empty() && !with_recall) {
        return Status::InvalidArgument("--peer needs the truth: an index with vectors (exhaustive search) or --truth");
    }
    if (exhaustive) {
        SearchOptions ex = o.search;
        ex.exhaustive = true;
        SearchTimings t;
        for (int p = 0; p < std::max(1, o.exhaustive_passes); ++p) {
            t0 = Clock::now();
            TMS_RETURN_IF_ERROR(search_all(*s, q, o.batch, ex, &truth, &t));
            exhaustive_s = p == 0 ? SecondsSince(t0) : std::min(exhaustive_s, SecondsSince(t0));
        }
        const double streamed = double(vector_bytes) * double((q.n_queries + o.batch - 1) / o.batch) / 1e9;
        std::fprintf(stderr, "bench search: exhaustive %.2f s, %.1f GB/s of vectors%s\n", exhaustive_s,
                     exhaustive_s > 0 ? streamed / exhaustive_s : 0.0,
                     h2d > 0 ? (" (host to device " + std::to_string(int(h2d)) + " GB/s)").c_str() : "");
        if (!o.truth_out.empty()) TMS_RETURN_IF_ERROR(write_truth(o.truth_out, truth, "exhaustive"));
    } else if (!o.truth.empty()) {
        Run run;
        TMS_RETURN_IF_ERROR(ReadRun(o.truth, &run));
        truth.resize(size_t(q.n_queries));
        for (auto& [qid, hits] : run) {
            char* end = nullptr;
            const long i = std::strtol(qid.c_str(), &end, 10);
            if (*end != '\0' || i < 0 || i >= q.n_queries) {
                return Status::InvalidArgument(o.truth + ": query id '" + qid + "' is not a query number in [0, " +
                                               std::to_string(q.n_queries) + ")");
            }
            std::stable_sort(hits.begin(), hits.end(),
                             [](const auto& a, const auto& b) { return a.second > b.second; });
            for (size_t j = 0; j < hits.size() && j < size_t(o.search.k); ++j)
                truth[size_t(i)].push_back(SearchHit{hits[j].first, -1, float(hits[j].second)});
        }
    }
    // The rows: the first with the given options, then every combination of the lists.
    std::vector<SearchOptions> rows{o.search};
    auto or_one = [](const std::vector<int>& v, int d) { return v.empty() ? std::vector<int>{d} : v; };
    const std::vector<Pruning> prunings =
        o.pruning_list.empty() ? std::vector<Pruning>{o.search.pruning} : o.pruning_list;
    for (int np : or_one(o.nprobe_list, o.search.nprobe))
        for (int nc : or_one(o.ncandidates_list, o.search.ncandidates))
            for (int rr : or_one(o.rerank_list, o.search.rerank))
                for (Pruning pr : prunings) {
                    SearchOptions r = o.search;
                    r.nprobe = np;
                    r.ncandidates = nc;
                    r.rerank = rr;
                    r.pruning = pr;
                    const bool same = np == o.search.nprobe && nc == o.search.ncandidates && rr == o.search.rerank &&
                                      pr == o.search.pruning;
                    if (!same) rows.push_back(r);
                }
    // Each row's settings as the search plans them (the index's recall estimate for the target
    // recall; exhaustive search for a small index), printed and recorded as they ran.
    for (SearchOptions& r : rows) {
        r = s->Plan(r);
        r.target_recall = 0;
    }
    std::string index_name = info.codec == "pq" ? "pq-" + std::to_string(info.pq_m)
                                                : "residual-" + std::to_string(info.residual_nbits) + "bit";
    if (info.has_vectors) index_name += "+vectors";
    std::string out_rows;
    std::fprintf(stderr, "%-12s %7s %7s %7s %10s %9s %8s %8s %12s\n", "pruning", "nprobe", "ncand", "rerank",
                 "batch q/s", "recall@k", "p50 ms", "p99 ms", "64 callers");
    for (size_t ri = 0; ri < rows.size(); ++ri) {
        const SearchOptions& r = rows[ri];
        std::vector<std::vector<SearchHit>> hits;
        SearchTimings best_t;
        double best = 1e300;
        for (int p = 0; p < o.passes; ++p) {
            SearchTimings t;
            t0 = Clock::now();
            TMS_RETURN_IF_ERROR(search_all(*s, q, o.batch, r, &hits, &t));
            const double secs = SecondsSince(t0);
            if (secs < best) {
                best = secs;
                best_t = t;
            }
        }
        const double qps = best > 0 ? q.n_queries / best : 0;
        const double recall = with_recall ? recall_at(truth, hits) : -1;
        // Within 1e-3 of the k-th exact score: where the search's own scores are exact too.
        const bool within = exhaustive && r.rerank >= r.k;
        const double recall_eps = within ? recall_at(truth, hits, 1e-3) : -1;
        const double batches = double((q.n_queries + o.batch - 1) / o.batch);
        // The first row: one query per call, alone, then from concurrent callers.
        std::vector<double> lat;
        std::vector<std::pair<int, double>> conc;
        if (ri == 0) {
            for (int i = 0; i < o.single; ++i) {
                std::vector<std::vector<SearchHit>> one;
                t0 = Clock::now();
                TMS_RETURN_IF_ERROR(s->Search(q.Slice(i % q.n_queries, 1), r, &one));
                lat.push_back(SecondsSince(t0) * 1e3);
            }
            for (int c : o.concurrency) {
                if (c <= 0) continue;
                const int total = std::max(q.n_queries, 4 * c);
                std::atomic<int> next{0};
                std::atomic<bool> failed{false};
                t0 = Clock::now();
                std::vector<std::thread> th;
                for (int k = 0; k < c; ++k) {
                    th.emplace_back([&] {
                        for (int i; (i = next.fetch_add(1)) < total;) {
                            std::vector<std::vector<SearchHit>> one;
                            if (!s->Search(q.Slice(i % q.n_queries, 1), r, &one).ok()) failed = true;
                        }
                    });
                }
                for (auto& t : th) t.join();
                if (failed) return Status::Internal("bench search: a concurrent search failed");
                conc.emplace_back(c, total / SecondsSince(t0));
            }
        }
        const double p50 = Percentile(lat, 0.5), p99 = Percentile(lat, 0.99);
        double qps64 = 0;
        for (const auto& [c, v] : conc)
            if (c == 64) qps64 = v;
        char rs[16] = "-";
        if (with_recall) std::snprintf(rs, sizeof(rs), "%.4f", recall);
        std::fprintf(stderr, "%-12s %7d %7d %7d %10.1f %9s %8.3f %8.3f %12.1f\n",
                     r.exhaustive ? "exhaustive" : PruningName(r.pruning), r.nprobe, r.ncandidates, r.rerank, qps, rs,
                     p50, p99, qps64);
        char b[1536];
        std::snprintf(b, sizeof(b),
                      "%s{\"system\": \"tms\", \"index\": \"%s\", \"exhaustive\": %s, \"pruning\": \"%s\", "
                      "\"nprobe\": %d, "
                      "\"ncandidates\": %d, \"rerank\": %d, \"k\": %d, \"batch\": %d, \"batch_qps\": %.1f, "
                      "\"recall_at_10\": %s, \"recall_at_10_within_1e-3\": %s, \"ms_per_batch\": {\"candidates\": "
                      "%.3f, \"scoring\": %.3f, "
                      "\"rerank\": %.3f}",
                      out_rows.empty() ? "" : ",\n  ", index_name.c_str(), r.exhaustive ? "true" : "false",
                      PruningName(r.pruning), r.nprobe, r.ncandidates, r.rerank, r.k, o.batch, qps,
                      with_recall ? std::to_string(recall).c_str() : "null",
                      within ? std::to_string(recall_eps).c_str() : "null", best_t.candidates * 1e3 / batches,
                      best_t.scoring * 1e3 / batches, best_t.rerank * 1e3 / batches);
        out_rows += b;
        if (ri == 0) {
            std::snprintf(b, sizeof(b), ", \"p50_ms\": %.3f, \"p99_ms\": %.3f", p50, p99);
            out_rows += b;
            for (const auto& [c, v] : conc) {
                std::snprintf(b, sizeof(b), ", \"concurrent_qps_%d\": %.1f", c, v);
                out_rows += b;
            }
            std::snprintf(b, sizeof(b),
                          ", \"build_s\": null, \"index_bytes\": %lld, \"open_s\": %.3f, "
                          "\"host_rss_bytes\": %lld, \"host_peak_rss_bytes\": %lld, \"device_used_bytes\": %lld, "
                          "\"exhaustive_s\": %.6f, \"vectors\": \"%s\", \"vector_bytes\": %lld, "
                          "\"h2d_gb_s\": %.1f",
                          (long long)index_bytes, open_s, (long long)rss, (long long)peak, (long long)dev_used,
                          exhaustive_s, VectorTierName(tier), (long long)vector_bytes, h2d);
            out_rows += b;
        }
        out_rows += "}";
    }
    if (!o.peer.empty()) {
        std::string peer_row;
        TMS_RETURN_IF_ERROR(run_peer(o, truth, &peer_row));
        out_rows += ",\n  " + peer_row;
    }
    char date[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
    *json = "{\"gpu\": \"" + json_escape(gpu) + "\", \"date\": \"" + date + "\", \"command\": \"" +
            json_escape(o.command) + "\",\n \"corpus\": {\"n_docs\": " + std::to_string(info.n_docs) +
            ", \"n_tokens\": " + std::to_string(info.n_tokens) + ", \"dim\": " + std::to_string(info.dim) +
            ", \"n_queries\": " + std::to_string(q.n_queries) + ", \"shards\": " + std::to_string(info.shards.size()) +
            ", \"filter\": \"" + json_escape(o.search.filter) + "\", \"allowed_docs\": " + std::to_string(allowed) +
            "},\n \"rows\": [\n  " + out_rows + "\n ]}\n";
    return Status::OK();
}

}  // namespace tms::bench

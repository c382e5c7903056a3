// Copyright TileMaxSim authors. `tms bench index`: end-to-end build throughput, peak host memory,
// index size and load bandwidth on a synthetic corpus. Each build and each load runs in a
// child process so that its peak RSS is its own.
#include "tools/bench/bench_index.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "tools/lib/synth.h"
#include "tilemaxsim/tilemaxsim.h"
#include "base/json_escape.h"

namespace fs = std::filesystem;

namespace tms::bench {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Runs fn in a child process; returns its exit status and peak RSS (bytes). The parent must not
// have used OpenMP (libgomp's thread pool does not survive fork).
int run_child(const std::function<int()>& fn, double* seconds, double* peak_rss) {
    std::fflush(stdout);
    std::fflush(stderr);
    const double t0 = now_s();
    const pid_t pid = fork();
    if (pid == 0) _exit(fn());
    int status = 0;
    struct rusage ru {};
    wait4(pid, &status, 0, &ru);
    *seconds = now_s() - t0;
    *peak_rss = double(ru.ru_maxrss) * 1024.0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

int64_t dir_bytes(const fs::path& p) {
    int64_t b = 0;
    std::error_code ec;
    for (const auto& e : fs::recursive_directory_iterator(p, ec))
        if (e.is_regular_file(ec)) b += static_cast<int64_t>(e.file_size(ec));
    return b;
}

}  // namespace

Status RunIndexBench(const IndexBenchOptions& o, std::string* json) {
    if (o.tokens <= 0) return Status::InvalidArgument("--tokens must be > 0");
    const fs::path dir =
        o.dir.empty() ? fs::temp_directory_path() / ("tms-bench-index-" + std::to_string(getpid())) : fs::path(o.dir);
    SynthOptions so;
    so.dim = o.dim;
    so.n_queries = 1;
    so.n_docs = std::max<int64_t>(1, o.tokens / ((so.min_doc_len + so.max_doc_len) / 2));
    std::fprintf(stderr, "bench index: synthesizing %lld documents (~%lld tokens, dim %d) in %s\n",
                 (long long)so.n_docs, (long long)o.tokens, o.dim, dir.c_str());
    // Everything runs in children: libgomp is not fork-safe once the parent has used OpenMP.
    double synth_s = 0, synth_rss = 0;
    if (run_child([&]() { return WriteSynthCorpus(so, dir.string()).ok() ? 0 : 1; }, &synth_s, &synth_rss) != 0) {
        return Status::IOError(dir.string() + ": writing the synthetic corpus failed");
    }
    const int64_t input_bytes = static_cast<int64_t>(fs::file_size(dir / "docs.npy"));
    std::ostringstream rows;
    bool first = true;
    for (const std::string& codec : o.codecs) {
        IndexBuildOptions bo;
        if (codec == "pq16") {
            bo.codec = "pq";
            bo.pq_m = 16;
        } else if (codec == "res2" || codec == "res1" || codec == "res4") {
            bo.codec = "residual";
            bo.residual_nbits = codec[3] - '0';
        } else {
            return Status::InvalidArgument("unknown codec case '" + codec + "' (pq16, res1, res2, res4)");
        }
        bo.n_centroids = o.centroids;
        bo.overwrite = true;
        bo.progress = false;
        bo.device = o.device;
        const fs::path out = dir / ("index-" + codec);
        BuildStats st;
        const std::string stats_file = (dir / ("stats-" + codec + ".txt")).string();
        double build_s = 0, build_rss = 0;
        const int rc = run_child(
            [&]() {
                std::unique_ptr<IndexBuilder> b;
                Status s = IndexBuilder::Create(bo, out.string(), &b);
                if (s.ok()) s = b->BuildFromFiles((dir / "docs.npy").string(), (dir / "doclens.npy").string(), "", &st);
                if (!s.ok()) {
                    std::fprintf(stderr, "bench index: %s\n", s.ToString().c_str());
                    return 1;
                }
                std::ofstream f(stats_file);
                f << st.n_tokens << ' ' << st.n_centroids << '\n';
                for (const auto& [name, sec] : st.phase_seconds) f << name << ' ' << sec << '\n';
                return 0;
            },
            &build_s, &build_rss);
        if (rc != 0)
            return Status::Internal("bench index: the " + codec + " build failed (exit " + std::to_string(rc) + ")");
        int64_t n_tokens = 0;
        int n_centroids = 0;
        std::string phases;
        {
            std::ifstream f(stats_file);
            f >> n_tokens >> n_centroids;
            std::string name;
            double sec;
            while (f >> name >> sec)
                phases += (phases.empty() ? "" : ", ") + ("\"" + name + "\": " + std::to_string(sec));
        }
        const int64_t index_bytes = dir_bytes(out);
        SearcherOptions lo;
        lo.device = o.device;
        lo.progress = false;
        double load_s = 0, load_rss = 0;
        const std::string open_file = (dir / ("open-" + codec + ".txt")).string();
        const int lrc = run_child(
            [&]() {
                std::unique_ptr<Searcher> s;
                const double t0 = now_s();
                Status st2 = Searcher::Open(lo, out.string(), &s);
                if (!st2.ok()) std::fprintf(stderr, "bench index: %s\n", st2.ToString().c_str());
                std::ofstream(open_file) << (now_s() - t0) << '\n';
                return st2.ok() ? 0 : 1;
            },
            &load_s, &load_rss);
        if (lrc != 0) return Status::Internal("bench index: loading the " + codec + " index failed");
        // Searcher::Open alone (read, checksum, decode, upload; CUDA context creation included),
        // next to the whole child process (start-up and exit included).
        double open_s = load_s;
        std::ifstream(open_file) >> open_s;
        char row[1024];
        std::snprintf(row, sizeof row,
                      "{\"case\": \"build_%s_d%d_t%lld\", \"tokens\": %lld, \"centroids\": %d, \"seconds\": %.3f, "
                      "\"tokens_per_s\": %.0f, \"peak_rss_bytes\": %.0f, \"index_bytes\": %lld, "
                      "\"peak_rss_beyond_index_bytes\": %.0f, \"index_bytes_per_token\": %.2f, \"load_seconds\": %.3f, "
                      "\"load_process_seconds\": %.3f, \"load_gbps\": %.3f, \"load_rss_bytes\": %.0f, \"phases\": {",
                      codec.c_str(), o.dim, (long long)n_tokens, (long long)n_tokens, n_centroids, build_s,
                      n_tokens / build_s, build_rss, (long long)index_bytes, build_rss - double(index_bytes),
                      double(index_bytes) / n_tokens, open_s, load_s, index_bytes / open_s / 1e9, load_rss);
        rows << (first ? "" : ",\n") << "  " << row << phases << "}}";
        first = false;
        std::fprintf(
            stderr,
            "bench index: %s: %lld tokens in %.1f s (%.0f tokens/s), peak RSS %.2f GB, %.1f B/token, load %.2f GB/s\n",
            codec.c_str(), (long long)n_tokens, build_s, n_tokens / build_s, build_rss / 1e9,
            double(index_bytes) / n_tokens, index_bytes / open_s / 1e9);
    }
    char date[32];
    const std::time_t t = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&t));
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    std::ostringstream j;
    j << "{\"date\": \"" << date << "\", \"host\": \"" << host << "\", \"cpus\": " << sysconf(_SC_NPROCESSORS_ONLN)
      << ", \"device\": \"" << DeviceName(o.device) << "\", \"input_bytes\": " << input_bytes << ", \"command\": \""
      << tms::json_escape(o.command) << "\", \"cases\": [\n"
      << rows.str() << "\n]}";
    *json = j.str();
    if (o.dir.empty()) fs::remove_all(dir);
    return Status::OK();
}

}  // namespace tms::bench

// Copyright TileMaxSim authors. The `tms` command line: the app, its global options and the dispatch
// to the commands (one file each in tools/tms/: synth, index, estimate, search, rerank, eval, info,
// update (add, delete), compact, bench, demo; what they share in common.h and query.h).
#include <CLI/CLI.hpp>
#include <omp.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "base/log.h"
#include "base/memory.h"
#include "tools/tms/common.h"

namespace {

using tms::cli::fail;
using tms::cli::g_shortage;

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
    for (const CLI::App* sub : cmd->get_subcommands([](const CLI::App*) { return true; }))
        names.push_back(sub->get_name());
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
            std::fprintf(stderr,
                         "tms: error: cannot start a thread (%s): out of host memory or of the process's "
                         "thread limit\n",
                         e.code().message().c_str());
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
    CLI::App app{
        "tms: TileMaxSim, a late-interaction (ColBERT-style) search engine.\n"
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

    // The commands, each registering its options (tools/tms/<command>.cpp).
    tms::cli::Context ctx{&argc, &argv, ""};
    for (int i = 0; i < argc; ++i) ctx.command_line += (i ? " " : "") + std::string(argv[i]);
    std::vector<tms::cli::Command> commands;
    const auto add = [&](tms::cli::Command c) { commands.push_back(std::move(c)); };
    const auto add_all = [&](std::vector<tms::cli::Command> cs) {
        for (auto& c : cs) add(std::move(c));
    };
    const tms::cli::Command synth = tms::cli::AddSynth(app);
    add(synth);
    add(tms::cli::AddIndex(app, ctx));
    add(tms::cli::AddEstimate(app));
    add(tms::cli::AddSearch(app, ctx));
    add(tms::cli::AddRerank(app));
    const tms::cli::Command eval = tms::cli::AddEval(app);
    add(eval);
    add(tms::cli::AddInfo(app));
    add_all(tms::cli::AddUpdate(app));
    add(tms::cli::AddCompact(app));
    add_all(tms::cli::AddBench(app, ctx));
    add(tms::cli::AddDemo(app));
    add(tms::cli::AddServe(app));

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
    if (!synth.app->parsed() && !eval.app->parsed()) {
        const int threads = omp_get_max_threads();
        const int64_t need = (int64_t(200) * threads + int64_t(128) * (omp_get_num_procs() - 1) + 352) << 20;
        const tms::Status st = tms::CheckAddressSpace(need, threads, "");
        if (!st.ok()) return fail(app.get_subcommands().front()->get_name(), st);
    }

    for (const tms::cli::Command& c : commands)
        if (c.app->parsed()) return c.run();
    return 0;
}
}  // namespace

// Copyright TileMaxSim authors. What the `tms` commands share: the command type, failures in one
// line, option parsers, metadata files, the recall estimate's printout.
#pragma once

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "index/ingest/files.h"
#include "index/ingest/npy.h"
#include "tools/lib/eval.h"
#include "tools/lib/synth.h"
#include "tilemaxsim/tilemaxsim.h"

namespace tms::cli {

using Clock = std::chrono::steady_clock;

/// What a command runs with besides its options: the process's arguments (MPI_Init takes them)
/// and the command line as it ran (the benchmarks' JSON records it).
struct Context {
    int* argc = nullptr;
    char*** argv = nullptr;
    std::string command_line;
};

/// A subcommand: registered on the app with its options; `run` runs it when `app` was parsed and
/// returns the exit status.
struct Command {
    CLI::App* app = nullptr;
    std::function<int()> run;
};

// One file per command (tools/tms/<command>.cpp), each registering its options.
Command AddSynth(CLI::App& app);
Command AddIndex(CLI::App& app, const Context& ctx);
Command AddEstimate(CLI::App& app);
Command AddSearch(CLI::App& app, const Context& ctx);
Command AddRerank(CLI::App& app);
Command AddEval(CLI::App& app);
Command AddInfo(CLI::App& app);
std::vector<Command> AddUpdate(CLI::App& app);  // add, delete
Command AddCompact(CLI::App& app);
std::vector<Command> AddBench(CLI::App& app, const Context& ctx);  // bench kernels, index, search
Command AddDemo(CLI::App& app);
Command AddServe(CLI::App& app);

/// Set when a run ends for want of memory (or threads), so that it exits without destructors.
extern std::atomic<bool> g_shortage;

// One line, whatever the message quotes (a path with a newline in it): control characters escaped.
std::string one_line(const std::string& s);

// The exit status of a failure: 3 for an internal error, 1 otherwise.
int exit_code(const tms::Status& st);

// Prints "tms CMD: error: MESSAGE" (one line) and returns the exit status.
int fail(const std::string& cmd, const tms::Status& st);

// --device: auto, cpu or gpu.
tms::Status parse_device(const std::string& s, tms::Device* d);

// --device, --devices (GPU ordinals; "": every GPU) and --vectors (the tier) into `so`.
tms::Status parse_placement(const std::string& device, const std::string& devices, const std::string& vectors,
                            tms::SearcherOptions* so);

// --pruning's value (checked against {interaction, probe} by CLI11).
tms::Pruning parse_pruning(const std::string& s);

#if TMS_WITH_MPI
// Launched by mpirun (Open MPI, or a PMI / PMIx launcher): `tms search` runs on every rank.
bool under_mpirun();
#endif

// --metadata FILE.jsonl with --metadata-types SPEC as DocMetadata; null without --metadata.
tms::Status load_metadata(const std::string& file, const std::string& types, std::unique_ptr<tms::DocMetadata>* out);

// The help of --metadata and --metadata-types (tms index, tms add).
inline constexpr const char* kMetadataHelp =
    "Document attributes, JSONL: one object per document in order, or objects naming their documents by "
    "\"id\" (any order; documents without one get NULLs), e.g. {\"id\": \"d7\", \"tenant\": 3, \"lang\": \"en\"}; "
    "values: integers, reals, strings, booleans, null (arrays and objects kept as JSON text)";
inline constexpr const char* kMetadataTypesHelp =
    "Column types, e.g. \"year:integer,lang:text\" (integer, real or text); other columns: integer when "
    "every value is an integer, real when every value is a number, text otherwise";

// What would rank better when even the estimate's deepest setting falls short (recall < 0.95),
// as `tms index`, `tms estimate` and `tms info` advise it; empty when it does not.
std::string low_recall_advice(const tms::RecallEstimate& e);

// The index's recall estimate and what it chose, as `tms index` and `tms estimate` print them.
void print_estimate(const char* who, const tms::RecallEstimate& e, double secs);

// Measures the index's recall (EstimateRecall) and prints it.
tms::Status estimate_index(const char* who, const std::string& path, const tms::EstimateOptions& eo);

// Evaluates a TREC run against qrels (printed unless quiet): tms eval and tms demo.
tms::Status eval_files(const std::string& run_path, const std::string& qrels_path, bool json, bool quiet,
                       tms::EvalResult* r, const std::string& metrics = "", bool per_query = false);

// Builds the index (as one rank of `group` when given: only rank 0 prints the summary), then,
// with `estimate`, measures its recall (rank 0).
tms::Status build_index(const std::string& docs, const std::string& doclens, const std::string& ids,
                        const std::string& out, const tms::IndexBuildOptions& o, tms::BuildGroup* group = nullptr,
                        const tms::DocMetadata* metadata = nullptr, const tms::EstimateOptions* estimate = nullptr);

}  // namespace tms::cli

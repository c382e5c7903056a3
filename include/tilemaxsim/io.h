// Copyright TileMaxSim authors. Reading and writing the engine's input formats.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms {

/// Read a .npy file (format 1.0-3.0, C order, little-endian). Any failure names the file:
/// "docs.npy: truncated: header says 1000x128 <f2 (256000 bytes), file has 1024".
Status LoadNpy(const std::string& path, HostArray* out);
/// The .npy (format 1.0) preamble and header for `descr` and `shape`, padded to 64 bytes:
/// write it, then the C-order payload.
std::string NpyHeader(const std::string& descr, const std::vector<int64_t>& shape);
/// Write a .npy file (format 1.0) atomically (PATH.tmp, then rename).
Status SaveNpy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape,
               const void* data, size_t nbytes);

/// View a float16/bfloat16/float32 array (bfloat16: ml_dtypes's, which numpy saves as descr <V2)
/// of rank `rank` (2: [rows, dim], 3: [n, tokens, dim]) as
/// embeddings; checks dtype, rank, dim in [32, 1024] and that every value is finite.
/// `what` names the file in messages.
Status EmbeddingsFromArray(const HostArray& arr, int rank, const std::string& what, EmbeddingView* out);
/// Integer array of rank 1, int32 or int64 (other dtypes are refused), as int64 values.
Status IntegersFromArray(const HostArray& arr, const std::string& what, std::vector<int64_t>* out);

/// What a command writes at an output path (CheckOutputPath).
enum class OutputKind : uint8_t {
    kFile,       ///< one file (a run, a JSON report)
    kDirectory,  ///< a directory the command writes files into (tms synth, tms demo)
    kIndex,      ///< an index directory the command builds or replaces (tms index --overwrite)
};

/// Refuses, before any work, an output that would destroy what the command reads or an index:
///   * `out` is one of `inputs` (the same file, through symbolic or hard links);
///   * `out` lies inside an index directory (kIndex: an index's own path is its to replace), or is
///     one (kFile, kDirectory);
///   * kIndex: one of `inputs` lies under `out` (replacing the index would delete it).
/// `inputs` are (option, path) pairs, e.g. {"--queries", "q.npy"}, named in the message; empty
/// paths are skipped. "-" (standard output) passes. Thread-safe.
Status CheckOutputPath(const std::string& out, OutputKind kind,
                       const std::vector<std::pair<std::string, std::string>>& inputs = {});

/// Read one non-empty string per line (trailing '\r' stripped). Empty lines are an error
/// naming the line when `allow_empty` is false.
Status ReadLines(const std::string& path, std::vector<std::string>* lines, bool allow_empty = false);
/// Write lines atomically.
Status WriteLines(const std::string& path, const std::vector<std::string>& lines);

}  // namespace tms

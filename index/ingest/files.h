// Copyright TileMaxSim authors. Id lists, and output files: checked against what a command reads, written
// atomically.
#pragma once

#include <cstdio>
#include <functional>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tilemaxsim/status.h"

namespace tms {

/// What a command writes at an output path (CheckOutputPath).
enum class OutputKind : uint8_t {
    kFile,       ///< one file (a run, a JSON report)
    kDirectory,  ///< a directory the command writes files into (tms synth, tms demo)
    kIndex,      ///< an index directory the command builds or replaces (tms index --overwrite)
};

/// Refuses, before any work, an output that would destroy what the command reads or an index:
///   * `out` is one of `inputs` (the same file, through symbolic or hard links; an input here is
///     any other path the command reads or writes);
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

namespace index {

/// Writes `path` through `fill` (false: a write failed) so that no reader sees a partial file:
/// a temporary sibling, synced, then renamed over it. A symbolic link is followed (the file it
/// names is replaced, the link stays); a device, FIFO or pipe (/dev/stdout) is written in place,
/// never replaced; "-" is standard output.
Status WriteFileAtomically(const std::string& path, const std::function<bool(std::FILE*)>& fill);

}  // namespace index
}  // namespace tms

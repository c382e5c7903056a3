// Copyright TileMaxSim authors. Writing output files atomically.
#pragma once

#include <cstdio>
#include <functional>
#include <string>

#include "tilemaxsim/status.h"

namespace tms::index {

/// Writes `path` through `fill` (false: a write failed) so that no reader sees a partial file:
/// a temporary sibling, synced, then renamed over it. A symbolic link is followed (the file it
/// names is replaced, the link stays); a device, FIFO or pipe (/dev/stdout) is written in place,
/// never replaced; "-" is standard output.
Status WriteFileAtomically(const std::string& path, const std::function<bool(std::FILE*)>& fill);

}  // namespace tms::index

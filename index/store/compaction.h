// Copyright TileMaxSim authors. Compaction: rewriting an index without its deleted documents.
#pragma once

#include <string>

#include "tilemaxsim/status.h"

namespace tms::index {

/// Rewrites the index without its deleted documents (atomically replacing it).
Status CompactIndex(const std::string& path, bool progress);

}  // namespace tms::index

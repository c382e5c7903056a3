// Copyright TileMaxSim authors. A large memcpy spread over a few short-lived std::threads.
// Used where OpenMP would leave its team spinning next to other busy threads (the staging of
// GPU uploads while an index writer or RocksDB flushes run on the same cores).
#pragma once

#include <cstddef>

namespace tms::kernels {

/// memcpy(dst, src, bytes), split over up to `threads` threads (0: a default of up to 16,
/// never more than the hardware's; small copies run on the calling thread).
void ParallelMemcpy(void* dst, const void* src, size_t bytes, int threads = 0);

/// memcpy(dst, src, bytes) over the calling thread's OpenMP team, in pieces of at least 64 KB:
/// for callers whose team is already running (the search path), where new std::threads would
/// wait behind its spinning threads (milliseconds for a 4 MB query batch).
void TeamMemcpy(void* dst, const void* src, size_t bytes);

}  // namespace tms::kernels

// Copyright TileMaxSim authors. How many OpenMP threads the engine's parallel regions use.
#pragma once

namespace tms::kernels {

/// OpenMP threads for the calling thread's parallel regions from here on: `threads` when > 0,
/// else the environment's (OMP_NUM_THREADS) clamped to kMaxThreads, as the --threads option is
/// (a runtime asked for 100,000 threads fails inside its first parallel region). Cheap: every
/// entry point that may start a parallel region on a caller's thread calls it.
void SetThreads(int threads = 0);

/// Makes BLAS single-threaded: OpenBLAS's pthread build fights OpenMP for the cores (seen: 3x
/// slower PQ training, most of the time in the kernel); the engine parallelises with OpenMP. A
/// no-op for other BLAS.
void SingleThreadedBlas();

}  // namespace tms::kernels

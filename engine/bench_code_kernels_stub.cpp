// Copyright TileMaxSim authors. CPU-only builds: no compressed-kernel benchmark.
#include "engine/bench_code_kernels.h"

namespace tms::engine {

Status RunCodeKernelBench(const std::string&, std::string*, double) {
    return Status::NotSupported("bench kernels: this build has no CUDA");
}

}  // namespace tms::engine

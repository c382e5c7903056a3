// Copyright TileMaxSim authors. CPU-only builds have no kernel benchmark.
#include "engine/bench_kernels.h"

namespace tms::engine {

Status RunKernelBench(const KernelBenchOptions&, std::string*) {
    return Status::NotSupported("bench kernels: this build has no CUDA (rebuild with -DTMS_ENABLE_CUDA=ON on a GPU machine)");
}

}  // namespace tms::engine

// Copyright TileMaxSim authors. `tms bench kernels`: GPU kernel benchmarks (host-only header).
#pragma once

#include <cstdint>
#include <string>

#include "tilemaxsim/status.h"

namespace tms::bench {

struct KernelBenchOptions {
    std::string cases;      // only cases whose names contain this ("" = all)
    bool baseline = true;   // the cuBLAS GEMM + reduce baseline rows
    bool diagnose = false;  // rows that bound each dense exact case (see RunKernelBench)
    bool tma = true;        // false: n_tokens left unknown, so the exact kernel uses per-thread copies
    int64_t docs = 0;       // > 0: the dense exact cases with this many documents instead of the table's B
    int dim = 0;            // > 0: ... and this dimension instead of the table's
    double cooldown = 0;    // idle seconds before each timing (power-cap independence); 0: none
    std::string command = "tms bench kernels";  // the JSON's "command" (the command line that ran)
};

/// Runs the exact-kernel benchmark cases and returns the result JSON. With o.diagnose, each
/// case also gets impl "copy-only" (the same launch without the tensor-core work:
/// maxsim_cuda_copy_only) and, dense cases, "read-same-bytes" (the streaming-read kernel over
/// the case's bytes, launched as often per sample): what the copy pipeline, and what a plain
/// read of that many bytes, reach on this GPU in this run. NotSupported in builds without
/// CUDA or without a device.
/// GPU `device`'s name and the device memory in use on it (every process's), for the search
/// benchmark's record. NotSupported without CUDA or without that device.
#if TMS_WITH_CUDA
Status GpuState(int device, std::string* name, int64_t* used_bytes);
/// Copy bandwidth from pinned host memory to GPU `device`, GB/s (the best of 4 copies of 1 GiB).
Status HostToDeviceBandwidth(int device, double* gb_s);
#else
inline Status GpuState(int, std::string*, int64_t*) { return Status::NotSupported("no CUDA"); }
inline Status HostToDeviceBandwidth(int, double*) { return Status::NotSupported("no CUDA"); }
#endif

#if TMS_WITH_CUDA
Status RunKernelBench(const KernelBenchOptions& o, std::string* json);
/// The compressed (PQ / PLAID residual) kernels' rows to merge into `tms bench kernels`.
Status RunCodeKernelBench(const std::string& filter, std::string* json_rows, double cooldown_s = 0);
#else
inline Status RunKernelBench(const KernelBenchOptions&, std::string*) {
    return Status::NotSupported(
        "bench kernels: this build has no CUDA (rebuild with -DTMS_ENABLE_CUDA=ON on a GPU machine)");
}
inline Status RunCodeKernelBench(const std::string&, std::string*, double = 0) {
    return Status::NotSupported("bench kernels: this build has no CUDA");
}
#endif

}  // namespace tms::bench

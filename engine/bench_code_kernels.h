// Copyright TileMaxSim authors. Compressed (PQ / PLAID residual) MaxSim kernel benchmarks
// (host-only header), rows to merge into `tms bench kernels`.
#pragma once

#include <string>

#include "tilemaxsim/status.h"

namespace tms::engine {

/// Runs the compressed-kernel cases whose names contain `filter` ("" = all), with the read
/// ceiling and the exact fp16 kernel on the same document shapes, and appends one JSON row per
/// measurement ({"case","impl","docs_per_s","gbps","frac_ceiling"}, comma-separated, no
/// enclosing brackets) to *json_rows. NotSupported without CUDA or a device.
/// cooldown_s: idle seconds before each timing, as KernelBenchOptions::cooldown.
Status RunCodeKernelBench(const std::string& filter, std::string* json_rows, double cooldown_s = 0);

}  // namespace tms::engine

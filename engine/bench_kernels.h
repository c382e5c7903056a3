// Copyright TileMaxSim authors. `tms bench kernels`: GPU kernel benchmarks (host-only header).
#pragma once

#include <string>

#include "tilemaxsim/status.h"

namespace tms::engine {

/// Runs the kernel benchmark cases whose names contain `cases_filter` ("" = all) and returns
/// the result JSON. NotSupported in builds without CUDA or without a device.
Status RunKernelBench(const std::string& cases_filter, std::string* json);

}  // namespace tms::engine

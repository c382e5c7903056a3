// Copyright TileMaxSim authors. A GPU's memory as the CUDA driver reports it.
#pragma once

#include <cstdint>

#include "tilemaxsim/status.h"

namespace tms::kernels {

/// Free and total memory of GPU `device` (cudaMemGetInfo; total_bytes may be null), the current
/// device left as it was. NotSupported for a device that cannot be selected.
Status cuda_memory_info(int device, int64_t* free_bytes, int64_t* total_bytes);

}  // namespace tms::kernels

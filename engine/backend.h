// Copyright TileMaxSim authors. Backend choice at run time (the one place that knows whether
// this build has CUDA).
#pragma once

#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

#include <memory>

namespace tms::kernels {
class GpuContext;
}

namespace tms::engine {

/// Resolve kAuto to kGpu when this build has CUDA and a device is present, else kCpu.
/// Asking for kGpu without CUDA or without a device is NotSupported, with the reason.
Status ResolveDevice(Device requested, Device* resolved);

/// The context of GPU `device` (kernels::GpuContext); NotSupported in a build without CUDA.
Status MakeGpuContext(int device, std::shared_ptr<kernels::GpuContext>* out);

}  // namespace tms::engine

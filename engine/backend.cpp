// Copyright TileMaxSim authors.
#include "engine/backend.h"

#include "engine/gpu_scorer.h"

namespace tms::engine {

Status ResolveDevice(Device requested, Device* resolved) {
#if TMS_WITH_CUDA
    int n = 0;
    TMS_RETURN_IF_ERROR(GpuDeviceCount(&n));
    if (requested == Device::kGpu && n == 0) {
        return Status::NotSupported("device gpu: no CUDA device is visible (use --device cpu or auto)");
    }
    *resolved = (requested == Device::kCpu || n == 0) ? Device::kCpu : Device::kGpu;
#else
    if (requested == Device::kGpu) {
        return Status::NotSupported("device gpu: this build has no CUDA (rebuild with -DTMS_ENABLE_CUDA=ON)");
    }
    *resolved = Device::kCpu;
#endif
    return Status::OK();
}

}  // namespace tms::engine

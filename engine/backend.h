// Copyright TileMaxSim authors. Backend choice at run time: the one place that knows whether
// this build has CUDA (every GPU object the engine uses is made here).
#pragma once

#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

#include <memory>
#include <vector>

#include "index/index_data.h"

namespace tms::kernels {
class GpuContext;
}

namespace tms::engine {

/// Resolve kAuto to kGpu when this build has CUDA and a device is present, else kCpu.
/// Asking for kGpu without CUDA or without a device is NotSupported, with the reason.
Status ResolveDevice(Device requested, Device* resolved);

/// Number of CUDA devices; 0 without CUDA, a driver or a device (never an error).
Status GpuDeviceCount(int* n);

/// Free memory of GPU `device`; NotSupported without CUDA.
Status GpuFreeMemory(int device, int64_t* free_bytes);

/// The context of GPU `device` (kernels::GpuContext); NotSupported in a build without CUDA.
Status MakeGpuContext(int device, std::shared_ptr<kernels::GpuContext>* out);

class GpuShard;
class VectorRows;
/// Shard `d` uploaded to the GPU of `ctx` (engine/gpu_shard.h), its vectors d's own, else
/// `vector_parts` in order, else (non-null and not empty) read from `file_rows` while they
/// upload; NotSupported without CUDA.
Status MakeGpuShard(std::shared_ptr<kernels::GpuContext> ctx, const index::IndexData& d,
                    const std::vector<index::PodVector<uint16_t>>& vector_parts, const VectorRows* file_rows,
                    std::unique_ptr<GpuShard>* out);

}  // namespace tms::engine

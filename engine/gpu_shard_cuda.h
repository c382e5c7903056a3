// Copyright TileMaxSim authors. The CUDA implementation's factory of GpuShard: called only by
// engine/backend.cpp, in CUDA builds (the one place that knows whether this build has CUDA).
#pragma once

#include <memory>

#include "engine/gpu_shard.h"
#include "index/index_data.h"

namespace tms::kernels {
class GpuContext;
}

namespace tms::engine {

class VectorRows;

/// The shard's codes, IVF lists and (when loaded) vectors uploaded to the GPU of `ctx`: d's own
/// vectors, else `vector_parts` in order (ConcatShards' parts of a device's shards), else
/// `file_rows` (the vectors files, read while they upload).
Status CreateCudaShard(std::shared_ptr<kernels::GpuContext> ctx, const index::IndexData& d,
                       const std::vector<index::PodVector<uint16_t>>& vector_parts, const VectorRows* file_rows,
                       std::unique_ptr<GpuShard>* out);

}  // namespace tms::engine

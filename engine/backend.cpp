// Copyright TileMaxSim authors.
#include "engine/backend.h"

#include <algorithm>
#include <string>

#include "kernels/cuda/gpu_context.h"
#if TMS_WITH_CUDA
#include "engine/gpu_shard_cuda.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/maxsim_cuda.h"
#endif
#include "tilemaxsim/options.h"
#include "tilemaxsim/searcher.h"

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

Status GpuDeviceCount(int* n) {
#if TMS_WITH_CUDA
    return kernels::cuda_device_count(n);
#else
    *n = 0;
    return Status::OK();
#endif
}

Status GpuFreeMemory(int device, int64_t* free_bytes) {
#if TMS_WITH_CUDA
    return kernels::cuda_free_memory(device, free_bytes);
#else
    (void)device;
    *free_bytes = 0;
    return Status::NotSupported("this build has no CUDA");
#endif
}

}  // namespace tms::engine

namespace tms {

Status GetGpuMemory(int gpu, GpuMemory* out) {
    out->gpu = gpu;
#if TMS_WITH_CUDA
    return kernels::cuda_memory_info(gpu, &out->free_bytes, &out->total_bytes);
#else
    return Status::NotSupported("this build has no CUDA");
#endif
}

}  // namespace tms

namespace tms::engine {

Status MakeGpuShard(std::shared_ptr<kernels::GpuContext> ctx, const index::IndexData& d,
                    const std::vector<index::PodVector<uint16_t>>& vector_parts, const VectorRows* file_rows,
                    std::unique_ptr<GpuShard>* out) {
#if TMS_WITH_CUDA
    return CreateCudaShard(std::move(ctx), d, vector_parts, file_rows, out);
#else
    (void)ctx;
    (void)d;
    (void)vector_parts;
    (void)file_rows;
    (void)out;
    return Status::NotSupported("this build has no CUDA (rebuild with -DTMS_ENABLE_CUDA=ON)");
#endif
}

Status MakeGpuContext(int device, std::shared_ptr<kernels::GpuContext>* out) {
#if TMS_WITH_CUDA
    return kernels::GpuContext::Create(device, out);
#else
    (void)device;
    (void)out;
    return Status::NotSupported("GPU " + std::to_string(device) +
                                ": this build has no CUDA (rebuild with -DTMS_ENABLE_CUDA=ON)");
#endif
}

}  // namespace tms::engine

namespace tms {

Status ParseVectorTier(const std::string& word, VectorTier* out) {
    for (VectorTier t :
         {VectorTier::kAuto, VectorTier::kGpu, VectorTier::kHost, VectorTier::kDisk, VectorTier::kNone}) {
        if (word == VectorTierName(t)) {
            *out = t;
            return Status::OK();
        }
    }
    return Status::InvalidArgument("vectors '" + word + "': expected auto, gpu, host, disk or none");
}

Status ParseDeviceList(const std::string& list, SearcherOptions* opts) {
    opts->gpus.clear();
    if (list == "auto")
        opts->device = Device::kAuto;
    else if (list == "cpu")
        opts->device = Device::kCpu;
    else if (list == "gpu" || list == "all")
        opts->device = Device::kGpu;
    else {
        opts->device = Device::kGpu;
        size_t p = 0;
        while (p <= list.size()) {
            const size_t e = std::min(list.find(',', p), list.size());
            const std::string t = list.substr(p, e - p);
            if (t.empty() || t.size() > 4 || t.find_first_not_of("0123456789") != std::string::npos) {
                return Status::InvalidArgument("devices '" + list +
                                               "': expected cpu, gpu, all, auto or GPU numbers like 0,1");
            }
            const int g = std::stoi(t);
            if (std::find(opts->gpus.begin(), opts->gpus.end(), g) != opts->gpus.end()) {
                return Status::InvalidArgument("devices '" + list + "': GPU " + t + " is listed twice");
            }
            opts->gpus.push_back(g);
            p = e + 1;
        }
    }
    return Status::OK();
}

}  // namespace tms

// Copyright TileMaxSim authors. See launch_cache.h.
#include "kernels/cuda/launch_cache.h"

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "kernels/cuda/cuda_check.h"

namespace tms::kernels::launch_cache {
namespace {

std::mutex g_mu;
std::map<int, DeviceFacts> g_devices;
std::map<std::pair<int, const void*>, size_t> g_smem_limit;            // (device, kernel) -> bytes set
std::map<std::tuple<int, const void*, int, size_t>, int> g_occupancy;  // (device, kernel, threads, smem)

}  // namespace

Status current_device(DeviceFacts* facts) {
    int dev = 0;
    TMS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
    {
        std::lock_guard<std::mutex> lock(g_mu);
        const auto it = g_devices.find(dev);
        if (it != g_devices.end()) {
            *facts = it->second;
            return Status::OK();
        }
    }
    DeviceFacts f;
    f.device = dev;
    TMS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&f.sms, cudaDevAttrMultiProcessorCount, dev));
    TMS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&f.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    TMS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&f.smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    TMS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&f.smem_reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev));
    TMS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&f.cc_major, cudaDevAttrComputeCapabilityMajor, dev));
    TMS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&f.cc_minor, cudaDevAttrComputeCapabilityMinor, dev));
    std::lock_guard<std::mutex> lock(g_mu);
    g_devices[dev] = f;
    *facts = f;
    return Status::OK();
}

Status ensure_smem(const void* kernel, size_t smem_bytes) {
    int dev = 0;
    TMS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
    std::lock_guard<std::mutex> lock(g_mu);
    size_t& set = g_smem_limit[{dev, kernel}];
    if (smem_bytes > set) {
        TMS_CUDA_RETURN_IF_ERROR(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes)));
        set = smem_bytes;
    }
    return Status::OK();
}

Status occupancy(const void* kernel, int threads, size_t smem_bytes, int* blocks_per_sm) {
    TMS_RETURN_IF_ERROR(ensure_smem(kernel, smem_bytes));
    int dev = 0;
    TMS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
    const auto key = std::make_tuple(dev, kernel, threads, smem_bytes);
    {
        std::lock_guard<std::mutex> lock(g_mu);
        const auto it = g_occupancy.find(key);
        if (it != g_occupancy.end()) {
            *blocks_per_sm = it->second;
            return Status::OK();
        }
    }
    int blocks = 0;
    TMS_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem_bytes));
    std::lock_guard<std::mutex> lock(g_mu);
    g_occupancy[key] = blocks;
    *blocks_per_sm = blocks;
    return Status::OK();
}

}  // namespace tms::kernels::launch_cache

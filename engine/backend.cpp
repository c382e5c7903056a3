// Copyright TileMaxSim authors.
#include "engine/backend.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "kernels/cuda/gpu_context.h"
#if TMS_WITH_CUDA
#include "engine/gpu_shard_cuda.h"
#include "kernels/cuda/maxsim_cuda.h"
#endif
#include "tilemaxsim/options.h"

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

namespace {

// The first integer in `file` (-1 when it is missing or holds none, e.g. cgroup v2's "max").
int64_t read_number(const char* file) {
    long long v = -1;
    if (std::FILE* f = std::fopen(file, "r")) {
        if (std::fscanf(f, "%lld", &v) != 1) v = -1;
        std::fclose(f);
    }
    return v;
}

// `key` of a /proc file such as "MemAvailable:" or "VmSize:", in bytes (-1 when absent).
int64_t proc_kb(const char* file, const char* key) {
    long long kb = -1;
    if (std::FILE* f = std::fopen(file, "r")) {
        char line[256];
        const size_t n = std::strlen(key);
        while (std::fgets(line, sizeof line, f)) {
            if (std::strncmp(line, key, n) == 0 && std::sscanf(line + n, "%lld", &kb) == 1) break;
        }
        std::fclose(f);
    }
    return kb < 0 ? -1 : int64_t(kb) * 1024;
}

}  // namespace

int64_t HostAvailableMemory() {
    int64_t avail = proc_kb("/proc/meminfo", "MemAvailable:");
    if (avail < 0) avail = int64_t(sysconf(_SC_AVPHYS_PAGES)) * int64_t(sysconf(_SC_PAGESIZE));
    // A container's memory limit (cgroup v2, else v1): what it leaves the processes in it.
    int64_t limit = read_number("/sys/fs/cgroup/memory.max"), used = read_number("/sys/fs/cgroup/memory.current");
    if (limit < 0) {
        limit = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
        used = read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes");
    }
    if (limit > 0 && used >= 0 && limit < (int64_t(1) << 60)) avail = std::min(avail, std::max<int64_t>(0, limit - used));
    return std::min(avail, AddressSpaceRoom());
}

int64_t AddressSpaceRoom() {
    struct rlimit as {};
    if (::getrlimit(RLIMIT_AS, &as) != 0 || as.rlim_cur == RLIM_INFINITY) return INT64_MAX;
    const int64_t mapped = proc_kb("/proc/self/status", "VmSize:");
    return mapped < 0 ? INT64_MAX : std::max<int64_t>(0, int64_t(as.rlim_cur) - mapped);
}

Status MakeGpuShard(std::shared_ptr<kernels::GpuContext> ctx, const index::IndexData& d,
                    const std::vector<index::PodVector<uint16_t>>& vector_parts, std::unique_ptr<GpuShard>* out) {
#if TMS_WITH_CUDA
    return CreateCudaShard(std::move(ctx), d, vector_parts, out);
#else
    (void)ctx;
    (void)d;
    (void)vector_parts;
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
    return Status::NotSupported("GPU " + std::to_string(device) + ": this build has no CUDA (rebuild with -DTMS_ENABLE_CUDA=ON)");
#endif
}

}  // namespace tms::engine

namespace tms {

Status ParseVectorTier(const std::string& word, VectorTier* out) {
    for (VectorTier t : {VectorTier::kAuto, VectorTier::kGpu, VectorTier::kHost, VectorTier::kDisk, VectorTier::kNone}) {
        if (word == VectorTierName(t)) {
            *out = t;
            return Status::OK();
        }
    }
    return Status::InvalidArgument("vectors '" + word + "': expected auto, gpu, host, disk or none");
}

Status ParseDeviceList(const std::string& list, SearcherOptions* opts) {
    opts->gpus.clear();
    if (list == "auto") opts->device = Device::kAuto;
    else if (list == "cpu") opts->device = Device::kCpu;
    else if (list == "gpu" || list == "all") opts->device = Device::kGpu;
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

// Copyright TileMaxSim authors. What the GPU kernel benchmarks share (device code; included by
// bench_kernels.cu and bench_code_kernels.cu only): the hash that generates data on the device,
// the streaming-read ceiling, device buffers, the median-of-samples timer and the JSON rows.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/maxsim_cuda.h"
#include "tilemaxsim/status.h"

namespace tms::bench::bench {

constexpr int kSamples = 15;             // timing samples; the median is reported
constexpr double kWarmupSeconds = 0.25;  // minimum warm-up before the samples of one timing

/// Idle seconds before each timing (`tms bench kernels --cooldown`; 0: none). The H200's power
/// cap limits average power: a timing right after heavy ones can run at lower clocks than the
/// same one alone, so a pause makes each row independent of the rows before it.
inline double& cooldown_seconds() {
    static double s = 0;
    return s;
}

/// A 32-bit hash of element i (murmur-like finalizer): deterministic random data.
__device__ __forceinline__ uint32_t mix(uint64_t i, uint32_t seed) {
    uint32_t h = uint32_t(i) * 0x9E3779B1u ^ uint32_t(i >> 32) * 0x85EBCA77u ^ seed;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    h *= 0x297A2D39u;
    h ^= h >> 15;
    return h;
}

/// Streaming read: 4 independent 16-byte loads per thread per iteration, XOR-folded.
__global__ inline void read_ceiling_kernel(const uint4* p, int64_t n_vec, uint32_t* sink) {
    uint32_t acc = 0;
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    for (; i + 3 * stride < n_vec; i += 4 * stride) {
        uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride),
              d = __ldcs(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n_vec; i += stride) {
        uint4 a = __ldcs(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == 0x12345678u) sink[0] = acc;  // keeps the loads alive
}

__global__ inline void fill_words(uint32_t* p, int64_t n, uint32_t seed) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        p[i] = mix(uint64_t(i), seed);
}

/// A device buffer freed on scope exit.
template <typename T>
struct Dev {
    T* p = nullptr;
    ~Dev() { cudaFree(p); }
    Status alloc(size_t n) {
        TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
        return Status::OK();
    }
};

/// Per-query top-k results and the workspace that produces them, on the device.
struct TopKBuffers {
    Dev<unsigned char> ws;
    Dev<int32_t> ids;
    Dev<float> scores;
    size_t ws_bytes = 0;
    Status alloc(size_t workspace_bytes, int n_queries, int k) {
        ws_bytes = workspace_bytes;
        TMS_RETURN_IF_ERROR(ws.alloc(workspace_bytes));
        TMS_RETURN_IF_ERROR(ids.alloc(size_t(n_queries) * k));
        return scores.alloc(size_t(n_queries) * k);
    }
};

/// Copies candidate lists (offsets [n_queries + 1], document ids) to the device.
inline Status upload_candidates(const std::vector<int64_t>& offs, const std::vector<int32_t>& docs,
                                Dev<int64_t>* d_offs, Dev<int32_t>* d_docs) {
    TMS_RETURN_IF_ERROR(d_offs->alloc(offs.size()));
    TMS_RETURN_IF_ERROR(d_docs->alloc(docs.size()));
    TMS_CUDA_RETURN_IF_ERROR(cudaMemcpy(d_offs->p, offs.data(), offs.size() * 8, cudaMemcpyHostToDevice));
    TMS_CUDA_RETURN_IF_ERROR(cudaMemcpy(d_docs->p, docs.data(), docs.size() * 4, cudaMemcpyHostToDevice));
    return Status::OK();
}

/// Launches the streaming-read kernel over `bytes` bytes at p (a multiple of 16), with the
/// launch shape the read ceiling is measured with.
inline Status launch_read(const cudaDeviceProp& prop, const void* p, size_t bytes, uint32_t* sink) {
    read_ceiling_kernel<<<prop.multiProcessorCount * 8, 512>>>(static_cast<const uint4*>(p), int64_t(bytes / 16), sink);
    TMS_CUDA_CHECK_LAUNCH();
    return Status::OK();
}

struct Timer {
    cudaEvent_t a = nullptr, b = nullptr;
    Timer() {
        cudaEventCreate(&a);
        cudaEventCreate(&b);
    }
    ~Timer() {
        cudaEventDestroy(a);
        cudaEventDestroy(b);
    }
    /// Median seconds per call of fn(i) over kSamples samples of `per_sample` calls, after a
    /// warm-up of at least two calls and kWarmupSeconds: an idle GPU runs at low clocks and
    /// takes a while to reach its working clocks, so a short warm-up times the ramp. First
    /// cooldown_seconds() of idle.
    Status median(int per_sample, const std::function<Status(int)>& fn, double* sec) {
        if (cooldown_seconds() > 0) {
            TMS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
            std::this_thread::sleep_for(std::chrono::duration<double>(cooldown_seconds()));
        }
        const auto t0 = std::chrono::steady_clock::now();
        for (int w = 0;; ++w) {
            TMS_RETURN_IF_ERROR(fn(w));
            if (w < 1) continue;
            TMS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
            if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= kWarmupSeconds) break;
        }
        std::vector<double> t;
        int call = 0;
        for (int s = 0; s < kSamples; ++s) {
            TMS_CUDA_RETURN_IF_ERROR(cudaEventRecord(a));
            for (int i = 0; i < per_sample; ++i) TMS_RETURN_IF_ERROR(fn(call++));
            TMS_CUDA_RETURN_IF_ERROR(cudaEventRecord(b));
            TMS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(b));
            float ms = 0;
            TMS_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, a, b));
            t.push_back(ms * 1e-3 / per_sample);
        }
        std::sort(t.begin(), t.end());
        *sec = t[t.size() / 2];
        return Status::OK();
    }
};

/// The device's read ceiling in GB/s: 8 GiB streamed with 16-byte loads, median of kSamples.
inline Status read_ceiling_gbps(const cudaDeviceProp& prop, double* gbps) {
    const size_t bytes = size_t(8) << 30;
    Dev<uint4> buf;
    Dev<uint32_t> sink;
    TMS_RETURN_IF_ERROR(buf.alloc(bytes / 16));
    TMS_RETURN_IF_ERROR(sink.alloc(1));
    fill_words<<<4096, 256>>>(reinterpret_cast<uint32_t*>(buf.p), int64_t(bytes / 4), 3);
    TMS_CUDA_CHECK_LAUNCH();
    Timer timer;
    double sec = 0;
    TMS_RETURN_IF_ERROR(timer.median(
        3, [&](int) { return launch_read(prop, buf.p, bytes, sink.p); }, &sec));
    *gbps = double(bytes) / sec * 1e-9;
    std::fprintf(stderr, "read ceiling: %.1f GB/s (%s)\n", *gbps, prop.name);
    return Status::OK();
}

/// The current device's properties and read ceiling (NotSupported without a device): what
/// every kernel benchmark measures first.
inline Status device_and_ceiling(cudaDeviceProp* prop, double* ceiling_gbps) {
    int n_dev = 0;
    TMS_RETURN_IF_ERROR(kernels::cuda_device_count(&n_dev));
    if (n_dev == 0) return Status::NotSupported("bench kernels: no CUDA device");
    int dev = 0;
    TMS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
    TMS_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(prop, dev));
    return read_ceiling_gbps(*prop, ceiling_gbps);
}

inline std::string fmt(double x) {
    char b[64];
    std::snprintf(b, sizeof b, "%.6g", x);
    return b;
}

/// One JSON row of the kernels result file.
inline std::string row(const std::string& c, const std::string& impl, double docs_s, double gbps, double ceil) {
    return "{\"case\":\"" + c + "\",\"impl\":\"" + impl + "\",\"docs_per_s\":" + fmt(docs_s) +
           ",\"gbps\":" + fmt(gbps) + ",\"frac_ceiling\":" + fmt(gbps / ceil) + "}";
}

}  // namespace tms::bench::bench

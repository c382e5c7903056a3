// Copyright TileMaxSim authors. Helpers shared by the CUDA kernel tests (ctest label gpu).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/gpu_context.h"
#include "kernels/cuda/maxsim_cuda.h"
#include "kernels/cuda/pdl.cuh"

/// Skips the test where no CUDA device is present (the gpu tests run but pass on CPU machines).
#define SKIP_WITHOUT_GPU()                                    \
    do {                                                      \
        int n_dev = 0;                                        \
        ASSERT_TRUE(kernels::cuda_device_count(&n_dev).ok()); \
        if (n_dev == 0) GTEST_SKIP() << "no CUDA device";     \
    } while (0)

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

namespace tms::test {

/// A fresh context of GPU `device` (scorers under test each get their own unless a test shares one).
inline std::shared_ptr<kernels::GpuContext> TestGpuContext(int device = 0) {
    std::shared_ptr<kernels::GpuContext> c;
    if (!kernels::GpuContext::Create(device, &c).ok()) return nullptr;
    return c;
}

/// A device copy of a host vector (at least one element, so empty arrays are non-null).
template <typename T>
struct DevBuf {
    T* d = nullptr;
    size_t n = 0;
    explicit DevBuf(const std::vector<T>& h) : n(h.size()) {
        EXPECT_EQ(cudaMalloc(&d, std::max<size_t>(1, n) * sizeof(T)), cudaSuccess);
        if (n) EXPECT_EQ(cudaMemcpy(d, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
    explicit DevBuf(size_t count) : n(count) {
        EXPECT_EQ(cudaMalloc(&d, std::max<size_t>(1, n) * sizeof(T)), cudaSuccess);
    }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;
    ~DevBuf() { cudaFree(d); }
    std::vector<T> get() const {
        std::vector<T> h(n);
        if (n) EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
        return h;
    }
};

/// Copies src to dst after `delay` cycles, having let the stream's next programmatic dependent
/// launch start first (as the MaxSim kernels do): a dependent that read its inputs before
/// griddepcontrol.wait would see dst's old contents.
static __global__ void late_copy(uint32_t* dst_a, const uint32_t* src_a, int64_t n_a, uint32_t* dst_b,
                                 const uint32_t* src_b, int64_t n_b, long long delay) {
    kernels::pdl::trigger_dependents();
    const long long t0 = clock64();
    while (clock64() - t0 < delay) {}
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_a; i += stride) dst_a[i] = src_a[i];
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_b; i += stride) dst_b[i] = src_b[i];
}

/// Checks that a call reads the inputs the stream's previous kernel writes (programmatic
/// dependent launches). late_in(r, stream) copies input set r % 2 into the call's inputs
/// (late_copy launches); call(r, out, stream) enqueues the call (n outputs). First the reference:
/// each set copied in, the device synchronised, then scored, synchronised (the inputs then hold
/// set 1). Then `rounds` rounds on one stream, each copy followed at once by the call; round r's
/// outputs must equal set r % 2's reference, bit for bit (round 0 copies set 0 over set 1, so a
/// call that read early would see the other set).
inline void expect_reads_late_inputs(size_t n, int rounds, const std::function<void(int, cudaStream_t)>& late_in,
                                     const std::function<Status(int, float*, cudaStream_t)>& call) {
    std::vector<std::vector<float>> want;
    for (int set = 0; set < 2; ++set) {
        DevBuf<float> out(n);
        late_in(set, nullptr);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaDeviceSynchronize());
        const Status s = call(set, out.d, nullptr);
        ASSERT_TRUE(s.ok()) << s.ToString();
        CUDA_OK(cudaDeviceSynchronize());
        want.push_back(out.get());
    }
    ASSERT_NE(want[0], want[1]);
    cudaStream_t st = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    std::vector<std::unique_ptr<DevBuf<float>>> outs;
    for (int r = 0; r < rounds; ++r) {
        outs.push_back(std::make_unique<DevBuf<float>>(n));
        late_in(r, st);
        CUDA_OK(cudaGetLastError());
        const Status s = call(r, outs.back()->d, st);
        ASSERT_TRUE(s.ok()) << s.ToString();
    }
    CUDA_OK(cudaStreamSynchronize(st));
    CUDA_OK(cudaStreamDestroy(st));
    for (int r = 0; r < rounds; ++r) {
        SCOPED_TRACE("round " + std::to_string(r));
        ASSERT_EQ(outs[size_t(r)]->get(), want[size_t(r % 2)]);
    }
}

}  // namespace tms::test

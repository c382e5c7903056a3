// Copyright TileMaxSim authors. Helpers shared by the CUDA kernel tests (ctest label gpu).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda/maxsim_cuda.h"

/// Skips the test where no CUDA device is present (the gpu tests run but pass on CPU machines).
#define SKIP_WITHOUT_GPU()                                    \
    do {                                                      \
        int n_dev = 0;                                        \
        ASSERT_TRUE(kernels::cuda_device_count(&n_dev).ok()); \
        if (n_dev == 0) GTEST_SKIP() << "no CUDA device";     \
    } while (0)

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

namespace tms::test {

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

}  // namespace tms::test

// Copyright TileMaxSim authors.
// CUDA / cuBLAS error translation (device code and .cu files only). One generic macro,
// TMS_GPU_RETURN_IF_ERROR_GEN, builds both TMS_CUDA_RETURN_IF_ERROR and
// TMS_CUBLAS_RETURN_IF_ERROR (as ggml's CUDA_CHECK_GEN). Out-of-memory becomes
// ResourceExhausted; every other failure Internal, with file:line and the device id.
// Sticky (context-corrupting) errors abort with the device id: nothing can recover them.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tilemaxsim/status.h"

namespace tms::cuda_detail {

inline int current_device() {
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) return -1;
    return dev;
}

inline bool is_oom(cudaError_t e) { return e == cudaErrorMemoryAllocation; }
inline bool is_oom(cublasStatus_t e) { return e == CUBLAS_STATUS_ALLOC_FAILED; }
inline bool is_ok(cudaError_t e) { return e == cudaSuccess; }
inline bool is_ok(cublasStatus_t e) { return e == CUBLAS_STATUS_SUCCESS; }
inline const char* err_name(cudaError_t e) { return cudaGetErrorString(e); }
inline const char* err_name(cublasStatus_t e) { return cublasGetStatusString(e); }

/// Errors after which the CUDA context is unusable (ggml_cuda_error aborts on these too).
inline bool is_sticky(cudaError_t e) {
    return e == cudaErrorIllegalAddress || e == cudaErrorLaunchFailure || e == cudaErrorHardwareStackError ||
           e == cudaErrorIllegalInstruction || e == cudaErrorMisalignedAddress || e == cudaErrorInvalidAddressSpace ||
           e == cudaErrorInvalidPc || e == cudaErrorAssert;
}
inline bool is_sticky(cublasStatus_t) { return false; }
/// A failed runtime call also stays in the thread's last-error slot, where the next launch
/// check (cudaPeekAtLastError) would report it again: the error is returned, then cleared.
inline void clear_error(cudaError_t) { (void)cudaGetLastError(); }
inline void clear_error(cublasStatus_t) {}

template <typename E>
Status to_status(E e, const char* expr, const char* file, int line) {
    const int dev = current_device();
    if (is_sticky(e)) {
        std::fprintf(stderr, "tilemaxsim: fatal CUDA error '%s' on device %d at %s:%d: %s\n", err_name(e), dev, file,
                     line, expr);
        std::abort();
    }
    clear_error(e);
    std::string msg = std::string(expr) + " failed on device " + std::to_string(dev) + " (" + file + ":" +
                      std::to_string(line) + "): " + err_name(e);
    if (is_oom(e)) return Status::ResourceExhausted(msg);
    return Status::Internal(msg);
}

}  // namespace tms::cuda_detail

/// Generic: evaluate a call returning an error code of a GPU library; return a Status on failure.
#define TMS_GPU_RETURN_IF_ERROR_GEN(expr)                                            \
    do {                                                                             \
        auto _tms_e = (expr);                                                        \
        if (!::tms::cuda_detail::is_ok(_tms_e)) {                                    \
            return ::tms::cuda_detail::to_status(_tms_e, #expr, __FILE__, __LINE__); \
        }                                                                            \
    } while (0)

#define TMS_CUDA_RETURN_IF_ERROR(expr) TMS_GPU_RETURN_IF_ERROR_GEN(static_cast<cudaError_t>(expr))
#define TMS_CUBLAS_RETURN_IF_ERROR(expr) TMS_GPU_RETURN_IF_ERROR_GEN(static_cast<cublasStatus_t>(expr))

/// After every <<<>>>: launch-configuration errors always; with TMS_CUDA_SYNC_CHECK also
/// execution errors (synchronizes the device; debugging only, not graph-capturable).
#if defined(TMS_CUDA_SYNC_CHECK) && TMS_CUDA_SYNC_CHECK
#define TMS_CUDA_CHECK_LAUNCH()                            \
    do {                                                   \
        TMS_CUDA_RETURN_IF_ERROR(cudaPeekAtLastError());   \
        TMS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize()); \
    } while (0)
#else
#define TMS_CUDA_CHECK_LAUNCH() TMS_CUDA_RETURN_IF_ERROR(cudaPeekAtLastError())
#endif

namespace tms::kernels {

/// Makes `device` current for a scope and restores the previous one.
class DeviceGuard {
public:
    explicit DeviceGuard(int device) {
        if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
        ok_ = cudaSetDevice(device) == cudaSuccess;
    }
    ~DeviceGuard() {
        if (prev_ >= 0) (void)cudaSetDevice(prev_);
    }
    DeviceGuard(const DeviceGuard&) = delete;
    DeviceGuard& operator=(const DeviceGuard&) = delete;
    bool ok() const { return ok_; }

private:
    int prev_ = -1;
    bool ok_ = false;
};

/// Device memory for per-call scratch that grows and never shrinks (the GPU scorers' arenas).
/// Growing waits for `stream` (the old block may still be in use), frees it and allocates
/// max(bytes, 256), or with `headroom` at least 1.5x the old size (batches that vary in size
/// then reallocate rarely). Free() under the owner's device; the destructor frees what is left.
struct DeviceScratch {
    void* p = nullptr;
    size_t cap = 0;
    DeviceScratch() = default;
    DeviceScratch(const DeviceScratch&) = delete;
    DeviceScratch& operator=(const DeviceScratch&) = delete;
    ~DeviceScratch() { Free(); }
    void Free() {
        cudaFree(p);
        p = nullptr;
        cap = 0;
    }
    Status Reserve(size_t bytes, cudaStream_t stream, bool headroom = false) {
        if (bytes <= cap) return Status::OK();
        TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
        size_t grown = headroom ? std::max(bytes, cap + cap / 2) : bytes;
        grown = std::max<size_t>(grown, 256);
        TMS_CUDA_RETURN_IF_ERROR(cudaFree(p));
        p = nullptr;
        cap = 0;
        TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, grown));
        cap = grown;
        return Status::OK();
    }
};

/// Bytes rounded up to 256 (the alignment of every workspace and arena slice).
inline size_t align256(size_t b) { return (b + 255) / 256 * 256; }

}  // namespace tms::kernels

// Copyright TileMaxSim authors. GPU nearest-centroid assignment: cuBLAS GEMM + row argmax.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>

#include "index/gpu_assign.h"
#include "kernels/cuda/cuda_check.h"

namespace tms::index {
namespace {

// Grid: one warp per row of the score tile [rows, K]; block: 8 warps (8 rows). Each lane scans
// K/32 columns (coalesced), then a warp shuffle reduction keeps (max score, lower index).
__global__ void row_argmax(const float* __restrict__ s, int rows, int K, uint32_t* __restrict__ labels,
                           float* __restrict__ best) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float* r = s + size_t(row) * K;
    float bv = -FLT_MAX;
    int bi = 0x7fffffff;
    for (int k = lane; k < K; k += 32) {
        const float v = r[k];
        if (v > bv) {  // k increases within a lane: strict > keeps the lower index on ties
            bv = v;
            bi = k;
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_down_sync(0xffffffffu, bv, off);
        const int oi = __shfl_down_sync(0xffffffffu, bi, off);
        if (ov > bv || (ov == bv && oi < bi)) {
            bv = ov;
            bi = oi;
        }
    }
    if (lane == 0) {
        labels[row] = static_cast<uint32_t>(bi);
        if (best) best[row] = bv;
    }
}

}  // namespace

struct GpuAssigner::Impl {
    int device = 0;
    cudaStream_t stream = nullptr;
    cublasHandle_t blas = nullptr;
    float* d_c = nullptr;
    size_t c_cap = 0;
    int K = 0, dim = 0;
    float *d_x = nullptr, *d_s = nullptr, *d_best = nullptr;
    uint32_t* d_labels = nullptr;
    int64_t rows_cap = 0;
    ~Impl() {
        cudaSetDevice(device);
        cudaFree(d_c);
        cudaFree(d_x);
        cudaFree(d_s);
        cudaFree(d_best);
        cudaFree(d_labels);
        if (blas) cublasDestroy(blas);
        if (stream) cudaStreamDestroy(stream);
    }
};

GpuAssigner::GpuAssigner() : impl_(std::make_unique<Impl>()) {}
GpuAssigner::~GpuAssigner() = default;

Status GpuAssigner::Create(int device, std::unique_ptr<GpuAssigner>* out) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n <= device) {
        (void)cudaGetLastError();
        return Status::NotSupported("no CUDA device for GPU assignment");
    }
    std::unique_ptr<GpuAssigner> a(new GpuAssigner());
    a->impl_->device = device;
    TMS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    TMS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&a->impl_->stream, cudaStreamNonBlocking));
    TMS_CUBLAS_RETURN_IF_ERROR(cublasCreate(&a->impl_->blas));
    TMS_CUBLAS_RETURN_IF_ERROR(cublasSetStream(a->impl_->blas, a->impl_->stream));
    TMS_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(a->impl_->blas, CUBLAS_TF32_TENSOR_OP_MATH));
    *out = std::move(a);
    return Status::OK();
}

Status GpuAssigner::SetCentroids(const float* h_c, int K, int dim) {
    Impl& im = *impl_;
    TMS_CUDA_RETURN_IF_ERROR(cudaSetDevice(im.device));
    const size_t bytes = size_t(K) * dim * sizeof(float);
    if (bytes > im.c_cap) {
        TMS_CUDA_RETURN_IF_ERROR(cudaFree(im.d_c));
        im.d_c = nullptr;
        TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.d_c, bytes));
        im.c_cap = bytes;
    }
    TMS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(im.d_c, h_c, bytes, cudaMemcpyHostToDevice, im.stream));
    if (K != im.K) im.rows_cap = 0;  // score tile shape changes
    im.K = K;
    im.dim = dim;
    return Status::OK();
}

Status GpuAssigner::Assign(const float* h_x, int64_t n, uint32_t* h_labels, float* h_best) {
    Impl& im = *impl_;
    if (im.K == 0) return Status::InvalidArgument("GpuAssigner: no centroids");
    TMS_CUDA_RETURN_IF_ERROR(cudaSetDevice(im.device));
    // Rows per pass: the score tile stays under 1 GB.
    const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(65536, (int64_t(1) << 28) / im.K));
    if (im.rows_cap < rows) {
        cudaFree(im.d_x);
        cudaFree(im.d_s);
        cudaFree(im.d_best);
        cudaFree(im.d_labels);
        im.d_x = im.d_s = im.d_best = nullptr;
        im.d_labels = nullptr;
        TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.d_x, size_t(rows) * im.dim * sizeof(float)));
        TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.d_s, size_t(rows) * im.K * sizeof(float)));
        TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.d_best, size_t(rows) * sizeof(float)));
        TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.d_labels, size_t(rows) * sizeof(uint32_t)));
        im.rows_cap = rows;
    }
    for (int64_t r0 = 0; r0 < n; r0 += rows) {
        const int nr = static_cast<int>(std::min<int64_t>(rows, n - r0));
        TMS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(im.d_x, h_x + r0 * im.dim, size_t(nr) * im.dim * sizeof(float),
                                                 cudaMemcpyHostToDevice, im.stream));
        // s[r, k] row-major = column-major [K, nr] = C^T(K x d) . X(d x nr)
        const float one = 1.f, zero = 0.f;
        TMS_CUBLAS_RETURN_IF_ERROR(cublasSgemm(im.blas, CUBLAS_OP_T, CUBLAS_OP_N, im.K, nr, im.dim, &one, im.d_c,
                                               im.dim, im.d_x, im.dim, &zero, im.d_s, im.K));
        const int warps = 8;
        row_argmax<<<(nr + warps - 1) / warps, warps * 32, 0, im.stream>>>(im.d_s, nr, im.K, im.d_labels,
                                                                          h_best ? im.d_best : nullptr);
        TMS_CUDA_CHECK_LAUNCH();
        TMS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h_labels + r0, im.d_labels, size_t(nr) * sizeof(uint32_t),
                                                 cudaMemcpyDeviceToHost, im.stream));
        if (h_best) {
            TMS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h_best + r0, im.d_best, size_t(nr) * sizeof(float),
                                                     cudaMemcpyDeviceToHost, im.stream));
        }
        TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(im.stream));
    }
    return Status::OK();
}

}  // namespace tms::index

// Copyright TileMaxSim authors. Encoding residuals on the GPU (encode_cuda.h).
#include "kernels/cuda/encode_cuda.h"

#include <algorithm>

#include "kernels/cuda/cuda_check.h"

namespace tms::kernels {
namespace {

// One thread per (token, code byte): the bucket of each residual value (number of cutoffs <= v,
// as std::upper_bound on the CPU), packed low bits first. The same float ops as the CPU encoder.
__global__ void residual_encode(const float* __restrict__ x, const uint32_t* __restrict__ lab,
                                const float* __restrict__ cents, int64_t n, int dim, int nbits, ResidualCutoffs cut,
                                uint8_t* __restrict__ codes) {
    const int ncb = dim * nbits / 8, per_byte = 8 / nbits;
    const int64_t total = n * ncb;
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
        const int64_t t = i / ncb;
        const int b = static_cast<int>(i - t * ncb);
        const float* xr = x + t * dim + b * per_byte;
        const float* cr = cents + int64_t(lab[t]) * dim + b * per_byte;
        uint32_t byte = 0;
        for (int j = 0; j < per_byte; ++j) {
            const float v = xr[j] - cr[j];
            uint32_t bucket = 0;
            for (int c = 0; c < cut.n; ++c) bucket += cut.v[c] <= v ? 1u : 0u;
            byte |= bucket << (nbits * j);
        }
        codes[i] = static_cast<uint8_t>(byte);
    }
}

// Grid (token blocks, M); block: 256 tokens of one sub-quantizer. The sub-quantizer's codebook
// [256, dsub] and squared norms sit in shared memory; every thread reads the same code at the same
// time (broadcast). dist = |c|^2 - 2 r.c, ties to the lower code, in the CPU encoder's order.
template <int MAXDS>
__global__ void pq_encode(const float* __restrict__ x, const uint32_t* __restrict__ lab,
                          const float* __restrict__ cents, int64_t n, int dim, int M, int dsub,
                          const float* __restrict__ book, const float* __restrict__ norms,
                          uint8_t* __restrict__ codes) {
    extern __shared__ float sm[];
    float* bs = sm;               // [256 * dsub]
    float* ns = sm + 256 * dsub;  // [256]
    const int sq = blockIdx.y;
    for (int i = threadIdx.x; i < 256 * dsub; i += blockDim.x) bs[i] = book[size_t(sq) * 256 * dsub + i];
    for (int i = threadIdx.x; i < 256; i += blockDim.x) ns[i] = norms[sq * 256 + i];
    __syncthreads();
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= n) return;
    const float* xr = x + t * dim + sq * dsub;
    const float* cr = cents + int64_t(lab[t]) * dim + sq * dsub;
    float r[MAXDS];
#pragma unroll
    for (int j = 0; j < MAXDS; ++j) r[j] = j < dsub ? -2.0f * (xr[j] - cr[j]) : 0.0f;
    float bd = 0;
    int best = 0;
    for (int c = 0; c < 256; ++c) {
        float d = ns[c];
        const float* bc = bs + c * dsub;
#pragma unroll
        for (int j = 0; j < MAXDS; ++j)
            if (j < dsub) d = fmaf(r[j], bc[j], d);
        if (c == 0 || d < bd) {
            bd = d;
            best = c;
        }
    }
    codes[t * M + sq] = static_cast<uint8_t>(best);
}

}  // namespace

Status residual_encode_cuda(const float* x, const uint32_t* lab, const float* cents, int64_t n, int dim, int nbits,
                            const ResidualCutoffs& cut, uint8_t* codes, cudaStream_t stream) {
    const int threads = 256;
    const int64_t total = n * (dim * nbits / 8);
    const int blocks = static_cast<int>(std::min<int64_t>((total + threads - 1) / threads, 8192));
    residual_encode<<<blocks, threads, 0, stream>>>(x, lab, cents, n, dim, nbits, cut, codes);
    TMS_CUDA_CHECK_LAUNCH();
    return Status::OK();
}

Status pq_encode_setup_cuda(int dsub) {
    const int smem = (256 * dsub + 256) * int(sizeof(float));
    TMS_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(pq_encode<kMaxPqSubCuda>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return Status::OK();
}

Status pq_encode_cuda(const float* x, const uint32_t* lab, const float* cents, int64_t n, int dim, int M, int dsub,
                      const float* book, const float* norms, uint8_t* codes, cudaStream_t stream) {
    const int threads = 256;
    const dim3 grid(static_cast<unsigned>((n + threads - 1) / threads), static_cast<unsigned>(M));
    const int smem = (256 * dsub + 256) * int(sizeof(float));
    if (dsub <= 8) {
        pq_encode<8><<<grid, threads, smem, stream>>>(x, lab, cents, n, dim, M, dsub, book, norms, codes);
    } else if (dsub <= 16) {
        pq_encode<16><<<grid, threads, smem, stream>>>(x, lab, cents, n, dim, M, dsub, book, norms, codes);
    } else if (dsub <= 32) {
        pq_encode<32><<<grid, threads, smem, stream>>>(x, lab, cents, n, dim, M, dsub, book, norms, codes);
    } else {
        pq_encode<kMaxPqSubCuda><<<grid, threads, smem, stream>>>(x, lab, cents, n, dim, M, dsub, book, norms, codes);
    }
    TMS_CUDA_CHECK_LAUNCH();
    return Status::OK();
}

}  // namespace tms::kernels

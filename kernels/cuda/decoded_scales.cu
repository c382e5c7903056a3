// Copyright TileMaxSim authors.
// decoded_scales_cuda: 1 / ||x_t|| of every decoded token, a warp a token (lane j holds dims
// j, j + 32, ...: the centroid row is read coalesced), the sum of squares reduced across the warp.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/code_maxsim_cuda.h"
#include "kernels/cuda/cuda_check.h"

namespace tms::kernels {
namespace {

__global__ void __launch_bounds__(256)
    decoded_scales_kernel(const float* centroids, int dim, const uint32_t* token_centroids, const uint8_t* codes,
                          int n_code_bytes, const float* codebook, int64_t n_tokens, float* scales) {
    const int lane = threadIdx.x & 31;
    const int dsub = dim / n_code_bytes;
    const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
    for (int64_t t = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); t < n_tokens; t += warps) {
        const float* c = centroids + int64_t(__ldg(token_centroids + t)) * dim;
        const uint8_t* code = codes + t * n_code_bytes;
        float ss = 0.f;
        for (int j = lane; j < dim; j += 32) {
            const int b = j / dsub;
            const float x =
                __ldg(c + j) + __ldg(codebook + (int64_t(b) * 256 + __ldg(code + b)) * dsub + (j - b * dsub));
            ss = fmaf(x, x, ss);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) scales[t] = ss > 0.f ? rsqrtf(ss) : 1.f;
    }
}

}  // namespace

Status decoded_scales_cuda(const DecodedScaleParams& p, void* stream) {
    TMS_RETURN_IF_ERROR(decoded_scales_validate(p));
    if (p.n_tokens == 0) return Status::OK();
    if (p.scales == nullptr) return Status::InvalidArgument("decoded_scales: scales is null");
    int dev = 0, n_sm = 0;
    TMS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
    TMS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
    const int64_t blocks = std::min<int64_t>((p.n_tokens + 7) / 8, int64_t(n_sm) * 16);
    decoded_scales_kernel<<<unsigned(blocks), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        p.centroids, p.dim, p.token_centroids, p.codes, p.n_code_bytes, p.codebook, p.n_tokens, p.scales);
    TMS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::OK();
}

}  // namespace tms::kernels

// Copyright TileMaxSim authors. The fused nearest-centroid kernel (kernels/cuda/nearest_cuda.h).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mma_tile.cuh"
#include "kernels/cuda/nearest_cuda.h"
#include "kernels/cuda/row_select.cuh"

namespace tms::kernels {
namespace {

constexpr int kBM = 256;  // rows a CTA
constexpr int kBN = 128;  // centroids a stage
constexpr int kThreads = 256;

// 8 warps: warp w owns rows (w % 4) * 64 .. +64 and columns (w / 4) * 64 .. +64 of each stage,
// as 4 x 8 tiles of m16n8 (acc[4][8][4]: mma_tile.cuh's fragment layout).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

template <int KS>  // the padded dim is 16 * KS
__global__ void __launch_bounds__(kThreads, 1)
    nearest_fused(const float* __restrict__ x, int64_t n, int dim, const __half* __restrict__ c16, int K,
                  const float* __restrict__ c32, uint32_t* __restrict__ labels, float* __restrict__ best) {
    constexpr int DP = 16 * KS;
    constexpr int LD = DP + 8;  // halves a shared-memory row: 8 rows of a ldmatrix hit 8 bank groups
    constexpr int PER_LANE = (DP + 31) / 32;
    extern __shared__ __align__(16) unsigned char smem[];
    __half* As = reinterpret_cast<__half*>(smem);  // [kBM][LD]
    __half* Bs = As + kBM * LD;                    // [2][kBN][LD]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t row0 = int64_t(blockIdx.x) * kBM;

    auto load_stage = [&](int tile, int stage) {
        constexpr int CH = DP / 8;  // 16-byte chunks a centroid row
        const __half* src = c16 + int64_t(tile) * kBN * DP;
        __half* dst = Bs + stage * kBN * LD;
        for (int i = threadIdx.x; i < kBN * CH; i += kThreads) {
            const int r = i / CH, c = i - r * CH;
            async_copy::cp16(dst + r * LD + c * 8, src + int64_t(r) * DP + c * 8);
        }
        async_copy::commit();
    };
    const int T = (K + kBN - 1) / kBN;
    load_stage(0, 0);

    // The rows, each times 2^-e with |values| < 1 after it (frexp of its largest |value|).
    for (int r = warp; r < kBM; r += kThreads / 32) {
        const int64_t gr = row0 + r;
        float v[PER_LANE];
        float m = 0.f;
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) {
            const int d = lane + 32 * j;
            v[j] = (gr < n && d < dim) ? x[gr * dim + d] : 0.f;
            m = fmaxf(m, fabsf(v[j]));
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        int e = 0;
        if (m > 0.f && m <= FLT_MAX) frexpf(m, &e);
        const float s = ldexpf(1.f, -max(-120, min(e, 120)));
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) {
            const int d = lane + 32 * j;
            if (d < DP) As[r * LD + d] = __float2half_rn(v[j] * s);
        }
    }

    const int wm = warp % 4, wn = warp / 4;
    const int g = lane / 4, t4 = lane % 4;
    // ldmatrix row addresses: A (row-major m16 x k16): lane -> row lane % 16, k half lane / 16;
    // B (centroid rows = n, k contiguous): lane -> n (lane % 8) + 8 * (lane / 16), k half (lane / 8) % 2.
    const uint32_t a_base = async_copy::smem_addr(As + (wm * 64 + lane % 16) * LD + (lane / 16) * 8);
    const uint32_t b_off = uint32_t(((wn * 64 + lane % 8 + (lane / 16) * 8) * LD + ((lane / 8) % 2) * 8) * 2);
    float bv[4][2];
    int bi[4][2];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        bv[i][0] = bv[i][1] = -INFINITY;
        bi[i][0] = bi[i][1] = INT_MAX;
    }

    for (int t = 0; t < T; ++t) {
        async_copy::wait_pending(0);
        __syncthreads();  // stage t is in, and every warp is done with stage t - 1
        if (t + 1 < T) load_stage(t + 1, (t + 1) & 1);
        const uint32_t b_base = async_copy::smem_addr(Bs + (t & 1) * kBN * LD) + b_off;
        float acc[4][8][4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
#pragma unroll
        for (int s = 0; s < KS; ++s) {
            uint32_t a[4][4];
#pragma unroll
            for (int i = 0; i < 4; ++i) ldsm_x4(a[i], a_base + uint32_t((i * 16 * LD + s * 16) * 2));
#pragma unroll
            for (int p = 0; p < 4; ++p) {
                uint32_t b[4];
                ldsm_x4(b, b_base + uint32_t((p * 16 * LD + s * 16) * 2));
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    mma_tile::mma16816<false>(acc[i][2 * p], a[i][0], a[i][1], a[i][2], a[i][3], b[0], b[1]);
                    mma_tile::mma16816<false>(acc[i][2 * p + 1], a[i][0], a[i][1], a[i][2], a[i][3], b[2], b[3]);
                }
            }
        }
        // Fold: column of acc[i][j][e] = col0 + 8 j + (e & 1), row half e >> 1.
        const int col0 = t * kBN + wn * 64 + 2 * t4;
        if (t == T - 1 && K % kBN != 0) {  // the zero rows past K are not centroids
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (col0 + 8 * j + (e & 1) >= K) acc[i][j][e] = -INFINITY;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float m = acc[i][0][2 * h];
#pragma unroll
                for (int j = 0; j < 8; ++j) m = fmaxf(m, fmaxf(acc[i][j][2 * h], acc[i][j][2 * h + 1]));
                if (m > bv[i][h]) {  // the first column holding it (NaN never wins)
                    int c = INT_MAX;
#pragma unroll
                    for (int j = 7; j >= 0; --j) {
                        if (acc[i][j][2 * h + 1] == m) c = col0 + 8 * j + 1;
                        if (acc[i][j][2 * h] == m) c = col0 + 8 * j;
                    }
                    bv[i][h] = m;
                    bi[i][h] = c;
                }
            }
    }

    // Across the 4 lanes of a row, then the 2 warps of a row band, through shared memory.
    __syncthreads();                              // the stages are free
    float* red_v = reinterpret_cast<float*>(Bs);  // [2][kBM]
    int* red_i = reinterpret_cast<int*>(red_v + 2 * kBM);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float v = bv[i][h];
            int ix = bi[i][h];
#pragma unroll
            for (int o = 1; o < 4; o <<= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, v, o);
                const int oi = __shfl_xor_sync(0xffffffffu, ix, o);
                if (better(ov, oi, v, ix)) {
                    v = ov;
                    ix = oi;
                }
            }
            if (t4 == 0) {
                const int r = wm * 64 + i * 16 + h * 8 + g;
                red_v[wn * kBM + r] = v;
                red_i[wn * kBM + r] = ix;
            }
        }
    __syncthreads();
    const int r = threadIdx.x;  // kThreads == kBM
    const int64_t gr = row0 + r;
    if (gr >= n) return;
    float v = red_v[r];
    int ix = red_i[r];
    if (better(red_v[kBM + r], red_i[kBM + r], v, ix)) ix = red_i[kBM + r];
    const uint32_t label = ix < K ? uint32_t(ix) : 0u;  // no finite score: a non-finite row
    labels[gr] = label;
    if (best != nullptr) {
        const float* xr = x + gr * dim;
        const float* cr = c32 + int64_t(label) * dim;
        float s = 0.f;
        for (int d = 0; d < dim; ++d) s = fmaf(xr[d], cr[d], s);
        best[gr] = s;
    }
}

__global__ void nearest_prepare_kernel(const float* __restrict__ c, int K, int dim, int64_t rows, int dp, float scale,
                                       __half* __restrict__ out) {
    const int64_t total = rows * dp;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t r = i / dp;
        const int d = static_cast<int>(i - r * dp);
        out[i] = __float2half_rn(r < K && d < dim ? c[r * dim + d] * scale : 0.f);
    }
}

template <int KS>
Status launch_fused(const NearestParams& p, const __half* c16, cudaStream_t stream) {
    constexpr int LD = 16 * KS + 8;
    const int smem = (kBM + 2 * kBN) * LD * int(sizeof(__half));
    static_assert(2 * kBN * LD * sizeof(__half) >= 2 * kBM * (sizeof(float) + sizeof(int)),
                  "the row reduction fits the two stages");
    TMS_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(nearest_fused<KS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int64_t blocks = (p.n + kBM - 1) / kBM;
    for (int64_t b0 = 0; b0 < blocks; b0 += INT_MAX / 2) {  // grid.x limit
        const int64_t nb = std::min<int64_t>(blocks - b0, INT_MAX / 2);
        const int64_t r0 = b0 * kBM;
        nearest_fused<KS><<<static_cast<unsigned>(nb), kThreads, smem, stream>>>(
            p.x + r0 * p.dim, p.n - r0, p.dim, c16, p.n_centroids, p.centroids, p.labels + r0,
            p.best ? p.best + r0 : nullptr);
        TMS_CUDA_CHECK_LAUNCH();
    }
    return Status::OK();
}

}  // namespace

float nearest_centroid_scale(const float* h, int64_t count) {
    float m = 0.f;
    for (int64_t i = 0; i < count; ++i) {
        const float a = std::fabs(h[i]);
        if (!(a <= FLT_MAX)) return 1.f;
        m = std::max(m, a);
    }
    if (m == 0.f) return 1.f;
    int e = 0;
    std::frexp(m, &e);
    return std::ldexp(1.f, -std::clamp(e, -120, 120));
}

Status nearest_prepare_cuda(const float* d_c, int K, int dim, float scale, uint16_t* d_c16, cudaStream_t stream) {
    if (K <= 0 || dim <= 0) return Status::InvalidArgument("nearest_prepare_cuda: empty centroids");
    const int64_t rows = nearest_padded_centroids(K);
    const int dp = nearest_padded_dim(dim);
    const int64_t total = rows * dp;
    const int blocks = static_cast<int>(std::min<int64_t>((total + 255) / 256, 4096));
    nearest_prepare_kernel<<<blocks, 256, 0, stream>>>(d_c, K, dim, rows, dp, scale, reinterpret_cast<__half*>(d_c16));
    TMS_CUDA_CHECK_LAUNCH();
    return Status::OK();
}

Status nearest_cuda(const NearestParams& p, const uint16_t* d_c16, cudaStream_t stream) {
    TMS_RETURN_IF_ERROR(nearest_validate(p));
    if (p.dim > kNearestMaxDim) {
        return Status::NotSupported("nearest_cuda: rows of more than " + std::to_string(kNearestMaxDim) +
                                    " dimensions");
    }
    if (p.n == 0) return Status::OK();
    const __half* c16 = reinterpret_cast<const __half*>(d_c16);
    switch (nearest_padded_dim(p.dim) / 16) {
        case 2: return launch_fused<2>(p, c16, stream);
        case 4: return launch_fused<4>(p, c16, stream);
        case 6: return launch_fused<6>(p, c16, stream);
        default: return launch_fused<8>(p, c16, stream);
    }
}

namespace {

// Grid: one warp per row of the score tile [rows, K]; block: 8 warps (8 rows). The best
// centroid of the row (ties: lower id; warp_row_top_n with n = 1).
__global__ void row_argmax(const float* __restrict__ s, int rows, int K, uint32_t* __restrict__ labels,
                           float* __restrict__ best) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    warp_row_top_n(s + size_t(row) * K, K, 1, lane, [&](int, int bi, float bv) {
        if (lane != 0) return;
        labels[row] =
            static_cast<uint32_t>(bi < K ? bi : 0);  // every score NaN: a non-finite row, reported by the caller
        if (best) best[row] = bv;
    });
}

}  // namespace

Status row_argmax_cuda(const float* s, int rows, int K, uint32_t* labels, float* best, cudaStream_t stream) {
    const int warps = 8;
    row_argmax<<<(rows + warps - 1) / warps, warps * 32, 0, stream>>>(s, rows, K, labels, best);
    TMS_CUDA_CHECK_LAUNCH();
    return Status::OK();
}

}  // namespace tms::kernels

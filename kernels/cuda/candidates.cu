// Copyright TileMaxSim authors. Candidate-generation ops on the GPU (candidates_cuda.h).
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <algorithm>

#include "kernels/cuda/candidates_cuda.h"
#include "kernels/cuda/cuda_check.h"

namespace tms::kernels {
namespace {

// One block per (query row slot, query): marks the documents of one probed IVF list in the
// query's bitmap. Rows past the query's length are skipped.
__global__ void ivf_mark(const int32_t* __restrict__ probe, int q_stride, int nprobe, const int32_t* __restrict__ lens,
                         const int64_t* __restrict__ ivf_off, const int32_t* __restrict__ ivf_docs, int n_centroids,
                         int64_t words, uint32_t* __restrict__ bits) {
    const int q = blockIdx.y, slot = blockIdx.x, row = slot / nprobe;
    const int ql = lens ? lens[q] : q_stride;
    if (row >= ql) return;
    const int c = probe[(int64_t(q) * q_stride + row) * nprobe + slot % nprobe];
    if (c < 0 || c >= n_centroids) return;
    uint32_t* b = bits + int64_t(q) * words;
    for (int64_t e = ivf_off[c] + threadIdx.x; e < ivf_off[c + 1]; e += blockDim.x) {
        const int32_t d = ivf_docs[e];
        atomicOr(b + (d >> 5), 1u << (d & 31));
    }
}

constexpr int kScanThreads = 256;

// One block per query: the number of set bits of its bitmap.
__global__ void __launch_bounds__(kScanThreads) bit_count(const uint32_t* __restrict__ bits, int64_t words,
                                                          int64_t* __restrict__ counts) {
    using Reduce = cub::BlockReduce<int64_t, kScanThreads>;
    __shared__ typename Reduce::TempStorage tmp;
    const uint32_t* b = bits + int64_t(blockIdx.x) * words;
    int64_t c = 0;
    for (int64_t w = threadIdx.x; w < words; w += kScanThreads) c += __popc(b[w]);
    c = Reduce(tmp).Sum(c);
    if (threadIdx.x == 0) counts[blockIdx.x] = c;
}

// One block per query: the ids of its set bits, ascending, from docs[off[q]].
__global__ void __launch_bounds__(kScanThreads) bit_emit(const uint32_t* __restrict__ bits, int64_t words,
                                                         const int64_t* __restrict__ off, int32_t* __restrict__ docs) {
    using Scan = cub::BlockScan<int, kScanThreads>;
    __shared__ typename Scan::TempStorage tmp;
    const uint32_t* b = bits + int64_t(blockIdx.x) * words;
    int64_t pos0 = off[blockIdx.x];
    for (int64_t w0 = 0; w0 < words; w0 += kScanThreads) {
        const int64_t w = w0 + threadIdx.x;
        uint32_t x = w < words ? b[w] : 0u;
        int pre = 0, total = 0;
        Scan(tmp).ExclusiveSum(__popc(x), pre, total);
        int64_t pos = pos0 + pre;
        while (x) {
            docs[pos++] = int32_t(w * 32 + (__ffs(x) - 1));
            x &= x - 1;
        }
        pos0 += total;
        __syncthreads();  // tmp is reused
    }
}

__global__ void split_tf32x3(const float* __restrict__ src, int64_t rows, int dim, unsigned lo_parts,
                             float* __restrict__ dst) {
    const int64_t n = rows * dim;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t r = i / dim;
        const int j = int(i - r * dim);
        const float x = src[i];
        const float hi = __uint_as_float(__float_as_uint(x) & 0xffffe000u);
        const float lo = x - hi;
        float* row = dst + r * 3 * dim + j;
#pragma unroll
        for (int part = 0; part < 3; ++part) row[part * dim] = (lo_parts >> part) & 1u ? lo : hi;
    }
}

}  // namespace

Status ivf_mark_cuda(const IvfUnionParams& p, uint32_t* bits, cudaStream_t stream) {
    if (p.n_queries == 0 || p.q_stride == 0 || p.nprobe == 0) return Status::OK();
    if (p.n_queries > 65535) return Status::InvalidArgument("ivf_mark_cuda: more than 65535 queries");
    ivf_mark<<<dim3(unsigned(p.q_stride * p.nprobe), unsigned(p.n_queries)), 256, 0, stream>>>(
        p.probe, p.q_stride, p.nprobe, p.query_lens, p.ivf_offsets, p.ivf_docs, p.n_centroids,
        ivf_bitmap_words(p.n_docs), bits);
    TMS_CUDA_CHECK_LAUNCH();
    return Status::OK();
}

Status bit_count_cuda(const uint32_t* bits, int64_t words, int n_queries, int64_t* counts, cudaStream_t stream) {
    if (n_queries == 0) return Status::OK();
    bit_count<<<unsigned(n_queries), kScanThreads, 0, stream>>>(bits, words, counts);
    TMS_CUDA_CHECK_LAUNCH();
    return Status::OK();
}

Status bit_emit_cuda(const uint32_t* bits, int64_t words, int n_queries, const int64_t* off, int32_t* docs,
                     cudaStream_t stream) {
    if (n_queries == 0) return Status::OK();
    bit_emit<<<unsigned(n_queries), kScanThreads, 0, stream>>>(bits, words, off, docs);
    TMS_CUDA_CHECK_LAUNCH();
    return Status::OK();
}

Status split_tf32x3_cuda(const float* src, int64_t rows, int dim, unsigned lo_parts, float* dst, cudaStream_t stream) {
    const int64_t n = rows * dim;
    if (n == 0) return Status::OK();
    split_tf32x3<<<unsigned(std::min<int64_t>((n + 255) / 256, 4096)), 256, 0, stream>>>(src, rows, dim, lo_parts, dst);
    TMS_CUDA_CHECK_LAUNCH();
    return Status::OK();
}

}  // namespace tms::kernels

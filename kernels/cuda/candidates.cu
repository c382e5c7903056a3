// Copyright TileMaxSim authors. Candidate-generation ops on the GPU (candidates_cuda.h).
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <algorithm>

#include "kernels/cuda/candidates_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/row_select.cuh"
#include "kernels/cuda/topk_device.cuh"

namespace tms::kernels {
namespace {

// One warp per row of s [rows, K]: its n best centroids in order (warp_row_top_n).
__global__ void row_top_n(const float* __restrict__ s, int64_t rows, int K, int n, int32_t* __restrict__ out) {
    const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    warp_row_top_n(s + row * K, K, n, lane, [&](int p, int bi, float) {
        if (lane == 0) out[row * n + p] = bi < K ? bi : -1;
    });
}

// As row_top_n, with the scores: the first nprobe of the row's n best into probe / scores
// [rows, nprobe], and the score of its n-th best into floor [rows] (n = nprobe + 1: the best
// unprobed centroid; n = nprobe when every centroid is probed: the worst probed one).
__global__ void row_top_n_scores(const float* __restrict__ s, int64_t rows, int K, int n, int nprobe,
                                 int32_t* __restrict__ probe, float* __restrict__ scores, float* __restrict__ floor) {
    const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    warp_row_top_n(s + row * K, K, n, lane, [&](int p, int bi, float bv) {
        if (lane != 0) return;
        if (p < nprobe) {
            probe[row * nprobe + p] = bi < K ? bi : -1;
            scores[row * nprobe + p] = bv;
        }
        if (p == n - 1) floor[row] = bv;
    });
}

// Sort keys of (score, document), topk_dev::make_key: descending key order is score
// descending, then document ascending.
__global__ void score_doc_keys(const float* __restrict__ scores, const int32_t* __restrict__ docs, int64_t n,
                               uint64_t* __restrict__ keys) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        keys[i] = topk_dev::make_key(scores[i], docs[i]);
}

// The first new_off[q+1] - new_off[q] keys of each sorted segment, back to documents (and
// scores, when asked).
__global__ void gather_top_keys(const uint64_t* __restrict__ sorted, const int64_t* __restrict__ off,
                                const int64_t* __restrict__ new_off, int32_t* __restrict__ docs,
                                float* __restrict__ scores) {
    const int q = blockIdx.x;
    const int64_t n = new_off[q + 1] - new_off[q];
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const uint64_t key = sorted[off[q] + i];
        docs[new_off[q] + i] = topk_dev::key_id(key);
        if (scores) scores[new_off[q] + i] = topk_dev::key_score(key);
    }
}

// One block per (query row slot, query): marks the documents of one probed IVF list in the
// query's bitmap. Rows past the query's length are skipped.
__global__ void ivf_mark(IvfUnionParams p, int64_t words, uint32_t* __restrict__ bits) {
    const int q = blockIdx.y, slot = blockIdx.x, row = slot / p.nprobe;
    const int ql = p.query_lens ? p.query_lens[q] : p.q_stride;
    if (row >= ql) return;
    const int c = p.probe[(int64_t(q) * p.q_stride + row) * p.nprobe + slot % p.nprobe];
    if (c < 0 || c >= p.n_centroids) return;
    uint32_t* b = bits + int64_t(q) * words;
    for (int64_t e = p.ivf_offsets[c] + threadIdx.x; e < p.ivf_offsets[c + 1]; e += blockDim.x) {
        const int32_t d = p.ivf_docs[e];
        if (doc_allowed(p, q, d)) atomicOr(b + (d >> 5), 1u << (d & 31));
    }
}

constexpr int kScanThreads = 256;

// One block per query: the number of set bits of its bitmap.
__global__ void __launch_bounds__(kScanThreads)
    bit_count(const uint32_t* __restrict__ bits, int64_t words, int64_t* __restrict__ counts) {
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

// Thread per (list, range boundary): where the range's documents start in the list.
__global__ void ivf_range_index(const int64_t* __restrict__ ivf_off, const int32_t* __restrict__ ivf_docs,
                                int n_centroids, int64_t n_ranges, int32_t* __restrict__ rix) {
    const int64_t n = int64_t(n_centroids) * (n_ranges + 1);
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t c = i / (n_ranges + 1), r = i - c * (n_ranges + 1);
        const int64_t first = r * kProbeRangeDocs;
        int64_t lo = ivf_off[c], hi = ivf_off[c + 1];
        const int64_t start = lo;
        while (lo < hi) {
            const int64_t mid = (lo + hi) / 2;
            if (ivf_docs[mid] < first)
                lo = mid + 1;
            else
                hi = mid;
        }
        rix[i] = int32_t(lo - start);
    }
}

constexpr int kProbeWarps = 8;
constexpr int kRangeWords = kProbeRangeDocs / 32;
static_assert(kProbeBins <= kProbeWarps * kRangeWords, "the histogram reuses the rows' bitmaps");

// One CTA per (range, query): the query's fixed-point scores of the range's documents in shared
// memory. Each warp takes one row at a time and walks its probes in order, over the part of each
// probed list that falls in the range; a per-warp bitmap keeps the row's first probe of each
// document (the best), so that every row adds one term per document (integer atomics: the sum
// does not depend on the order). Then the scores go out densely (score + 1, 0 when not probed)
// with their histogram.
__global__ void __launch_bounds__(kProbeWarps * 32)
    probe_accumulate(ProbeScoreParams p, const int32_t* __restrict__ rix, int64_t n_ranges,
                     uint32_t* __restrict__ dense, uint32_t* __restrict__ hist) {
    __shared__ uint32_t acc[kProbeRangeDocs];
    __shared__ uint32_t seen[kProbeWarps][kRangeWords];
    __shared__ uint32_t touched[kRangeWords];
    __shared__ float s_scale;
    const IvfUnionParams& u = p.lists;
    const int64_t r = blockIdx.x;
    const int q = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t d0 = r * kProbeRangeDocs;
    const int ql = u.query_lens ? u.query_lens[q] : u.q_stride;
    for (int i = threadIdx.x; i < kProbeRangeDocs; i += blockDim.x) acc[i] = 0;
    for (int i = threadIdx.x; i < kRangeWords; i += blockDim.x) touched[i] = 0;
    if (threadIdx.x == 0) {  // in row order, as the host paths sum it
        float range = 0.f;
        for (int i = 0; i < ql; ++i) {
            const int64_t row = int64_t(q) * u.q_stride + i;
            range += probe_row_range(u.probe + row * u.nprobe, p.probe_scores + row * u.nprobe, u.nprobe, u.n_centroids,
                                     p.floor_scores[row]);
        }
        s_scale = probe_score_scale(range);
    }
    __syncthreads();
    const float scale = s_scale;
    uint32_t* my_seen = seen[warp];
    for (int i = warp; i < ql; i += kProbeWarps) {
        const int64_t row = int64_t(q) * u.q_stride + i;
        const float floor = p.floor_scores[row];
        for (int w = lane; w < kRangeWords; w += 32) my_seen[w] = 0;
        __syncwarp();
        for (int j = 0; j < u.nprobe; ++j) {
            const int c = u.probe[row * u.nprobe + j];
            if (c < 0 || c >= u.n_centroids) continue;
            const uint32_t t = probe_term(p.probe_scores[row * u.nprobe + j], floor, scale);
            const int32_t* ri = rix + int64_t(c) * (n_ranges + 1) + r;
            const int32_t* list = u.ivf_docs + u.ivf_offsets[c];
            const int32_t e1 = ri[1];
            for (int32_t e = ri[0] + lane; e < e1; e += 32) {
                const int d = int(list[e] - d0);
                const uint32_t bit = 1u << (d & 31);
                if (!(atomicOr(my_seen + (d >> 5), bit) & bit)) {
                    atomicAdd(acc + d, t);
                    atomicOr(touched + (d >> 5), bit);
                }
            }
            __syncwarp();  // this probe's documents are marked before the next probe's
        }
    }
    __syncthreads();
    uint32_t* h = &seen[0][0];  // the bitmaps are done: the range's histogram
    for (int b = threadIdx.x; b < kProbeBins; b += blockDim.x) h[b] = 0;
    __syncthreads();
    const int64_t n_here = u.n_docs - d0 < kProbeRangeDocs ? u.n_docs - d0 : int64_t(kProbeRangeDocs);
    uint32_t* out = dense + int64_t(q) * u.n_docs + d0;
    for (int d = threadIdx.x; d < n_here; d += blockDim.x) {
        const bool hit = ((touched[d >> 5] >> (d & 31)) & 1u) && doc_allowed(u, q, int32_t(d0 + d));
        const uint32_t v = hit ? acc[d] + 1 : 0u;
        out[d] = v;
        if (v) atomicAdd(h + min(v >> kProbeBinShift, uint32_t(kProbeBins - 1)), 1u);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < kProbeBins; b += blockDim.x)
        if (h[b]) atomicAdd(hist + int64_t(q) * kProbeBins + b, h[b]);
}

// One CTA per query: the whole-bin threshold that keeps at least `keep` documents.
__global__ void probe_threshold(const uint32_t* __restrict__ hist, int keep, uint32_t* __restrict__ thr,
                                int64_t* __restrict__ counts) {
    __shared__ uint32_t h[kProbeBins];
    const int q = blockIdx.x;
    for (int b = threadIdx.x; b < kProbeBins; b += blockDim.x) h[b] = hist[int64_t(q) * kProbeBins + b];
    __syncthreads();
    if (threadIdx.x != 0) return;
    int64_t total = 0;
    for (int b = 0; b < kProbeBins; ++b) total += h[b];
    uint32_t t = 1;
    int64_t n = total;
    if (keep > 0 && total > keep) {
        n = 0;
        int b = kProbeBins - 1;
        for (; b > 0; --b) {
            n += h[b];
            if (n >= keep) break;
        }
        if (b == 0) n += h[0];
        t = b > 0 ? uint32_t(b) << kProbeBinShift : 1u;
    }
    thr[q] = t;
    counts[q] = n;
}

// Grid (ranges, queries): the documents at or above their query's threshold.
__global__ void probe_emit(const uint32_t* __restrict__ dense, int64_t n_docs, const uint32_t* __restrict__ thr,
                           const int64_t* __restrict__ off, uint32_t* __restrict__ cursor, int32_t* __restrict__ docs,
                           float* __restrict__ scores) {
    const int q = blockIdx.y;
    const int64_t d = int64_t(blockIdx.x) * kProbeRangeDocs;
    const int64_t end = d + kProbeRangeDocs < n_docs ? d + kProbeRangeDocs : n_docs;
    const uint32_t t = thr[q];
    const uint32_t* row = dense + int64_t(q) * n_docs;
    for (int64_t i = d + threadIdx.x; i < end; i += blockDim.x) {
        const uint32_t v = row[i];
        if (v == 0 || v < t) continue;
        const int64_t at = off[q] + atomicAdd(cursor + q, 1u);
        docs[at] = int32_t(i);
        scores[at] = float(v - 1);
    }
}

}  // namespace

Status ivf_range_index_cuda(const int64_t* ivf_off, const int32_t* ivf_docs, int n_centroids, int64_t n_docs,
                            int32_t* rix, cudaStream_t stream) {
    const int64_t n = int64_t(n_centroids) * (probe_ranges(n_docs) + 1);
    if (n == 0) return Status::OK();
    ivf_range_index<<<unsigned(std::min<int64_t>((n + 255) / 256, 65536)), 256, 0, stream>>>(
        ivf_off, ivf_docs, n_centroids, probe_ranges(n_docs), rix);
    TMS_CUDA_CHECK_LAUNCH();
    return Status::OK();
}

Status probe_accumulate_cuda(const ProbeScoreParams& p, const int32_t* rix, uint32_t* dense, uint32_t* hist,
                             cudaStream_t stream) {
    const int64_t nr = probe_ranges(p.lists.n_docs);
    if (p.lists.n_queries == 0 || nr == 0) return Status::OK();
    if (p.lists.n_queries > 65535) return Status::InvalidArgument("probe_accumulate_cuda: more than 65535 queries");
    probe_accumulate<<<dim3(unsigned(nr), unsigned(p.lists.n_queries)), kProbeWarps * 32, 0, stream>>>(p, rix, nr,
                                                                                                       dense, hist);
    TMS_CUDA_CHECK_LAUNCH();
    return Status::OK();
}

Status probe_threshold_cuda(const uint32_t* hist, int n_queries, int keep, uint32_t* thr, int64_t* counts,
                            cudaStream_t stream) {
    if (n_queries == 0) return Status::OK();
    probe_threshold<<<unsigned(n_queries), 256, 0, stream>>>(hist, keep, thr, counts);
    TMS_CUDA_CHECK_LAUNCH();
    return Status::OK();
}

Status probe_emit_cuda(const uint32_t* dense, int n_queries, int64_t n_docs, const uint32_t* thr, const int64_t* off,
                       uint32_t* cursor, int32_t* docs, float* scores, cudaStream_t stream) {
    const int64_t nr = probe_ranges(n_docs);
    if (n_queries == 0 || nr == 0) return Status::OK();
    if (n_queries > 65535) return Status::InvalidArgument("probe_emit_cuda: more than 65535 queries");
    probe_emit<<<dim3(unsigned(nr), unsigned(n_queries)), 256, 0, stream>>>(dense, n_docs, thr, off, cursor, docs,
                                                                            scores);
    TMS_CUDA_CHECK_LAUNCH();
    return Status::OK();
}

Status ivf_mark_cuda(const IvfUnionParams& p, uint32_t* bits, cudaStream_t stream) {
    if (p.n_queries == 0 || p.q_stride == 0 || p.nprobe == 0) return Status::OK();
    if (p.n_queries > 65535) return Status::InvalidArgument("ivf_mark_cuda: more than 65535 queries");
    ivf_mark<<<dim3(unsigned(p.q_stride * p.nprobe), unsigned(p.n_queries)), 256, 0, stream>>>(
        p, bitmap_words(p.n_docs), bits);
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

Status row_top_n_cuda(const float* s, int64_t rows, int K, int n, int32_t* out, cudaStream_t stream) {
    row_top_n<<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(s, rows, K, n, out);
    TMS_CUDA_CHECK_LAUNCH();
    return Status::OK();
}

Status row_top_n_scores_cuda(const float* s, int64_t rows, int K, int n, int nprobe, int32_t* probe, float* scores,
                             float* floor, cudaStream_t stream) {
    row_top_n_scores<<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(s, rows, K, n, nprobe, probe, scores,
                                                                                floor);
    TMS_CUDA_CHECK_LAUNCH();
    return Status::OK();
}

Status score_doc_keys_cuda(const float* scores, const int32_t* docs, int64_t n, uint64_t* keys, cudaStream_t stream) {
    const unsigned blocks = unsigned(std::min<int64_t>((n + 255) / 256, 4096));
    score_doc_keys<<<blocks, 256, 0, stream>>>(scores, docs, n, keys);
    TMS_CUDA_CHECK_LAUNCH();
    return Status::OK();
}

Status gather_top_keys_cuda(const uint64_t* sorted, const int64_t* off, const int64_t* new_off, int n_segments,
                            int32_t* docs, float* scores, cudaStream_t stream) {
    gather_top_keys<<<unsigned(n_segments), 256, 0, stream>>>(sorted, off, new_off, docs, scores);
    TMS_CUDA_CHECK_LAUNCH();
    return Status::OK();
}

}  // namespace tms::kernels

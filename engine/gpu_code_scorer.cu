// Copyright TileMaxSim authors. GpuCodeScorer: one shard's compressed tokens resident on one
// GPU; per call the queries, centroid scores (or a cuBLAS Q.C^T on the device) and candidate
// lists go up, kernels::code_maxsim_cuda runs on the scorer's own stream, and the scores come
// back. Per-call buffers live in one device arena that grows (never shrinks).
// Thread-safety: one call at a time per scorer.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "engine/gpu_code_scorer.h"
#include "kernels/cuda/code_maxsim_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/upload.h"
#include "kernels/cuda/maxsim_cuda.h"
#include "kernels/cuda/row_select.cuh"

namespace tms::engine {
using kernels::align256;
using kernels::DeviceGuard;

namespace {

// One warp per row of s [rows, K]: its n best centroids in order (kernels::warp_row_top_n).
__global__ void row_top_n(const float* __restrict__ s, int64_t rows, int K, int n, int32_t* __restrict__ out) {
    const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    kernels::warp_row_top_n(s + row * K, K, n, lane, [&](int p, int bi, float) {
        if (lane == 0) out[row * n + p] = bi < K ? bi : -1;
    });
}

}  // namespace

struct GpuCodeScorer::Impl {
    int device = 0;
    int dim = 0;
    int n_code_bytes = 0;
    int n_centroids = 0;
    int64_t n_docs = 0;
    cudaStream_t stream = nullptr;
    cublasHandle_t blas = nullptr;
    uint32_t* d_tc = nullptr;
    uint8_t* d_codes = nullptr;
    float* d_book = nullptr;
    float* d_cent = nullptr;
    int64_t* d_offsets = nullptr;
    void* d_arena = nullptr;
    size_t arena_bytes = 0;

    ~Impl() {
        DeviceGuard g(device);
        if (stream) cudaStreamSynchronize(stream);
        if (blas) cublasDestroy(blas);
        cudaFree(d_arena);
        cudaFree(d_offsets);
        cudaFree(d_cent);
        cudaFree(d_book);
        cudaFree(d_codes);
        cudaFree(d_tc);
        if (stream) cudaStreamDestroy(stream);
    }

    Status Reserve(size_t bytes) {
        if (bytes <= arena_bytes) return Status::OK();
        TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
        const size_t grown = std::max(bytes, arena_bytes + arena_bytes / 2);
        TMS_CUDA_RETURN_IF_ERROR(cudaFree(d_arena));
        d_arena = nullptr;
        arena_bytes = 0;
        TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&d_arena, grown));
        arena_bytes = grown;
        return Status::OK();
    }
};

GpuCodeScorer::~GpuCodeScorer() = default;

Status GpuCodeScorer::Create(int device, const uint32_t* h_token_centroids, const uint8_t* h_codes, int64_t n_tokens,
                             int n_code_bytes, const float* h_codebook, const float* h_centroids, int n_centroids,
                             int dim, const int64_t* h_doc_offsets, int64_t n_docs,
                             std::unique_ptr<GpuCodeScorer>* out) {
    if (n_tokens < 0 || n_docs < 0 || dim <= 0 || n_centroids <= 0 || n_code_bytes < 0) {
        return Status::InvalidArgument("GpuCodeScorer: bad sizes");
    }
    if (n_code_bytes > 0 && dim % n_code_bytes != 0) {
        return Status::NotSupported("GpuCodeScorer: n_code_bytes must divide dim");
    }
    if (h_doc_offsets == nullptr || h_centroids == nullptr || (n_tokens > 0 && h_token_centroids == nullptr) ||
        (n_code_bytes > 0 && (h_codebook == nullptr || (n_tokens > 0 && h_codes == nullptr)))) {
        return Status::InvalidArgument("GpuCodeScorer: null input");
    }
    for (int64_t t = 0; t < n_tokens; ++t) {
        if (h_token_centroids[t] >= uint32_t(n_centroids)) {
            return Status::InvalidArgument("GpuCodeScorer: token centroid id outside [0, n_centroids)");
        }
    }
    int n_dev = 0;
    TMS_RETURN_IF_ERROR(kernels::cuda_device_count(&n_dev));
    TMS_RETURN_IF_ERROR(kernels::validate_shard("GpuCodeScorer", h_doc_offsets, n_docs, n_tokens, device, n_dev));
    DeviceGuard g(device);
    if (!g.ok()) return Status::Internal("GpuCodeScorer: cannot select device " + std::to_string(device));
    std::unique_ptr<GpuCodeScorer> s(new GpuCodeScorer());
    s->impl_ = std::make_unique<Impl>();
    Impl& im = *s->impl_;
    im.device = device;
    im.dim = dim;
    im.n_code_bytes = n_code_bytes;
    im.n_centroids = n_centroids;
    im.n_docs = n_docs;
    TMS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&im.stream, cudaStreamNonBlocking));
    TMS_CUBLAS_RETURN_IF_ERROR(cublasCreate(&im.blas));
    TMS_CUBLAS_RETURN_IF_ERROR(cublasSetStream(im.blas, im.stream));
    kernels::StagedUploader uploader(im.stream);
    auto up = [&](auto** d, const void* h, size_t bytes) -> Status {
        TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(d), std::max<size_t>(bytes, 256)));
        return uploader.Upload(*d, h, bytes);
    };
    TMS_RETURN_IF_ERROR(up(&im.d_tc, h_token_centroids, size_t(n_tokens) * sizeof(uint32_t)));
    TMS_RETURN_IF_ERROR(up(&im.d_codes, h_codes, size_t(n_tokens) * n_code_bytes));
    TMS_RETURN_IF_ERROR(up(&im.d_book, h_codebook, size_t(n_code_bytes) * 256 * (n_code_bytes ? dim / n_code_bytes : 0) * sizeof(float)));
    TMS_RETURN_IF_ERROR(up(&im.d_cent, h_centroids, size_t(n_centroids) * dim * sizeof(float)));
    TMS_RETURN_IF_ERROR(up(&im.d_offsets, h_doc_offsets, size_t(n_docs + 1) * sizeof(int64_t)));
    TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(im.stream));
    *out = std::move(s);
    return Status::OK();
}

Status GpuCodeScorer::Score(const float* h_queries, int n_queries, int q_stride, const int32_t* h_query_lens,
                            const float* h_centroid_scores, const int64_t* h_cand_offsets, const int32_t* h_cand_docs,
                            bool centroids_only, std::vector<float>* scores) {
    Impl& im = *impl_;
    DeviceGuard g(im.device);
    int64_t n_cand = 0;
    TMS_RETURN_IF_ERROR(kernels::validate_host_batch("GpuCodeScorer", n_queries, q_stride, h_queries, h_query_lens,
                                                        h_cand_offsets, h_cand_docs, im.n_docs, &n_cand));
    const int64_t n_out = h_cand_offsets ? n_cand : int64_t(n_queries) * im.n_docs;
    kernels::CodeMaxSimParams p;
    p.n_queries = n_queries;
    p.q_stride = q_stride;
    p.dim = im.dim;
    p.n_centroids = im.n_centroids;
    p.n_code_bytes = centroids_only ? 0 : im.n_code_bytes;
    const size_t q_bytes = size_t(n_queries) * q_stride * im.dim * sizeof(float);
    const size_t l_bytes = h_query_lens ? size_t(n_queries) * sizeof(int32_t) : 0;
    const size_t cs_bytes = size_t(n_queries) * q_stride * im.n_centroids * sizeof(float);
    const size_t co_bytes = h_cand_offsets ? size_t(n_queries + 1) * sizeof(int64_t) : 0;
    const size_t cd_bytes = size_t(n_cand) * sizeof(int32_t);
    const size_t s_bytes = size_t(n_out) * sizeof(float);
    const size_t ws_bytes = kernels::code_maxsim_cuda_workspace_bytes(p);
    const size_t total = align256(q_bytes) + align256(l_bytes) + align256(cs_bytes) + align256(co_bytes) +
                         align256(cd_bytes) + align256(s_bytes) + align256(ws_bytes);
    TMS_RETURN_IF_ERROR(im.Reserve(std::max<size_t>(total, 256)));
    char* cur = static_cast<char*>(im.d_arena);
    auto put = [&](const void* h, size_t bytes, void** d) -> Status {
        *d = bytes ? cur : nullptr;
        if (bytes && h) TMS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(cur, h, bytes, cudaMemcpyHostToDevice, im.stream));
        cur += align256(bytes);
        return Status::OK();
    };
    void *dq, *dl, *dcs, *dco, *dcd, *ds, *dws;
    TMS_RETURN_IF_ERROR(put(h_queries, q_bytes, &dq));
    TMS_RETURN_IF_ERROR(put(h_query_lens, l_bytes, &dl));
    TMS_RETURN_IF_ERROR(put(h_centroid_scores, cs_bytes, &dcs));
    TMS_RETURN_IF_ERROR(put(h_cand_offsets, co_bytes, &dco));
    TMS_RETURN_IF_ERROR(put(h_cand_docs, cd_bytes, &dcd));
    TMS_RETURN_IF_ERROR(put(nullptr, std::max<size_t>(s_bytes, 4), &ds));
    TMS_RETURN_IF_ERROR(put(nullptr, ws_bytes, &dws));
    if (h_centroid_scores == nullptr && cs_bytes > 0) {
        // cs[(q * q_stride + i) * K + k] = <query row, centroid k>: column-major K x (nq * q_stride).
        const float one = 1.f, zero = 0.f;
        TMS_CUBLAS_RETURN_IF_ERROR(cublasSgemm(im.blas, CUBLAS_OP_T, CUBLAS_OP_N, im.n_centroids,
                                               n_queries * q_stride, im.dim, &one, im.d_cent, im.dim,
                                               static_cast<const float*>(dq), im.dim, &zero,
                                               static_cast<float*>(dcs), im.n_centroids));
    }
    p.queries = static_cast<const float*>(dq);
    p.query_lens = static_cast<const int32_t*>(dl);
    p.centroid_scores = static_cast<const float*>(dcs);
    p.token_centroids = im.d_tc;
    p.codes = centroids_only ? nullptr : im.d_codes;
    p.codebook = centroids_only ? nullptr : im.d_book;
    p.doc_offsets = im.d_offsets;
    p.n_docs = im.n_docs;
    p.cand_offsets = static_cast<const int64_t*>(dco);
    p.cand_docs = h_cand_offsets ? (dcd ? static_cast<const int32_t*>(dcd) : reinterpret_cast<const int32_t*>(cur))
                                 : nullptr;
    p.scores = static_cast<float*>(ds);
    TMS_RETURN_IF_ERROR(kernels::code_maxsim_cuda(p, dws, ws_bytes, im.stream));
    scores->resize(size_t(n_out));
    if (n_out) {
        TMS_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(scores->data(), p.scores, s_bytes, cudaMemcpyDeviceToHost, im.stream));
    }
    TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(im.stream));
    return Status::OK();
}

Status GpuCodeScorer::Probe(const float* h_queries, int n_queries, int q_stride, int nprobe,
                            std::vector<int32_t>* probe) {
    Impl& im = *impl_;
    if (n_queries < 0 || q_stride < 0) return Status::InvalidArgument("GpuCodeScorer::Probe: bad sizes");
    if (nprobe < 1 || nprobe > 64 || nprobe > im.n_centroids) {
        return Status::InvalidArgument("GpuCodeScorer::Probe: nprobe " + std::to_string(nprobe) +
                                       " outside [1, min(64, n_centroids)]");
    }
    const int64_t rows = int64_t(n_queries) * q_stride;
    probe->assign(size_t(rows) * nprobe, -1);
    if (rows == 0) return Status::OK();
    if (h_queries == nullptr) return Status::InvalidArgument("GpuCodeScorer::Probe: null queries");
    DeviceGuard g(im.device);
    // Rows per pass: the score tile [block, K] stays under 512 MB.
    const int64_t block = std::max<int64_t>(1, std::min<int64_t>(rows, (int64_t(128) << 20) / im.n_centroids));
    const size_t q_bytes = size_t(rows) * im.dim * sizeof(float);
    const size_t s_bytes = size_t(block) * im.n_centroids * sizeof(float);
    const size_t p_bytes = size_t(rows) * nprobe * sizeof(int32_t);
    TMS_RETURN_IF_ERROR(im.Reserve(align256(q_bytes) + align256(s_bytes) + align256(p_bytes)));
    char* base = static_cast<char*>(im.d_arena);
    float* dq = reinterpret_cast<float*>(base);
    float* ds = reinterpret_cast<float*>(base + align256(q_bytes));
    int32_t* dp = reinterpret_cast<int32_t*>(base + align256(q_bytes) + align256(s_bytes));
    TMS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dq, h_queries, q_bytes, cudaMemcpyHostToDevice, im.stream));
    for (int64_t r0 = 0; r0 < rows; r0 += block) {
        const int nr = static_cast<int>(std::min<int64_t>(block, rows - r0));
        // s[r, k] row-major = column-major [K, nr] = C^T(K x d) . Q(d x nr)
        const float one = 1.f, zero = 0.f;
        TMS_CUBLAS_RETURN_IF_ERROR(cublasSgemm(im.blas, CUBLAS_OP_T, CUBLAS_OP_N, im.n_centroids, nr, im.dim, &one,
                                               im.d_cent, im.dim, dq + r0 * im.dim, im.dim, &zero, ds, im.n_centroids));
        const int warps = 8;
        row_top_n<<<static_cast<unsigned>((nr + warps - 1) / warps), warps * 32, 0, im.stream>>>(
            ds, nr, im.n_centroids, nprobe, dp + r0 * nprobe);
        TMS_CUDA_CHECK_LAUNCH();
    }
    TMS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(probe->data(), dp, p_bytes, cudaMemcpyDeviceToHost, im.stream));
    TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(im.stream));
    return Status::OK();
}

}  // namespace tms::engine

// Copyright TileMaxSim authors. GpuExactScorer: one shard's fp16 token vectors resident on one
// GPU; per call, the queries and candidate lists go up, kernels::maxsim_cuda /
// maxsim_topk_cuda run on the scorer's own stream, and results come back. Per-call buffers
// live in one device arena that grows (never shrinks) and is reused between calls.
// Thread-safety: one call at a time per scorer.
#include <cuda_runtime.h>

#include <omp.h>

#include <algorithm>
#include <string>

#include "engine/gpu_scorer.h"
#include "engine/vector_rows.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gpu_context.h"
#include "kernels/cuda/upload.h"
#include "kernels/cuda/maxsim_cuda.h"

namespace tms::engine {
using kernels::align256;
using kernels::DeviceGuard;

namespace {

// Every row of `rows` into d_dst, read by the process's OpenMP thread count of threads, a file
// chunk (or 64 MiB of host rows) each in turn, while the pieces already read upload.
Status UploadRows(int device, cudaStream_t stream, const VectorRows& rows, void* d_dst) {
    const size_t row = size_t(rows.dim) * sizeof(uint16_t);
    const size_t stage = std::max<size_t>(1, (size_t(8) << 20) / row) * row;
    const std::vector<int64_t> pieces = rows.Pieces(int64_t((size_t(64) << 20) / row));
    std::vector<size_t> bounds(pieces.size());
    for (size_t i = 0; i < pieces.size(); ++i) bounds[i] = size_t(pieces[i]) * row;
    std::vector<uint32_t> crc(pieces.size(), 0);  // each piece's, carried between its stages
    return kernels::ParallelUpload(device, stream, d_dst, bounds, stage, omp_get_max_threads(),
                                   [&](size_t i, size_t offset, size_t n, void* dst) {
                                       return rows.ReadInPiece(pieces[i] + int64_t(offset / row), int64_t(n / row),
                                                               static_cast<uint16_t*>(dst), &crc[i]);
                                   });
}

}  // namespace

/// The per-call inputs and outputs every exact scorer on one GPU shares (GpuContext::Scratch).
struct ExactScorerScratch {
    kernels::DeviceScratch arena;  // grows with headroom
};

struct GpuExactScorer::Impl {
    explicit Impl(std::shared_ptr<kernels::GpuContext> c)
        : ctx(std::move(c)),
          device(ctx->device()),
          stream(ctx->stream()),
          arena(ctx->Scratch<ExactScorerScratch>().arena) {}
    std::shared_ptr<kernels::GpuContext> ctx;
    int device;
    cudaStream_t stream;
    kernels::DeviceScratch& arena;
    int dim = 0;
    int64_t n_docs = 0;
    int64_t n_tokens = 0;  // rows of d_tokens (lets the kernel use bulk tensor copies)
    void* d_tokens = nullptr;
    int64_t* d_offsets = nullptr;

    ~Impl() {
        DeviceGuard g(device);
        cudaStreamSynchronize(stream);
        cudaFree(d_offsets);
        cudaFree(d_tokens);
    }

    Status Reserve(size_t bytes) { return arena.Reserve(bytes, stream, /*headroom=*/true); }

    /// Uploads the per-call inputs (and `rows`, when given) into the arena (plus `extra` bytes
    /// after them) and fills p.
    Status Upload(const void* h_queries, DType q_dtype, int n_queries, int q_stride, const int32_t* h_query_lens,
                  const int64_t* h_cand_offsets, const int32_t* h_cand_docs, const Rows* rows, size_t extra_bytes,
                  kernels::MaxSimParams* p, char** extra) {
        const int64_t docs = rows ? rows->n_docs : n_docs;
        if (!rows && !d_offsets)
            return Status::InvalidArgument("GpuExactScorer: no documents (a call must bring rows)");
        if (rows) {
            if (rows->n_docs < 0 ||
                (rows->n_docs > 0 && (!rows->offsets || (!rows->tokens && !rows->sources && !rows->device_tokens))) ||
                (rows->offsets && rows->offsets[0] != 0)) {
                return Status::InvalidArgument("GpuExactScorer: bad rows");
            }
        }
        int64_t n_cand = 0;
        TMS_RETURN_IF_ERROR(kernels::validate_host_batch("GpuExactScorer", n_queries, q_stride, h_queries, h_query_lens,
                                                         h_cand_offsets, h_cand_docs, docs, &n_cand));
        const int64_t row_tokens = rows && rows->n_docs > 0 ? rows->offsets[rows->n_docs] : 0;
        const size_t q_bytes = size_t(n_queries) * q_stride * dim * DTypeSize(q_dtype);
        const size_t l_bytes = h_query_lens ? size_t(n_queries) * sizeof(int32_t) : 0;
        const size_t co_bytes = h_cand_offsets ? size_t(n_queries + 1) * sizeof(int64_t) : 0;
        const size_t cd_bytes = size_t(n_cand) * sizeof(int32_t);
        // Staged rows (device_tokens) are read where they are: no room, no copy.
        const bool staged = rows && rows->device_tokens;
        const size_t rt_bytes = staged ? 0 : size_t(row_tokens) * dim * sizeof(uint16_t);
        const size_t ro_bytes = rows ? size_t(rows->n_docs + 1) * sizeof(int64_t) : 0;
        const size_t rs_bytes = rows && rows->sources ? size_t(rows->n_docs) * sizeof(void*) : 0;
        const size_t total = align256(q_bytes) + align256(l_bytes) + align256(co_bytes) + align256(cd_bytes) +
                             align256(rt_bytes) + align256(ro_bytes) + align256(rs_bytes) + align256(extra_bytes);
        TMS_RETURN_IF_ERROR(Reserve(std::max<size_t>(total, 256)));
        char* cur = static_cast<char*>(arena.p);
        auto put = [&](const void* h, size_t bytes, void** d) -> Status {
            *d = bytes ? cur : nullptr;
            if (bytes) TMS_RETURN_IF_ERROR(ctx->inputs().Upload(cur, h, bytes));
            cur += align256(bytes);
            return Status::OK();
        };
        void *dq, *dl, *dco, *dcd, *drt = nullptr, *dro = nullptr;
        TMS_RETURN_IF_ERROR(put(h_queries, q_bytes, &dq));
        TMS_RETURN_IF_ERROR(put(h_query_lens, l_bytes, &dl));
        TMS_RETURN_IF_ERROR(put(h_cand_offsets, co_bytes, &dco));
        TMS_RETURN_IF_ERROR(put(h_cand_docs, cd_bytes, &dcd));
        if (rows) {
            // The rows are the bulk: one copy on the stream (from pinned memory, a DMA at
            // full link speed), not through the staging buffers of the small inputs; staged
            // rows were copied on the copy stream, and the stream waits for that copy.
            drt = staged ? static_cast<void*>(const_cast<uint16_t*>(rows->device_tokens)) : static_cast<void*>(cur);
            if (staged && rows->ready) {
                TMS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(rows->ready), 0));
            }
            if (rt_bytes && !rows->sources) {
                TMS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(cur, rows->tokens, rt_bytes, cudaMemcpyHostToDevice, stream));
            }
            cur += align256(rt_bytes);
            TMS_RETURN_IF_ERROR(put(rows->offsets, ro_bytes, &dro));
            if (rows->sources && !staged && rows->n_docs > 0) {
                void* drs = nullptr;
                TMS_RETURN_IF_ERROR(put(rows->sources, rs_bytes, &drs));
                TMS_RETURN_IF_ERROR(kernels::gather_rows_cuda(static_cast<const uint16_t* const*>(drs),
                                                              static_cast<const int64_t*>(dro), rows->n_docs, dim,
                                                              static_cast<uint16_t*>(drt), stream));
            }
        }
        *extra = cur;
        p->queries = dq;
        p->q_dtype = q_dtype;
        p->n_queries = n_queries;
        p->q_stride = q_stride;
        p->dim = dim;
        p->query_lens = static_cast<const int32_t*>(dl);
        p->doc_tokens = rows ? drt : d_tokens;
        p->d_dtype = DType::kF16;
        p->doc_offsets = rows ? static_cast<const int64_t*>(dro) : d_offsets;
        p->n_docs = docs;
        p->n_tokens = rows ? row_tokens : n_tokens;
        p->docs_static = !rows;  // resident: uploaded and synchronised in Create
        p->cand_offsets = static_cast<const int64_t*>(dco);
        p->cand_docs =
            h_cand_offsets ? (dcd ? static_cast<const int32_t*>(dcd) : reinterpret_cast<const int32_t*>(cur)) : nullptr;
        return Status::OK();
    }
};

GpuExactScorer::~GpuExactScorer() = default;

bool GpuExactScorer::resident() const { return impl_->d_offsets != nullptr; }

Status GpuExactScorer::CreateForRows(std::shared_ptr<kernels::GpuContext> ctx, int dim,
                                     std::unique_ptr<GpuExactScorer>* out) {
    if (dim % 32 != 0 || dim <= 0 || dim > 1024) {
        return Status::NotSupported("GpuExactScorer: dim " + std::to_string(dim) + " (multiples of 32 up to 1024)");
    }
    if (!ctx) return Status::InvalidArgument("GpuExactScorer: no GPU context");
    std::unique_ptr<GpuExactScorer> s(new GpuExactScorer());
    s->impl_ = std::make_unique<Impl>(std::move(ctx));
    s->impl_->dim = dim;
    *out = std::move(s);
    return Status::OK();
}

Status GpuExactScorer::Create(std::shared_ptr<kernels::GpuContext> ctx, const std::vector<TokenPart>& parts, int dim,
                              const int64_t* h_doc_offsets, int64_t n_docs, std::unique_ptr<GpuExactScorer>* out) {
    int64_t n_tokens = 0;
    for (const TokenPart& p : parts) {
        if (p.n_tokens < 0) return Status::InvalidArgument("GpuExactScorer: bad sizes");
        if (p.n_tokens > 0 && p.data == nullptr && p.rows == nullptr) {
            return Status::InvalidArgument("GpuExactScorer: tokens null");
        }
        if (p.rows && p.rows->n_tokens() != p.n_tokens) return Status::InvalidArgument("GpuExactScorer: bad rows");
        n_tokens += p.n_tokens;
    }
    if (n_docs < 0 || dim <= 0) return Status::InvalidArgument("GpuExactScorer: bad sizes");
    if (h_doc_offsets == nullptr) return Status::InvalidArgument("GpuExactScorer: doc_offsets null");
    if (dim % 32 != 0 || dim > 1024) {
        return Status::NotSupported("GpuExactScorer: dim " + std::to_string(dim) + " (multiples of 32 up to 1024)");
    }
    if (!ctx) return Status::InvalidArgument("GpuExactScorer: no GPU context");
    const int device = ctx->device();
    int n_dev = 0;
    TMS_RETURN_IF_ERROR(kernels::cuda_device_count(&n_dev));
    TMS_RETURN_IF_ERROR(kernels::validate_shard("GpuExactScorer", h_doc_offsets, n_docs, n_tokens, device, n_dev));
    DeviceGuard g(device);
    if (!g.ok()) return Status::Internal("GpuExactScorer: cannot select device " + std::to_string(device));
    std::unique_ptr<GpuExactScorer> s(new GpuExactScorer());
    s->impl_ = std::make_unique<Impl>(std::move(ctx));
    Impl& im = *s->impl_;
    im.dim = dim;
    im.n_docs = n_docs;
    im.n_tokens = n_tokens;
    const size_t tok_bytes = size_t(n_tokens) * dim * sizeof(uint16_t);
    TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.d_tokens, std::max<size_t>(tok_bytes, 256)));
    TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.d_offsets, size_t(n_docs + 1) * sizeof(int64_t)));
    {
        kernels::StagedUploader uploader(im.stream);
        char* at = static_cast<char*>(im.d_tokens);
        for (const TokenPart& p : parts) {
            const size_t bytes = size_t(p.n_tokens) * dim * sizeof(uint16_t);
            TMS_RETURN_IF_ERROR(p.rows ? UploadRows(device, im.stream, *p.rows, at)
                                       : uploader.Upload(at, p.data, bytes));
            at += bytes;
        }
    }
    TMS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(im.d_offsets, h_doc_offsets, size_t(n_docs + 1) * sizeof(int64_t),
                                             cudaMemcpyHostToDevice, im.stream));
    TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(im.stream));
    *out = std::move(s);
    return Status::OK();
}

Status GpuExactScorer::Score(const void* h_queries, DType q_dtype, int n_queries, int q_stride,
                             const int32_t* h_query_lens, const int64_t* h_cand_offsets, const int32_t* h_cand_docs,
                             std::vector<float>* scores, const Rows* rows) {
    Impl& im = *impl_;
    DeviceGuard g(im.device);
    const int64_t n_out = h_cand_offsets ? (n_queries > 0 ? h_cand_offsets[n_queries] : 0)
                                         : int64_t(std::max(0, n_queries)) * (rows ? rows->n_docs : im.n_docs);
    kernels::MaxSimParams p;
    char* extra = nullptr;
    TMS_RETURN_IF_ERROR(im.Upload(h_queries, q_dtype, n_queries, q_stride, h_query_lens, h_cand_offsets, h_cand_docs,
                                  rows, size_t(n_out) * sizeof(float), &p, &extra));
    p.scores = reinterpret_cast<float*>(extra);
    TMS_RETURN_IF_ERROR(kernels::maxsim_cuda(p, im.stream));
    scores->resize(size_t(n_out));
    if (n_out) {
        TMS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(scores->data(), p.scores, size_t(n_out) * sizeof(float),
                                                 cudaMemcpyDeviceToHost, im.stream));
    }
    TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(im.stream));
    return Status::OK();
}

Status GpuExactScorer::ScoreTopK(const void* h_queries, DType q_dtype, int n_queries, int q_stride,
                                 const int32_t* h_query_lens, const int64_t* h_cand_offsets, const int32_t* h_cand_docs,
                                 int k, std::vector<int32_t>* ids, std::vector<float>* scores, const Rows* rows) {
    Impl& im = *impl_;
    DeviceGuard g(im.device);
    if (k < 1 || k > kernels::kMaxTopKCuda) {
        return Status::InvalidArgument("GpuExactScorer: k = " + std::to_string(k) + " outside [1, 1024]");
    }
    // Workspace size depends only on sizes; compute it with a params stub.
    kernels::MaxSimParams sizes;
    sizes.n_queries = n_queries;
    sizes.q_stride = q_stride;
    sizes.dim = im.dim;
    sizes.n_docs = rows ? rows->n_docs : im.n_docs;
    sizes.q_dtype = q_dtype;
    sizes.d_dtype = DType::kF16;
    // Only sizes and the nullness of pointers matter here (nothing is read).
    const void* any = &sizes;
    sizes.queries = any;
    sizes.doc_tokens = any;
    sizes.doc_offsets = static_cast<const int64_t*>(any);
    sizes.cand_offsets = h_cand_offsets ? static_cast<const int64_t*>(any) : nullptr;
    sizes.cand_docs = h_cand_offsets ? static_cast<const int32_t*>(any) : nullptr;
    const size_t ws = kernels::maxsim_topk_cuda_workspace_bytes(sizes, k);
    const size_t out_n = size_t(std::max(0, n_queries)) * k;
    const size_t ids_bytes = align256(out_n * sizeof(int32_t));
    const size_t sc_bytes = align256(out_n * sizeof(float));
    kernels::MaxSimParams p;
    char* extra = nullptr;
    TMS_RETURN_IF_ERROR(im.Upload(h_queries, q_dtype, n_queries, q_stride, h_query_lens, h_cand_offsets, h_cand_docs,
                                  rows, ws + ids_bytes + sc_bytes, &p, &extra));
    int32_t* d_ids = reinterpret_cast<int32_t*>(extra);
    float* d_sc = reinterpret_cast<float*>(extra + ids_bytes);
    void* d_ws = extra + ids_bytes + sc_bytes;
    TMS_RETURN_IF_ERROR(kernels::maxsim_topk_cuda(p, k, d_ids, d_sc, d_ws, ws, im.stream));
    ids->resize(out_n);
    scores->resize(out_n);
    if (out_n) {
        TMS_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(ids->data(), d_ids, out_n * sizeof(int32_t), cudaMemcpyDeviceToHost, im.stream));
        TMS_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(scores->data(), d_sc, out_n * sizeof(float), cudaMemcpyDeviceToHost, im.stream));
    }
    TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(im.stream));
    return Status::OK();
}

}  // namespace tms::engine

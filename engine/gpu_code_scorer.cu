// Copyright TileMaxSim authors. GpuCodeScorer: one shard's compressed tokens resident on one
// GPU; per call the queries, centroid scores (or a cuBLAS Q.C^T on the device) and candidate
// lists go up, kernels::code_maxsim_cuda runs on the scorer's own stream, and the scores come
// back. Per-call buffers live in one device arena that grows (never shrinks).
// Thread-safety: one call at a time per scorer.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cub/device/device_segmented_sort.cuh>

#include <algorithm>
#include <utility>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "base/fault.h"
#include "base/progress.h"
#include "engine/gpu_code_scorer.h"
#include "kernels/cuda/candidates_cuda.h"
#include "kernels/cuda/code_maxsim_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gpu_context.h"
#include "kernels/cuda/upload.h"
#include "kernels/cuda/maxsim_cuda.h"
#include "kernels/cuda/raw_to_float.cuh"

namespace tms::engine {
using kernels::align256;
using kernels::DeviceGuard;

namespace {

// Consecutive 256-byte-aligned blocks carved out of an arena reserved for their sum.
struct Carver {
    char* cur;
    char* take(size_t bytes) {
        char* p = cur;
        cur += align256(bytes);
        return p;
    }
};

/// Blocks of 256 threads for a grid-stride loop over n elements (at most 4,096).
unsigned stride_blocks(int64_t n) { return unsigned(std::min<int64_t>((n + 255) / 256, 4096)); }

}  // namespace

/// What every compressed scorer on one GPU shares (GpuContext::Scratch): the per-call arenas,
/// and what the last Candidates call left in them for ScoreCandidates.
struct CodeScorerScratch {
    kernels::DeviceScratch arena;    // per-call inputs and workspaces (grows with headroom)
    kernels::DeviceScratch g_rows3;  // CentroidScores: the query rows as hi, hi, lo
    // Candidates' second phase (sized once the candidate counts are known).
    kernels::DeviceScratch g_docs, g_scores, g_keys, g_vals, g_temp, g_table, g_heads, g_new_off;
    // Probe-score pruning: the dense scores [n_queries, n_docs] and their histograms.
    kernels::DeviceScratch g_dense, g_hist;
    // ScoreCandidatesTop's output (the kept documents, their scores, offsets).
    kernels::DeviceScratch t_docs, t_scores, t_off;
    /// What the last Candidates call left on the device for ScoreCandidates (pointers into
    /// arena, g_docs / g_heads, g_new_off, g_table); any other call of any scorer on the device
    /// invalidates it.
    struct LastCandidates {
        bool valid = false;
        const void* owner = nullptr;  // the scorer whose Candidates call it was
        int q_stride = 0;
        const float* dq = nullptr;
        const int32_t* dl = nullptr;
        const float* dcs = nullptr;
        const int64_t* d_off = nullptr;
        const int32_t* d_docs = nullptr;
        std::vector<int64_t> h_off;  // the offsets Candidates returned: [n_queries + 1], h_off.back() candidates
        bool table_built = false;    // g_table holds these queries' centroid-score table
        uint64_t ticket = 0;         // the Candidates call's ticket (ScoreLists reuses its state)
    } last;
    uint64_t tickets = 0;  // Candidates calls on the device so far
};

struct GpuCodeScorer::Impl {
    explicit Impl(std::shared_ptr<kernels::GpuContext> c)
        : ctx(std::move(c)),
          device(ctx->device()),
          stream(ctx->stream()),
          blas(ctx->blas()),
          sc(ctx->Scratch<CodeScorerScratch>()),
          arena(sc.arena),
          g_rows3(sc.g_rows3),
          g_docs(sc.g_docs),
          g_scores(sc.g_scores),
          g_keys(sc.g_keys),
          g_vals(sc.g_vals),
          g_temp(sc.g_temp),
          g_table(sc.g_table),
          g_heads(sc.g_heads),
          g_new_off(sc.g_new_off),
          g_dense(sc.g_dense),
          g_hist(sc.g_hist),
          t_docs(sc.t_docs),
          t_scores(sc.t_scores),
          t_off(sc.t_off),
          last(sc.last) {}
    std::shared_ptr<kernels::GpuContext> ctx;
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    CodeScorerScratch& sc;
    int dim = 0;
    int n_code_bytes = 0;
    bool codebook_shared = false;  // every code byte's block is the same (residual codecs)
    int n_centroids = 0;
    int64_t n_docs = 0;
    uint32_t* d_tc = nullptr;
    uint8_t* d_codes = nullptr;
    int64_t n_tokens = 0;
    float* d_scales = nullptr;  // NormalizeDecoded's, or null
    float* d_book = nullptr;
    void* d_book_image = nullptr;  // d_book in the kernel's fp16 layout (code_codebook_image_cuda)
    float* d_cent3 = nullptr;      // the centroids [n_centroids, 3 * dim] as hi, lo, hi (split_tf32x3)
    int64_t* d_offsets = nullptr;
    int64_t* d_ivf_off = nullptr;  // SetIvf
    int32_t* d_ivf_docs = nullptr;
    int32_t* d_ivf_rix = nullptr;  // the lists' range index (kernels::ivf_range_index_cuda)
    // The device's shared scratch (CodeScorerScratch), by name.
    kernels::DeviceScratch &arena, &g_rows3, &g_docs, &g_scores, &g_keys, &g_vals, &g_temp, &g_table, &g_heads,
        &g_new_off, &g_dense, &g_hist, &t_docs, &t_scores, &t_off;
    using LastCandidates = CodeScorerScratch::LastCandidates;
    LastCandidates& last;
    kernels::StagedUploader& inputs() { return ctx->inputs(); }

    /// The shard half of the kernel parameters (and the batch shape); the caller sets the
    /// query, candidate and output pointers.
    kernels::CodeMaxSimParams ShardParams(int n_queries, int q_stride, bool centroids_only) const {
        kernels::CodeMaxSimParams p;
        p.n_queries = n_queries;
        p.q_stride = q_stride;
        p.dim = dim;
        p.n_centroids = n_centroids;
        p.token_centroids = d_tc;
        p.n_code_bytes = centroids_only ? 0 : n_code_bytes;
        p.codes = centroids_only ? nullptr : d_codes;
        p.codebook = centroids_only ? nullptr : d_book;
        p.codebook_shared = !centroids_only && codebook_shared;
        p.codebook_image = centroids_only ? nullptr : d_book_image;
        p.token_scales = centroids_only ? nullptr : d_scales;
        p.doc_offsets = d_offsets;
        p.n_docs = n_docs;
        return p;
    }

    ~Impl() {
        DeviceGuard g(device);
        cudaStreamSynchronize(stream);
        if (last.owner == this) last = LastCandidates{};
        cudaFree(d_ivf_off);
        cudaFree(d_ivf_docs);
        cudaFree(d_ivf_rix);
        cudaFree(d_offsets);
        cudaFree(d_cent3);
        cudaFree(d_book_image);
        cudaFree(d_book);
        cudaFree(d_codes);
        cudaFree(d_scales);
        cudaFree(d_tc);
    }

    Status Reserve(size_t bytes) { return arena.Reserve(bytes, stream, /*headroom=*/true); }

    /// out [rows, K] row-major = rows [rows, dim] . centroids^T, to fp32 accuracy, on the stream:
    /// one TF32 tensor-core GEMM over the split operands (split_tf32x3), column-major K x rows =
    /// C3^T (K x 3dim) . Q3 (3dim x rows): three times the products of an fp32 SGEMM on tensor
    /// cores instead of fp32 FMAs, which is faster than an SGEMM at probing shapes.
    Status CentroidScores(const float* d_rows, int64_t rows, float* out) {
        if (rows == 0) return Status::OK();
        TMS_RETURN_IF_ERROR(g_rows3.Reserve(size_t(rows) * 3 * dim * sizeof(float), stream, /*headroom=*/true));
        float* rows3 = static_cast<float*>(g_rows3.p);
        TMS_RETURN_IF_ERROR(kernels::split_tf32x3_cuda(d_rows, rows, dim, 0b100u, rows3, stream));
        const float one = 1.f, zero = 0.f;
        TMS_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, n_centroids, int(rows), 3 * dim, &one,
                                                d_cent3, CUDA_R_32F, 3 * dim, rows3, CUDA_R_32F, 3 * dim, &zero, out,
                                                CUDA_R_32F, n_centroids, CUBLAS_COMPUTE_32F_FAST_TF32,
                                                CUBLAS_GEMM_DEFAULT));
        return Status::OK();
    }

    /// probe [rows, nprobe] = the nprobe best centroids of each score row (row_top_n, 8 rows
    /// per CTA, on the stream).
    Status TopCentroids(const float* scores, int64_t rows, int nprobe, int32_t* probe) {
        return kernels::row_top_n_cuda(scores, rows, n_centroids, nprobe, probe, stream);
    }

    /// The `keep` best of each list [d_off[q], d_off[q + 1]) of (d_scores, d_docs), score
    /// descending, lower document first (h_off: the same offsets on the host): their offsets
    /// into *new_off (host) and out_off, the documents into out_docs and, when out_scores is
    /// given, the scores into it (device). One segmented sort of (score, document) keys.
    Status KeepBest(const float* d_scores, const int32_t* d_docs, const int64_t* d_off,
                    const std::vector<int64_t>& h_off, int keep, std::vector<int64_t>* new_off,
                    kernels::DeviceScratch& out_off, kernels::DeviceScratch& out_docs,
                    kernels::DeviceScratch* out_scores) {
        const int nq = int(h_off.size()) - 1;
        const int64_t total = h_off.back();
        new_off->assign(size_t(nq) + 1, 0);
        for (int q = 0; q < nq; ++q)
            (*new_off)[q + 1] = (*new_off)[q] + std::min<int64_t>(h_off[q + 1] - h_off[q], keep);
        const int64_t kept = new_off->back();
        const size_t key_bytes = size_t(total) * sizeof(uint64_t), o_bytes = size_t(nq + 1) * sizeof(int64_t);
        TMS_RETURN_IF_ERROR(g_keys.Reserve(key_bytes, stream));
        TMS_RETURN_IF_ERROR(g_vals.Reserve(key_bytes, stream));
        TMS_RETURN_IF_ERROR(out_off.Reserve(o_bytes, stream));
        TMS_RETURN_IF_ERROR(out_docs.Reserve(size_t(kept) * sizeof(int32_t), stream));
        if (out_scores) TMS_RETURN_IF_ERROR(out_scores->Reserve(size_t(kept) * sizeof(float), stream));
        TMS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out_off.p, new_off->data(), o_bytes, cudaMemcpyHostToDevice, stream));
        if (kept == 0) return Status::OK();
        auto* keys = static_cast<uint64_t*>(g_keys.p);
        auto* sorted = static_cast<uint64_t*>(g_vals.p);
        TMS_RETURN_IF_ERROR(kernels::score_doc_keys_cuda(d_scores, d_docs, total, keys, stream));
        size_t temp_bytes = 0;
        TMS_CUDA_RETURN_IF_ERROR(cub::DeviceSegmentedSort::SortKeysDescending(nullptr, temp_bytes, keys, sorted, total,
                                                                              nq, d_off, d_off + 1, stream));
        TMS_RETURN_IF_ERROR(g_temp.Reserve(temp_bytes, stream));
        TMS_CUDA_RETURN_IF_ERROR(cub::DeviceSegmentedSort::SortKeysDescending(g_temp.p, temp_bytes, keys, sorted, total,
                                                                              nq, d_off, d_off + 1, stream));
        return kernels::gather_top_keys_cuda(sorted, d_off, static_cast<const int64_t*>(out_off.p), nq,
                                             static_cast<int32_t*>(out_docs.p),
                                             out_scores ? static_cast<float*>(out_scores->p) : nullptr, stream);
    }

    /// The per-query candidate counts dcount [nq] (device) as offsets: *off [nq + 1] on the host
    /// and doff on the device (enqueued; *off must outlive the stream's next synchronisation),
    /// and *max_count the largest count.
    Status CountsToOffsets(const int64_t* dcount, int nq, int64_t* doff, std::vector<int64_t>* off,
                           int64_t* max_count) {
        std::vector<int64_t> counts(static_cast<size_t>(nq));
        TMS_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(counts.data(), dcount, size_t(nq) * sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
        TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
        *max_count = 0;
        for (int q = 0; q < nq; ++q) {
            (*off)[q + 1] = (*off)[q] + counts[q];
            *max_count = std::max(*max_count, counts[q]);
        }
        if (off->back() > INT32_MAX) {
            return Status::ResourceExhausted("GpuCodeScorer::Candidates: more than 2^31 candidates in one batch");
        }
        TMS_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(doff, off->data(), size_t(nq + 1) * sizeof(int64_t), cudaMemcpyHostToDevice, stream));
        return Status::OK();
    }

    /// Records what a Candidates call leaves on the device for ScoreCandidates.
    void SetLast(int q_stride, const float* dq, const int32_t* dl, const float* dcs, const int64_t* d_off,
                 const int32_t* d_docs, const std::vector<int64_t>& h_off, bool table_built) {
        last.valid = true;
        last.owner = this;
        last.q_stride = q_stride;
        last.dq = dq;
        last.dl = dl;
        last.dcs = dcs;
        last.d_off = d_off;
        last.d_docs = d_docs;
        last.h_off = h_off;
        last.table_built = table_built;
    }

    /// Probing with scores, then the `keep` best documents of each query by probe score
    /// (kernels::ProbeScoreParams) into g_heads at the offsets g_new_off (*new_off on the host).
    /// u: the probes (written to dp = u.probe), lengths and lists; dcs the centroid scores; dps [rows *
    /// (nprobe + 1)] floats, dthr [2 * n_queries], dcount [n_queries], doff [n_queries + 1]
    /// workspaces; *off gets the offsets of the emitted lists (a superset of the kept ones);
    /// kept_scores (when given) the kept documents' scores.
    template <class TraceFn>
    Status ProbeCandidates(const kernels::IvfUnionParams& u, int32_t* dp, const float* dcs, float* dps, uint32_t* dthr,
                           int64_t* dcount, int64_t* doff, int keep, std::vector<int64_t>* off,
                           std::vector<int64_t>* new_off, kernels::DeviceScratch* kept_scores, TraceFn& trace) {
        const int nq = u.n_queries, nprobe = u.nprobe;
        const int64_t rows = int64_t(nq) * u.q_stride;
        float* floors = dps + rows * nprobe;
        const int n = std::min(nprobe + 1, n_centroids);
        TMS_RETURN_IF_ERROR(kernels::row_top_n_scores_cuda(dcs, rows, n_centroids, n, nprobe, dp, dps, floors, stream));
        trace("probe");
        kernels::ProbeScoreParams pp;
        pp.lists = u;
        pp.probe_scores = dps;
        pp.floor_scores = floors;
        pp.keep = keep;
        const size_t dense_bytes = size_t(nq) * size_t(n_docs) * sizeof(uint32_t);
        const size_t hist_bytes = size_t(nq) * kernels::kProbeBins * sizeof(uint32_t);
        TMS_RETURN_IF_ERROR(g_dense.Reserve(std::max<size_t>(dense_bytes, 4), stream));
        TMS_RETURN_IF_ERROR(g_hist.Reserve(hist_bytes, stream));
        TMS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(g_hist.p, 0, hist_bytes, stream));
        auto* dense = static_cast<uint32_t*>(g_dense.p);
        auto* hist = static_cast<uint32_t*>(g_hist.p);
        TMS_RETURN_IF_ERROR(kernels::probe_accumulate_cuda(pp, d_ivf_rix, dense, hist, stream));
        trace("probe scores");
        TMS_RETURN_IF_ERROR(kernels::probe_threshold_cuda(hist, nq, keep, dthr, dcount, stream));
        int64_t max_count = 0;
        TMS_RETURN_IF_ERROR(CountsToOffsets(dcount, nq, doff, off, &max_count));
        const int64_t total = off->back();
        TMS_RETURN_IF_ERROR(g_docs.Reserve(std::max<size_t>(size_t(total) * sizeof(int32_t), 4), stream));
        TMS_RETURN_IF_ERROR(g_scores.Reserve(std::max<size_t>(size_t(total) * sizeof(float), 4), stream));
        uint32_t* cursor = dthr + nq;
        TMS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(cursor, 0, size_t(nq) * sizeof(uint32_t), stream));
        auto* docs = static_cast<int32_t*>(g_docs.p);
        auto* scores = static_cast<float*>(g_scores.p);
        TMS_RETURN_IF_ERROR(kernels::probe_emit_cuda(dense, nq, n_docs, dthr, doff, cursor, docs, scores, stream));
        trace("emit");
        TMS_RETURN_IF_ERROR(KeepBest(scores, docs, doff, *off, keep, new_off, g_new_off, g_heads, kept_scores));
        trace("sort");
        return Status::OK();
    }

    /// Query rows to the device as fp32 into dq [rows, dim]: 16-bit ones through draw (rows x dim
    /// of q_dtype), converted there.
    Status QueriesToDevice(const void* h_queries, DType q_dtype, int64_t rows, float* dq, void* draw) {
        if (q_dtype == DType::kF32) return inputs().Upload(dq, h_queries, size_t(rows) * dim * sizeof(float));
        TMS_RETURN_IF_ERROR(inputs().Upload(draw, h_queries, size_t(rows) * dim * DTypeSize(q_dtype)));
        const int64_t n = rows * dim;
        kernels::raw_to_float<<<stride_blocks(n), 256, 0, stream>>>(draw, static_cast<int>(q_dtype), n, dq, nullptr);
        TMS_CUDA_CHECK_LAUNCH();
        return Status::OK();
    }

    Status CheckNprobe(const char* who, int nprobe) const {
        if (nprobe < 1 || nprobe > 64 || nprobe > n_centroids) {
            return Status::InvalidArgument(std::string(who) + ": nprobe " + std::to_string(nprobe) +
                                           " outside [1, min(64, n_centroids)]");
        }
        return Status::OK();
    }
};

GpuCodeScorer::~GpuCodeScorer() = default;

Status GpuCodeScorer::Create(std::shared_ptr<kernels::GpuContext> ctx, const uint32_t* h_token_centroids,
                             const uint8_t* h_codes, int64_t n_tokens, int n_code_bytes, const float* h_codebook,
                             const float* h_centroids, int n_centroids, int dim, const int64_t* h_doc_offsets,
                             int64_t n_docs, std::unique_ptr<GpuCodeScorer>* out) {
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
    if (!ctx) return Status::InvalidArgument("GpuCodeScorer: no GPU context");
    const int device = ctx->device();
    int n_dev = 0;
    TMS_RETURN_IF_ERROR(kernels::cuda_device_count(&n_dev));
    TMS_RETURN_IF_ERROR(kernels::validate_shard("GpuCodeScorer", h_doc_offsets, n_docs, n_tokens, device, n_dev));
    DeviceGuard g(device);
    if (!g.ok()) return Status::Internal("GpuCodeScorer: cannot select device " + std::to_string(device));
    TMS_RETURN_IF_ERROR(kernels::code_maxsim_cuda_supported(dim, n_code_bytes));
    std::unique_ptr<GpuCodeScorer> s(new GpuCodeScorer());
    s->impl_ = std::make_unique<Impl>(std::move(ctx));
    Impl& im = *s->impl_;
    im.dim = dim;
    im.n_code_bytes = n_code_bytes;
    im.codebook_shared = kernels::codebook_blocks_equal(h_codebook, dim, n_code_bytes);
    im.n_centroids = n_centroids;
    im.n_docs = n_docs;
    im.n_tokens = n_tokens;
    im.last.valid = false;  // the arena is used below
    kernels::StagedUploader uploader(im.stream);
    auto up = [&](auto** d, const void* h, size_t bytes) -> Status {
        TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(d), std::max<size_t>(bytes, 256)));
        return uploader.Upload(*d, h, bytes);
    };
    TMS_RETURN_IF_ERROR(up(&im.d_tc, h_token_centroids, size_t(n_tokens) * sizeof(uint32_t)));
    TMS_RETURN_IF_ERROR(up(&im.d_codes, h_codes, size_t(n_tokens) * n_code_bytes));
    TMS_RETURN_IF_ERROR(up(&im.d_book, h_codebook,
                           size_t(n_code_bytes) * 256 * (n_code_bytes ? dim / n_code_bytes : 0) * sizeof(float)));
    {  // the centroids, uploaded, then kept only as their TF32 parts (CentroidScores)
        const size_t c_bytes = size_t(n_centroids) * dim * sizeof(float);
        kernels::DeviceScratch cent;
        TMS_RETURN_IF_ERROR(cent.Reserve(c_bytes, im.stream));
        TMS_RETURN_IF_ERROR(uploader.Upload(cent.p, h_centroids, c_bytes));
        TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.d_cent3, 3 * std::max<size_t>(c_bytes, 256)));
        TMS_RETURN_IF_ERROR(kernels::split_tf32x3_cuda(static_cast<const float*>(cent.p), n_centroids, dim, 0b010u,
                                                       im.d_cent3, im.stream));
        TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(im.stream));  // before cent is freed
    }
    TMS_RETURN_IF_ERROR(up(&im.d_offsets, h_doc_offsets, size_t(n_docs + 1) * sizeof(int64_t)));
    // The codebook in the kernel's shared-memory layout, made once: every launch's CTAs copy it
    // instead of converting the fp32 codebook.
    const kernels::CodeMaxSimParams bp = im.ShardParams(0, 0, /*centroids_only=*/false);
    if (const size_t image_bytes = kernels::code_codebook_image_bytes(bp); image_bytes > 0) {
        TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.d_book_image, image_bytes));
        TMS_RETURN_IF_ERROR(kernels::code_codebook_image_cuda(bp, im.d_book_image, im.stream));
    }
    // cuBLAS loads its kernels on the first GEMM (130 ms measured on an H200): pay that here,
    // at open, rather than in the first search.
    TMS_RETURN_IF_ERROR(
        im.Reserve(align256(size_t(dim) * sizeof(float)) + align256(size_t(n_centroids) * sizeof(float))));
    TMS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(im.arena.p, 0, size_t(dim) * sizeof(float), im.stream));
    TMS_RETURN_IF_ERROR(im.CentroidScores(
        static_cast<const float*>(im.arena.p), 1,
        reinterpret_cast<float*>(static_cast<char*>(im.arena.p) + align256(size_t(dim) * sizeof(float)))));
    TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(im.stream));
    *out = std::move(s);
    return Status::OK();
}

Status GpuCodeScorer::NormalizeDecoded(const float* h_centroids) {
    Impl& im = *impl_;
    if (im.n_code_bytes == 0 || im.d_scales != nullptr) return Status::OK();
    if (h_centroids == nullptr) return Status::InvalidArgument("GpuCodeScorer: null centroids");
    DeviceGuard g(im.device);
    const size_t c_bytes = size_t(im.n_centroids) * im.dim * sizeof(float);
    kernels::DeviceScratch cent;
    TMS_RETURN_IF_ERROR(cent.Reserve(c_bytes, im.stream));
    TMS_RETURN_IF_ERROR(im.inputs().Upload(cent.p, h_centroids, c_bytes));
    kernels::DeviceScratch scales;  // freed on failure, kept as d_scales on success
    TMS_RETURN_IF_ERROR(scales.Reserve(size_t(im.n_tokens) * sizeof(float), im.stream));
    kernels::DecodedScaleParams p;
    p.centroids = static_cast<const float*>(cent.p);
    p.n_centroids = im.n_centroids;
    p.dim = im.dim;
    p.token_centroids = im.d_tc;
    p.codes = im.d_codes;
    p.n_code_bytes = im.n_code_bytes;
    p.codebook = im.d_book;
    p.n_tokens = im.n_tokens;
    p.scales = static_cast<float*>(scales.p);
    TMS_RETURN_IF_ERROR(kernels::decoded_scales_cuda(p, im.stream));
    TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(im.stream));  // before cent is freed
    im.d_scales = static_cast<float*>(std::exchange(scales.p, nullptr));
    scales.cap = 0;
    return Status::OK();
}

Status GpuCodeScorer::Score(const float* h_queries, int n_queries, int q_stride, const int32_t* h_query_lens,
                            const float* h_centroid_scores, const int64_t* h_cand_offsets, const int32_t* h_cand_docs,
                            bool centroids_only, std::vector<float>* scores) {
    Impl& im = *impl_;
    im.last.valid = false;  // the arena is reused below
    DeviceGuard g(im.device);
    int64_t n_cand = 0;
    TMS_RETURN_IF_ERROR(kernels::validate_host_batch("GpuCodeScorer", n_queries, q_stride, h_queries, h_query_lens,
                                                     h_cand_offsets, h_cand_docs, im.n_docs, &n_cand));
    const int64_t n_out = h_cand_offsets ? n_cand : int64_t(n_queries) * im.n_docs;
    kernels::CodeMaxSimParams p = im.ShardParams(n_queries, q_stride, centroids_only);
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
    char* cur = static_cast<char*>(im.arena.p);
    auto put = [&](const void* h, size_t bytes, void** d) -> Status {
        *d = bytes ? cur : nullptr;
        if (bytes && h) TMS_RETURN_IF_ERROR(im.inputs().Upload(cur, h, bytes));
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
        // cs[(q * q_stride + i) * K + k] = <query row, centroid k>.
        TMS_RETURN_IF_ERROR(
            im.CentroidScores(static_cast<const float*>(dq), int64_t(n_queries) * q_stride, static_cast<float*>(dcs)));
    }
    p.queries = static_cast<const float*>(dq);
    p.query_lens = static_cast<const int32_t*>(dl);
    p.centroid_scores = static_cast<const float*>(dcs);
    p.cand_offsets = static_cast<const int64_t*>(dco);
    p.n_candidates = h_cand_offsets ? n_cand : 0;
    p.cand_docs =
        h_cand_offsets ? (dcd ? static_cast<const int32_t*>(dcd) : reinterpret_cast<const int32_t*>(cur)) : nullptr;
    p.scores = static_cast<float*>(ds);
    TMS_RETURN_IF_ERROR(kernels::code_maxsim_cuda(p, dws, ws_bytes, im.stream));
    scores->resize(size_t(n_out));
    if (n_out) {
        TMS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(scores->data(), p.scores, s_bytes, cudaMemcpyDeviceToHost, im.stream));
    }
    TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(im.stream));
    return Status::OK();
}

Status GpuCodeScorer::Probe(const float* h_queries, int n_queries, int q_stride, int nprobe,
                            std::vector<int32_t>* probe) {
    Impl& im = *impl_;
    im.last.valid = false;  // the arena is reused below
    if (n_queries < 0 || q_stride < 0) return Status::InvalidArgument("GpuCodeScorer::Probe: bad sizes");
    TMS_RETURN_IF_ERROR(im.CheckNprobe("GpuCodeScorer::Probe", nprobe));
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
    char* base = static_cast<char*>(im.arena.p);
    float* dq = reinterpret_cast<float*>(base);
    float* ds = reinterpret_cast<float*>(base + align256(q_bytes));
    int32_t* dp = reinterpret_cast<int32_t*>(base + align256(q_bytes) + align256(s_bytes));
    TMS_RETURN_IF_ERROR(im.inputs().Upload(dq, h_queries, q_bytes));
    for (int64_t r0 = 0; r0 < rows; r0 += block) {
        const int nr = static_cast<int>(std::min<int64_t>(block, rows - r0));
        TMS_RETURN_IF_ERROR(im.CentroidScores(dq + r0 * im.dim, nr, ds));
        TMS_RETURN_IF_ERROR(im.TopCentroids(ds, nr, nprobe, dp + r0 * nprobe));
    }
    TMS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(probe->data(), dp, p_bytes, cudaMemcpyDeviceToHost, im.stream));
    TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(im.stream));
    return Status::OK();
}

Status GpuCodeScorer::SetIvf(const int64_t* h_ivf_offsets, const int32_t* h_ivf_docs) {
    Impl& im = *impl_;
    if (h_ivf_offsets == nullptr) return Status::InvalidArgument("GpuCodeScorer::SetIvf: null offsets");
    const int64_t n = h_ivf_offsets[im.n_centroids];
    if (h_ivf_offsets[0] != 0 || n < 0 || (n > 0 && h_ivf_docs == nullptr)) {
        return Status::InvalidArgument("GpuCodeScorer::SetIvf: bad offsets");
    }
    for (int k = 0; k < im.n_centroids; ++k) {
        if (h_ivf_offsets[k + 1] < h_ivf_offsets[k])
            return Status::InvalidArgument("GpuCodeScorer::SetIvf: offsets decrease");
    }
    for (int64_t e = 0; e < n; ++e) {
        if (h_ivf_docs[e] < 0 || h_ivf_docs[e] >= im.n_docs) {
            return Status::InvalidArgument("GpuCodeScorer::SetIvf: document id outside [0, n_docs)");
        }
    }
    DeviceGuard g(im.device);
    cudaFree(im.d_ivf_off);
    cudaFree(im.d_ivf_docs);
    cudaFree(im.d_ivf_rix);
    im.d_ivf_off = nullptr;
    im.d_ivf_docs = nullptr;
    im.d_ivf_rix = nullptr;
    const size_t rix_bytes = size_t(im.n_centroids) * size_t(kernels::probe_ranges(im.n_docs) + 1) * sizeof(int32_t);
    TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.d_ivf_off, size_t(im.n_centroids + 1) * sizeof(int64_t)));
    TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.d_ivf_docs, std::max<size_t>(size_t(n) * sizeof(int32_t), 256)));
    TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.d_ivf_rix, std::max<size_t>(rix_bytes, 256)));
    kernels::StagedUploader up(im.stream);
    TMS_RETURN_IF_ERROR(up.Upload(im.d_ivf_off, h_ivf_offsets, size_t(im.n_centroids + 1) * sizeof(int64_t)));
    TMS_RETURN_IF_ERROR(up.Upload(im.d_ivf_docs, h_ivf_docs, size_t(n) * sizeof(int32_t)));
    TMS_RETURN_IF_ERROR(
        kernels::ivf_range_index_cuda(im.d_ivf_off, im.d_ivf_docs, im.n_centroids, im.n_docs, im.d_ivf_rix, im.stream));
    TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(im.stream));
    return Status::OK();
}

Status GpuCodeScorer::Candidates(const void* h_queries, DType q_dtype, int n_queries, int q_stride,
                                 const int32_t* h_query_lens, int nprobe, int ncandidates, Pruning pruning,
                                 std::vector<int64_t>* off, std::vector<int32_t>* docs, std::vector<float>* keys,
                                 uint64_t* ticket, const uint32_t* h_allow, bool allow_per_query,
                                 std::vector<kernels::ProbeFrame>* frames) {
    Impl& im = *impl_;
    im.last.valid = false;
    if (ticket) *ticket = 0;
    if (keys && !docs) return Status::InvalidArgument("GpuCodeScorer::Candidates: keys need docs");
    if (keys) keys->clear();
    // With keys, every list is cut (and its scores kept) even where nothing needs pruning.
    kernels::DeviceScratch* kept_scores = keys && ncandidates > 0 ? &im.t_scores : nullptr;
    if (im.d_ivf_off == nullptr) return Status::InvalidArgument("GpuCodeScorer::Candidates: no IVF lists (SetIvf)");
    if (n_queries < 0 || q_stride <= 0 || ncandidates < 0)
        return Status::InvalidArgument("GpuCodeScorer::Candidates: bad sizes");
    TMS_RETURN_IF_ERROR(im.CheckNprobe("GpuCodeScorer::Candidates", nprobe));
    off->assign(size_t(n_queries) + 1, 0);
    if (docs) docs->clear();
    if (n_queries == 0) {
        im.last = Impl::LastCandidates{};
        im.last.h_off.assign(1, 0);
        im.last.valid = true;  // nothing to score
        im.last.owner = &im;
        return Status::OK();
    }
    int64_t no_cand = 0;
    TMS_RETURN_IF_ERROR(kernels::validate_host_batch("GpuCodeScorer::Candidates", n_queries, q_stride, h_queries,
                                                     h_query_lens, nullptr, nullptr, im.n_docs, &no_cand));
    if (n_queries > 65535)
        return Status::InvalidArgument("GpuCodeScorer::Candidates: more than 65535 queries in one call");
    DeviceGuard g(im.device);
    const int64_t rows = int64_t(n_queries) * q_stride;
    const int64_t words = kernels::bitmap_words(im.n_docs);
    std::vector<int64_t> noff;  // pruned offsets (alive until the final synchronisation)
    // TMS_TRACE_SEARCH=1: time of each stage on stderr (synchronises between stages).
    Trace tracer("TMS_TRACE_SEARCH", "candidates", Trace::Unit::kMilliseconds);
    auto trace = [&](const char* what) {
        if (!tracer.on()) return;
        cudaStreamSynchronize(im.stream);
        tracer.Mark(what);
    };
    const size_t q_bytes = size_t(rows) * im.dim * sizeof(float);
    const size_t l_bytes = h_query_lens ? size_t(n_queries) * sizeof(int32_t) : 0;
    const size_t cs_bytes = size_t(rows) * im.n_centroids * sizeof(float);
    const size_t p_bytes = size_t(rows) * nprobe * sizeof(int32_t);
    // The probe-score path needs the probes' scores and floors instead of the union's bitmaps.
    const bool by_probes = ncandidates > 0 && pruning == Pruning::kProbe;
    const size_t b_bytes = by_probes ? 0 : size_t(n_queries) * size_t(std::max<int64_t>(words, 1)) * sizeof(uint32_t);
    const size_t ps_bytes = by_probes ? size_t(rows) * (nprobe + 1) * sizeof(float) : 0;
    const size_t t_bytes = by_probes ? 2 * size_t(n_queries) * sizeof(uint32_t) : 0;
    const size_t c_bytes = size_t(n_queries) * sizeof(int64_t);
    const size_t o_bytes = size_t(n_queries + 1) * sizeof(int64_t);
    const size_t a_bytes = h_allow ? size_t(allow_per_query ? n_queries : 1) * size_t(words) * sizeof(uint32_t) : 0;
    // 16-bit queries travel as they are and become fp32 on the device.
    const size_t raw_bytes = q_dtype == DType::kF32 ? 0 : size_t(rows) * im.dim * DTypeSize(q_dtype);
    TMS_RETURN_IF_ERROR(im.Reserve(align256(q_bytes) + align256(l_bytes) + align256(cs_bytes) + align256(p_bytes) +
                                   align256(b_bytes) + align256(c_bytes) + align256(o_bytes) + align256(raw_bytes) +
                                   align256(ps_bytes) + align256(t_bytes) + align256(a_bytes)));
    Carver carve{static_cast<char*>(im.arena.p)};
    float* dq = reinterpret_cast<float*>(carve.take(q_bytes));
    int32_t* dl = h_query_lens ? reinterpret_cast<int32_t*>(carve.take(l_bytes)) : nullptr;
    float* dcs = reinterpret_cast<float*>(carve.take(cs_bytes));
    int32_t* dp = reinterpret_cast<int32_t*>(carve.take(p_bytes));
    uint32_t* dbits = reinterpret_cast<uint32_t*>(carve.take(b_bytes));
    float* dps = reinterpret_cast<float*>(carve.take(ps_bytes));        // [rows, nprobe] scores, then [rows] floors
    uint32_t* dthr = reinterpret_cast<uint32_t*>(carve.take(t_bytes));  // [n_queries] thresholds, then cursors
    int64_t* dcount = reinterpret_cast<int64_t*>(carve.take(c_bytes));
    int64_t* doff = reinterpret_cast<int64_t*>(carve.take(o_bytes));
    void* draw = raw_bytes ? carve.take(raw_bytes) : nullptr;
    uint32_t* dallow = h_allow ? reinterpret_cast<uint32_t*>(carve.take(a_bytes)) : nullptr;
    trace("reserve");
    TMS_RETURN_IF_ERROR(im.QueriesToDevice(h_queries, q_dtype, rows, dq, draw));
    if (dl) TMS_RETURN_IF_ERROR(im.inputs().Upload(dl, h_query_lens, l_bytes));
    if (dallow) TMS_RETURN_IF_ERROR(im.inputs().Upload(dallow, h_allow, a_bytes));
    trace("upload");
    // 1. Centroid scores of every query row (kept for the pruning table) and probing.
    TMS_RETURN_IF_ERROR(im.CentroidScores(dq, rows, dcs));
    if (fault::Fire("gpu.candidates")) {  // tests: a device allocation that fails mid-batch
        void* p = nullptr;
        TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, size_t(1) << 60));
    }
    trace("gemm");
    kernels::IvfUnionParams up;
    up.probe = dp;
    up.n_queries = n_queries;
    up.q_stride = q_stride;
    up.nprobe = nprobe;
    up.query_lens = dl;
    up.ivf_offsets = im.d_ivf_off;
    up.ivf_docs = im.d_ivf_docs;
    up.n_centroids = im.n_centroids;
    up.n_docs = im.n_docs;
    up.allow = dallow;
    up.allow_stride = allow_per_query ? words : 0;
    // The candidate lists left on the device (result_off, result): pruned by probe scores, or
    // the union of the probed lists, pruned by centroid interaction when a query has too many.
    const int32_t* result = nullptr;
    const int64_t* result_off = nullptr;
    bool table_built = false;
    // The probes and their scores, for the frames (computed on the host once they are there).
    std::vector<int32_t> h_probe;
    std::vector<float> h_probe_scores;
    if (by_probes) {
        TMS_RETURN_IF_ERROR(
            im.ProbeCandidates(up, dp, dcs, dps, dthr, dcount, doff, ncandidates, off, &noff, kept_scores, trace));
        *off = noff;
        if (frames) {
            h_probe.resize(size_t(rows) * nprobe);
            h_probe_scores.resize(size_t(rows) * (nprobe + 1));
            TMS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h_probe.data(), dp, h_probe.size() * sizeof(int32_t),
                                                     cudaMemcpyDeviceToHost, im.stream));
            TMS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h_probe_scores.data(), dps, h_probe_scores.size() * sizeof(float),
                                                     cudaMemcpyDeviceToHost, im.stream));
        }
        result = static_cast<const int32_t*>(im.g_heads.p);
        result_off = static_cast<const int64_t*>(im.g_new_off.p);
    } else {
        TMS_RETURN_IF_ERROR(im.TopCentroids(dcs, rows, nprobe, dp));
        trace("probe");
        // 2. Union of the probed lists: a bitmap per query, counted, then emitted in id order.
        TMS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dbits, 0, b_bytes, im.stream));
        TMS_RETURN_IF_ERROR(kernels::ivf_mark_cuda(up, dbits, im.stream));
        TMS_RETURN_IF_ERROR(kernels::bit_count_cuda(dbits, words, n_queries, dcount, im.stream));
        int64_t max_count = 0;
        TMS_RETURN_IF_ERROR(im.CountsToOffsets(dcount, n_queries, doff, off, &max_count));
        trace("union");
        const int64_t total = off->back();
        TMS_RETURN_IF_ERROR(im.g_docs.Reserve(size_t(total) * sizeof(int32_t), im.stream));
        int32_t* ddocs = static_cast<int32_t*>(im.g_docs.p);
        TMS_RETURN_IF_ERROR(kernels::bit_emit_cuda(dbits, words, n_queries, doff, ddocs, im.stream));
        trace("emit");
        result = ddocs;
        result_off = doff;
        if (ncandidates > 0 && (max_count > ncandidates || kept_scores)) {
            // 3. Centroid-only scores of every candidate, then the ncandidates best of each query.
            kernels::CodeMaxSimParams p = im.ShardParams(n_queries, q_stride, /*centroids_only=*/true);
            p.queries = dq;
            p.query_lens = dl;
            p.centroid_scores = dcs;
            p.cand_offsets = doff;
            p.n_candidates = total;
            p.cand_docs = ddocs;
            TMS_RETURN_IF_ERROR(im.g_scores.Reserve(size_t(total) * sizeof(float), im.stream));
            p.scores = static_cast<float*>(im.g_scores.p);
            const size_t tb = kernels::code_centroid_table_bytes(p);
            TMS_RETURN_IF_ERROR(im.g_table.Reserve(tb, im.stream));
            TMS_RETURN_IF_ERROR(kernels::code_centroid_table_cuda(p, im.g_table.p, im.stream));
            trace("table");
            TMS_RETURN_IF_ERROR(kernels::code_maxsim_table_cuda(p, im.g_table.p, im.stream));
            trace("centroid-only scores");
            TMS_RETURN_IF_ERROR(
                im.KeepBest(p.scores, ddocs, doff, *off, ncandidates, &noff, im.g_new_off, im.g_heads, kept_scores));
            trace("sort");
            *off = noff;
            result = static_cast<const int32_t*>(im.g_heads.p);
            result_off = static_cast<const int64_t*>(im.g_new_off.p);
            table_built = true;
        }
    }
    if (docs) docs->resize(size_t(off->back()));
    if (docs && !docs->empty()) {
        TMS_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(docs->data(), result, docs->size() * sizeof(int32_t), cudaMemcpyDeviceToHost, im.stream));
    }
    if (kept_scores) {
        keys->resize(size_t(off->back()));
        if (!keys->empty()) {
            TMS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(keys->data(), kept_scores->p, keys->size() * sizeof(float),
                                                     cudaMemcpyDeviceToHost, im.stream));
        }
    }
    TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(im.stream));
    trace("gather + download");
    if (frames) {
        frames->clear();
        if (by_probes) {
            kernels::ProbeScoreParams pp;
            pp.lists = up;
            pp.lists.probe = h_probe.data();
            pp.lists.query_lens = h_query_lens;
            pp.probe_scores = h_probe_scores.data();
            pp.floor_scores = h_probe_scores.data() + rows * nprobe;
            for (int q = 0; q < n_queries; ++q) frames->push_back(kernels::probe_frame(pp, q));
        }
    }
    im.SetLast(q_stride, dq, dl, dcs, result_off, result, *off, table_built);
    im.last.ticket = ++im.sc.tickets;
    if (ticket) *ticket = im.last.ticket;
    return Status::OK();
}

Status GpuCodeScorer::ScoreLast(const char* who) {
    Impl& im = *impl_;
    if (!im.last.valid || im.last.owner != &im) {
        return Status::InvalidArgument(std::string(who) +
                                       ": no candidate lists on the device (call Candidates first; Score and Probe, "
                                       "and any call of another scorer on the device, discard them)");
    }
    const Impl::LastCandidates& c = im.last;
    const int64_t total = c.h_off.back();
    if (total == 0) return Status::OK();
    kernels::CodeMaxSimParams p = im.ShardParams(int(c.h_off.size()) - 1, c.q_stride, /*centroids_only=*/false);
    p.queries = c.dq;
    p.query_lens = c.dl;
    p.centroid_scores = c.dcs;
    p.cand_offsets = c.d_off;
    p.n_candidates = total;
    p.cand_docs = c.d_docs;
    TMS_RETURN_IF_ERROR(im.g_scores.Reserve(size_t(total) * sizeof(float), im.stream));
    p.scores = static_cast<float*>(im.g_scores.p);
    if (!c.table_built) {
        TMS_RETURN_IF_ERROR(im.g_table.Reserve(kernels::code_centroid_table_bytes(p), im.stream));
        TMS_RETURN_IF_ERROR(kernels::code_centroid_table_cuda(p, im.g_table.p, im.stream));
        im.last.table_built = true;
    }
    return kernels::code_maxsim_table_cuda(p, im.g_table.p, im.stream);
}

Status GpuCodeScorer::ScoreCandidates(std::vector<float>* scores) {
    Impl& im = *impl_;
    DeviceGuard g(im.device);
    TMS_RETURN_IF_ERROR(ScoreLast("GpuCodeScorer::ScoreCandidates"));
    const int64_t total = im.last.h_off.back();
    scores->assign(size_t(total), 0.f);
    if (total == 0) return Status::OK();
    TMS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(scores->data(), im.g_scores.p, size_t(total) * sizeof(float),
                                             cudaMemcpyDeviceToHost, im.stream));
    TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(im.stream));
    return Status::OK();
}

Status GpuCodeScorer::ScoreCandidatesTop(int keep, std::vector<int64_t>* off, std::vector<int32_t>* docs,
                                         std::vector<float>* scores) {
    Impl& im = *impl_;
    if (keep <= 0) return Status::InvalidArgument("GpuCodeScorer::ScoreCandidatesTop: keep must be > 0");
    DeviceGuard g(im.device);
    TMS_RETURN_IF_ERROR(ScoreLast("GpuCodeScorer::ScoreCandidatesTop"));
    const Impl::LastCandidates& c = im.last;
    TMS_RETURN_IF_ERROR(im.KeepBest(static_cast<const float*>(im.g_scores.p), c.d_docs, c.d_off, c.h_off, keep, off,
                                    im.t_off, im.t_docs, &im.t_scores));
    const int64_t kept = off->back();
    docs->resize(size_t(kept));
    scores->resize(size_t(kept));
    if (kept == 0) return Status::OK();
    TMS_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(docs->data(), im.t_docs.p, size_t(kept) * sizeof(int32_t), cudaMemcpyDeviceToHost, im.stream));
    TMS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(scores->data(), im.t_scores.p, size_t(kept) * sizeof(float),
                                             cudaMemcpyDeviceToHost, im.stream));
    TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(im.stream));
    return Status::OK();
}

}  // namespace tms::engine

namespace tms::engine {

Status GpuCodeScorer::ScoreLists(const void* h_queries, DType q_dtype, int n_queries, int q_stride,
                                 const int32_t* h_query_lens, const int64_t* h_off, const int32_t* h_docs, int keep,
                                 std::vector<int64_t>* off, std::vector<int32_t>* docs, std::vector<float>* scores,
                                 uint64_t ticket) {
    Impl& im = *impl_;
    if (keep <= 0) return Status::InvalidArgument("GpuCodeScorer::ScoreLists: keep must be > 0");
    if (ticket != 0 && im.last.valid && im.last.owner == &im && im.last.ticket == ticket) {
        // That Candidates call's query rows, centroid scores (and table) are still on the device:
        // only the lists go up, over the ones it left.
        if (int64_t(im.last.h_off.size()) != int64_t(n_queries) + 1) {
            return Status::InvalidArgument("GpuCodeScorer::ScoreLists: not the batch of that Candidates call");
        }
        int64_t n_cand = 0;
        TMS_RETURN_IF_ERROR(kernels::validate_host_batch("GpuCodeScorer::ScoreLists", n_queries, q_stride, h_queries,
                                                         h_query_lens, h_off, h_docs, im.n_docs, &n_cand));
        DeviceGuard g(im.device);
        const size_t o_bytes = size_t(n_queries + 1) * sizeof(int64_t), d_bytes = size_t(n_cand) * sizeof(int32_t);
        TMS_RETURN_IF_ERROR(im.g_new_off.Reserve(o_bytes, im.stream));
        TMS_RETURN_IF_ERROR(im.g_heads.Reserve(std::max<size_t>(d_bytes, 4), im.stream));
        TMS_RETURN_IF_ERROR(im.inputs().Upload(im.g_new_off.p, h_off, o_bytes));
        if (d_bytes) TMS_RETURN_IF_ERROR(im.inputs().Upload(im.g_heads.p, h_docs, d_bytes));
        im.last.d_off = static_cast<const int64_t*>(im.g_new_off.p);
        im.last.d_docs = static_cast<const int32_t*>(im.g_heads.p);
        im.last.h_off.assign(h_off, h_off + n_queries + 1);
        return ScoreCandidatesTop(keep, off, docs, scores);
    }
    im.last.valid = false;  // the arena is reused below
    if (n_queries > 65535)
        return Status::InvalidArgument("GpuCodeScorer::ScoreLists: more than 65535 queries in one call");
    int64_t n_cand = 0;
    TMS_RETURN_IF_ERROR(kernels::validate_host_batch("GpuCodeScorer::ScoreLists", n_queries, q_stride, h_queries,
                                                     h_query_lens, h_off, h_docs, im.n_docs, &n_cand));
    DeviceGuard g(im.device);
    const int64_t rows = int64_t(n_queries) * q_stride;
    const size_t q_bytes = size_t(rows) * im.dim * sizeof(float);
    const size_t raw_bytes = q_dtype == DType::kF32 ? 0 : size_t(rows) * im.dim * DTypeSize(q_dtype);
    const size_t l_bytes = h_query_lens ? size_t(n_queries) * sizeof(int32_t) : 0;
    const size_t cs_bytes = size_t(rows) * im.n_centroids * sizeof(float);
    const size_t o_bytes = size_t(n_queries + 1) * sizeof(int64_t);
    const size_t d_bytes = size_t(n_cand) * sizeof(int32_t);
    TMS_RETURN_IF_ERROR(im.Reserve(align256(q_bytes) + align256(raw_bytes) + align256(l_bytes) + align256(cs_bytes) +
                                   align256(o_bytes) + align256(d_bytes)));
    Carver carve{static_cast<char*>(im.arena.p)};
    float* dq = reinterpret_cast<float*>(carve.take(q_bytes));
    void* draw = raw_bytes ? carve.take(raw_bytes) : nullptr;
    int32_t* dl = h_query_lens ? reinterpret_cast<int32_t*>(carve.take(l_bytes)) : nullptr;
    float* dcs = reinterpret_cast<float*>(carve.take(cs_bytes));
    int64_t* doff = reinterpret_cast<int64_t*>(carve.take(o_bytes));
    int32_t* ddocs = reinterpret_cast<int32_t*>(carve.take(d_bytes));
    if (rows > 0) TMS_RETURN_IF_ERROR(im.QueriesToDevice(h_queries, q_dtype, rows, dq, draw));
    if (dl) TMS_RETURN_IF_ERROR(im.inputs().Upload(dl, h_query_lens, l_bytes));
    TMS_RETURN_IF_ERROR(im.inputs().Upload(doff, h_off, o_bytes));
    if (d_bytes) TMS_RETURN_IF_ERROR(im.inputs().Upload(ddocs, h_docs, d_bytes));
    TMS_RETURN_IF_ERROR(im.CentroidScores(dq, rows, dcs));
    im.SetLast(q_stride, dq, dl, dcs, doff, ddocs, std::vector<int64_t>(h_off, h_off + n_queries + 1), false);
    return ScoreCandidatesTop(keep, off, docs, scores);
}

}  // namespace tms::engine

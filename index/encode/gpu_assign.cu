// Copyright TileMaxSim authors. GPU nearest-centroid assignment (kernels::nearest_cuda, or a cuBLAS
// GEMM + row argmax for wide rows) and the index build's encoder around it.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "index/encode/gpu_assign.h"
#include "index/encode/encoder.h"
#include "index/index_data.h"
#include "index/ingest/input_checks.h"
#include "kernels/cpu/parallel_copy.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gpu_context.h"
#include "kernels/cuda/encode_cuda.h"
#include "kernels/cuda/raw_to_float.cuh"
#include "kernels/cuda/nearest_cuda.h"
#include "kernels/maxsim.h"

namespace tms::index {

struct GpuAssigner::Impl {                     // (public to this file's helpers)
    std::shared_ptr<kernels::GpuContext> ctx;  // the device, its stream and cuBLAS handle
    int device = 0;
    cudaStream_t stream = nullptr;
    cublasHandle_t blas = nullptr;
    float* d_c = nullptr;
    size_t c_cap = 0;
    uint16_t* d_c16 = nullptr;  // the fused kernel's fp16 form (kernels::nearest_prepare_cuda)
    size_t c16_cap = 0;
    int K = 0, dim = 0;
    // TMS_ASSIGN_GEMM=1 takes the GEMM path at every width (to measure one against the other).
    bool gemm_only = std::getenv("TMS_ASSIGN_GEMM") != nullptr && std::string(std::getenv("TMS_ASSIGN_GEMM")) == "1";
    bool fused() const { return dim <= kernels::kNearestMaxDim && !gemm_only; }
    float *d_x = nullptr, *d_s = nullptr, *d_best = nullptr;
    uint32_t* d_labels = nullptr;
    int64_t rows_cap = 0;
    std::vector<void*> pinned;  // PinHost's registrations
    ~Impl() {
        cudaSetDevice(device);
        for (void* p : pinned) cudaHostUnregister(p);
        cudaFree(d_c);
        cudaFree(d_c16);
        cudaFree(d_x);
        cudaFree(d_s);
        cudaFree(d_best);
        cudaFree(d_labels);
    }
};

GpuAssigner::GpuAssigner() : impl_(std::make_unique<Impl>()) {}
GpuAssigner::~GpuAssigner() = default;

Status GpuAssigner::Create(int device, std::unique_ptr<GpuAssigner>* out) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        return Status::NotSupported("no CUDA device for GPU assignment");
    }
    std::unique_ptr<GpuAssigner> a(new GpuAssigner());
    TMS_RETURN_IF_ERROR(kernels::GpuContext::Create(device, &a->impl_->ctx));
    a->impl_->device = device;
    a->impl_->stream = a->impl_->ctx->stream();
    a->impl_->blas = a->impl_->ctx->blas();
    TMS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    // The context is the build's own: its handle may take TF32 for the assignment GEMM.
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
    if (im.fused()) {
        const size_t b16 = size_t(kernels::nearest_padded_centroids(K)) * kernels::nearest_padded_dim(dim) * 2;
        if (b16 > im.c16_cap) {
            TMS_CUDA_RETURN_IF_ERROR(cudaFree(im.d_c16));
            im.d_c16 = nullptr;
            TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.d_c16, b16));
            im.c16_cap = b16;
        }
        const float scale = kernels::nearest_centroid_scale(h_c, int64_t(K) * dim);
        TMS_RETURN_IF_ERROR(kernels::nearest_prepare_cuda(im.d_c, K, dim, scale, im.d_c16, im.stream));
    }
    return Status::OK();
}

namespace {

// Make room for `rows` rows of scores (and their labels / best scores) per GEMM pass.
Status reserve_rows(GpuAssigner::Impl& im, int64_t rows) {
    if (im.rows_cap >= rows) return Status::OK();
    cudaFree(im.d_x);
    cudaFree(im.d_s);
    cudaFree(im.d_best);
    cudaFree(im.d_labels);
    im.d_x = im.d_s = im.d_best = nullptr;
    im.d_labels = nullptr;
    TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.d_x, size_t(rows) * im.dim * sizeof(float)));
    if (!im.fused()) TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.d_s, size_t(rows) * im.K * sizeof(float)));
    TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.d_best, size_t(rows) * sizeof(float)));
    TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.d_labels, size_t(rows) * sizeof(uint32_t)));
    im.rows_cap = rows;
    return Status::OK();
}

// Rows per pass: the fused kernel's 1M rows of input (512 MB at d = 128), or the GEMM's score
// tile [rows, K] under 1 GB.
int64_t pass_rows(const GpuAssigner::Impl& im) {
    if (im.fused()) return int64_t(1) << 20;
    return std::max<int64_t>(1, std::min<int64_t>(65536, (int64_t(1) << 28) / im.K));
}

// Enqueue (no sync) the assignment of device rows d_x [n, dim] -> d_labels [n] (d_best: optional).
Status assign_on_device(GpuAssigner::Impl& im, const float* d_x, int64_t n, uint32_t* d_labels, float* d_best) {
    if (im.fused()) {
        return kernels::nearest_cuda({.x = d_x,
                                      .n = n,
                                      .dim = im.dim,
                                      .centroids = im.d_c,
                                      .n_centroids = im.K,
                                      .labels = d_labels,
                                      .best = d_best},
                                     im.d_c16, im.stream);
    }
    const int64_t rows = pass_rows(im);
    TMS_RETURN_IF_ERROR(reserve_rows(im, std::min(rows, n)));
    for (int64_t r0 = 0; r0 < n; r0 += rows) {
        const int nr = static_cast<int>(std::min<int64_t>(rows, n - r0));
        // s[r, k] row-major = column-major [K, nr] = C^T(K x d) . X(d x nr)
        const float one = 1.f, zero = 0.f;
        TMS_CUBLAS_RETURN_IF_ERROR(cublasSgemm(im.blas, CUBLAS_OP_T, CUBLAS_OP_N, im.K, nr, im.dim, &one, im.d_c,
                                               im.dim, d_x + r0 * im.dim, im.dim, &zero, im.d_s, im.K));
        TMS_RETURN_IF_ERROR(
            kernels::row_argmax_cuda(im.d_s, nr, im.K, d_labels + r0, d_best ? d_best + r0 : nullptr, im.stream));
    }
    return Status::OK();
}

}  // namespace

bool GpuAssigner::PinHost(const void* p, size_t bytes) {
    if (p == nullptr || bytes == 0 || cudaSetDevice(impl_->device) != cudaSuccess) return false;
    void* q = const_cast<void*>(p);
    if (cudaHostRegister(q, bytes, cudaHostRegisterReadOnly) != cudaSuccess) {
        (void)cudaGetLastError();  // read-only registration unsupported: a plain one
        if (cudaHostRegister(q, bytes, cudaHostRegisterDefault) != cudaSuccess) {
            (void)cudaGetLastError();
            return false;
        }
    }
    impl_->pinned.push_back(const_cast<void*>(p));
    return true;
}

Status GpuAssigner::Assign(const float* h_x, int64_t n, uint32_t* h_labels, float* h_best) {
    Impl& im = *impl_;
    if (im.K == 0) return Status::InvalidArgument("GpuAssigner: no centroids");
    TMS_CUDA_RETURN_IF_ERROR(cudaSetDevice(im.device));
    const int64_t rows = std::min(pass_rows(im), std::max<int64_t>(n, 1));
    TMS_RETURN_IF_ERROR(reserve_rows(im, rows));
    for (int64_t r0 = 0; r0 < n; r0 += rows) {
        const int nr = static_cast<int>(std::min<int64_t>(rows, n - r0));
        TMS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(im.d_x, h_x + r0 * im.dim, size_t(nr) * im.dim * sizeof(float),
                                                 cudaMemcpyHostToDevice, im.stream));
        TMS_RETURN_IF_ERROR(assign_on_device(im, im.d_x, nr, im.d_labels, h_best ? im.d_best : nullptr));
        TMS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h_labels + r0, im.d_labels, size_t(nr) * sizeof(uint32_t),
                                                 cudaMemcpyDeviceToHost, im.stream));
        if (h_best) {
            TMS_CUDA_RETURN_IF_ERROR(
                cudaMemcpyAsync(h_best + r0, im.d_best, size_t(nr) * sizeof(float), cudaMemcpyDeviceToHost, im.stream));
        }
        TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(im.stream));
    }
    return Status::OK();
}

}  // namespace tms::index

// ---------------------------------------------------------------------------------------------
// GpuEncoder: staging, conversion, assignment and encoding of index build batches.

namespace tms::index {
struct GpuEncoder::Impl {
    const IndexModel* m = nullptr;
    std::unique_ptr<GpuAssigner> asg;
    bool pq = false;
    int dsub = 0, ncb = 0;
    float *d_book = nullptr, *d_norms = nullptr;
    kernels::ResidualCutoffs cut{};
    int64_t batch = 0;      // rows per batch
    size_t in_bytes = 0;    // pinned input bytes per slot
    void* d_raw = nullptr;  // raw rows of the batch
    float* d_x = nullptr;   // fp32 rows
    uint32_t* d_lab = nullptr;
    uint8_t* d_codes = nullptr;
    unsigned long long* d_bad = nullptr;  // first non-finite element of the batch
    DType dtype = DType::kF32;            // of the rows being encoded
    int64_t row0 = 0;                     // of the call
    struct Slot {
        void* in = nullptr;  // pinned
        uint32_t* cids = nullptr;
        uint8_t* codes = nullptr;
        unsigned long long* bad = nullptr;  // pinned copy of d_bad
        int64_t first_row = 0;              // of the batch, within the call
        cudaEvent_t done = nullptr;
        uint32_t* dst_cids = nullptr;  // where the pending batch's results go
        uint8_t* dst_codes = nullptr;
        int64_t pending = 0;
    } slots[2];
    ~Impl() {
        if (!asg) return;
        cudaSetDevice(asg->impl_->device);
        cudaStreamSynchronize(asg->impl_->stream);
        for (auto& s : slots) {
            cudaFreeHost(s.in);
            cudaFreeHost(s.cids);
            cudaFreeHost(s.codes);
            cudaFreeHost(s.bad);
            if (s.done) cudaEventDestroy(s.done);
        }
        cudaFree(d_book);
        cudaFree(d_norms);
        cudaFree(d_raw);
        cudaFree(d_x);
        cudaFree(d_lab);
        cudaFree(d_codes);
        cudaFree(d_bad);
    }
    // Wait for a slot's batch and copy its results out.
    Status drain(Slot& s) {
        if (s.pending == 0) return Status::OK();
        TMS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(s.done));
        if (*s.bad != ~0ull) {
            s.pending = 0;
            const int64_t e = static_cast<int64_t>(*s.bad);  // the staged batch is still in s.in
            return NonFiniteError("docs", row0 + s.first_row + e / m->dim, static_cast<int>(e % m->dim),
                                  kernels::load_as_float(s.in, dtype, e));
        }
        std::memcpy(s.dst_cids, s.cids, size_t(s.pending) * sizeof(uint32_t));
        std::memcpy(s.dst_codes, s.codes, size_t(s.pending) * ncb);
        s.pending = 0;
        return Status::OK();
    }
};

GpuEncoder::GpuEncoder() : impl_(std::make_unique<Impl>()) {}
GpuEncoder::~GpuEncoder() = default;

Status GpuEncoder::Create(const IndexModel& m, int device, std::unique_ptr<GpuEncoder>* out) {
    std::unique_ptr<GpuEncoder> e(new GpuEncoder());
    Impl& im = *e->impl_;
    im.m = &m;
    im.ncb = m.n_code_bytes;
    if (m.codec == "pq") {
        im.pq = true;
        im.dsub = m.dim / std::max(1, m.pq_m);
        if (im.dsub > kernels::kMaxPqSubCuda)
            return Status::NotSupported("PQ sub-vectors wider than 64 are encoded on the CPU");
        if (m.pq_nbits != 8 || m.codebook.size() != size_t(m.pq_m) * 256 * im.dsub || m.pq_m != im.ncb) {
            return Status::Corruption("PQ codebook size mismatch");
        }
    } else if (m.codec == "residual") {
        if (m.residual_cutoffs.size() > 15 || m.residual_nbits <= 0) return Status::Corruption("bad residual cutoffs");
        im.cut.n = static_cast<int>(m.residual_cutoffs.size());
        for (int i = 0; i < im.cut.n; ++i) im.cut.v[i] = m.residual_cutoffs[i];
    } else {
        return Status::Corruption("unknown codec '" + m.codec + "'");
    }
    TMS_RETURN_IF_ERROR(GpuAssigner::Create(device, &im.asg));
    TMS_RETURN_IF_ERROR(im.asg->SetCentroids(m.centroids.data(), m.n_centroids, m.dim));
    if (im.pq) {
        const std::vector<float> norms = PqCodeNorms(m);  // the CPU encoder's values
        TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.d_book, m.codebook.size() * sizeof(float)));
        TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.d_norms, norms.size() * sizeof(float)));
        TMS_CUDA_RETURN_IF_ERROR(
            cudaMemcpy(im.d_book, m.codebook.data(), m.codebook.size() * sizeof(float), cudaMemcpyHostToDevice));
        TMS_CUDA_RETURN_IF_ERROR(
            cudaMemcpy(im.d_norms, norms.data(), norms.size() * sizeof(float), cudaMemcpyHostToDevice));
    }
    // Batches of up to 256K rows (a few waves of the fused assignment's 256-row CTAs), 128 MB of
    // fp32 rows at most.
    im.batch = std::clamp<int64_t>((int64_t(128) << 20) / (int64_t(m.dim) * 4), 1024, 262144);
    im.in_bytes = size_t(im.batch) * m.dim * sizeof(float);
    TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.d_raw, im.in_bytes));
    TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.d_x, im.in_bytes));
    TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.d_lab, size_t(im.batch) * sizeof(uint32_t)));
    TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.d_codes, size_t(im.batch) * std::max(1, im.ncb)));
    TMS_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.d_bad, sizeof(unsigned long long)));
    for (auto& s : im.slots) {
        TMS_CUDA_RETURN_IF_ERROR(cudaMallocHost(&s.bad, sizeof(unsigned long long)));
        TMS_CUDA_RETURN_IF_ERROR(cudaMallocHost(&s.in, im.in_bytes));
        TMS_CUDA_RETURN_IF_ERROR(cudaMallocHost(&s.cids, size_t(im.batch) * sizeof(uint32_t)));
        TMS_CUDA_RETURN_IF_ERROR(cudaMallocHost(&s.codes, size_t(im.batch) * std::max(1, im.ncb)));
        TMS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
    }
    if (im.pq) TMS_RETURN_IF_ERROR(kernels::pq_encode_setup_cuda(im.dsub));
    *out = std::move(e);
    return Status::OK();
}

Status GpuEncoder::Encode(const EmbeddingView& tokens, int64_t row0, int64_t n, uint32_t* cids, uint8_t* codes) {
    Impl& im = *impl_;
    const IndexModel& m = *im.m;
    if (tokens.dim != m.dim) {
        return Status::InvalidArgument("dimension " + std::to_string(tokens.dim) + " differs from the index's " +
                                       std::to_string(m.dim));
    }
    GpuAssigner::Impl& a = *im.asg->impl_;
    TMS_CUDA_RETURN_IF_ERROR(cudaSetDevice(a.device));
    TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(a.stream));
    for (auto& s : im.slots) s.pending = 0;  // a failed earlier call's batches are void
    im.dtype = tokens.dtype;
    im.row0 = row0;
    const size_t esize = DTypeSize(tokens.dtype);
    const size_t row_bytes = size_t(m.dim) * esize;
    const int threads = 256;
    int i = 0;
    for (int64_t b = 0; b < n; b += im.batch, ++i) {
        Impl::Slot& s = im.slots[i % 2];
        TMS_RETURN_IF_ERROR(im.drain(s));  // its previous batch (two batches ago)
        const int64_t nb = std::min(im.batch, n - b);
        // Host staging of this batch overlaps the GPU work of the previous one.
        kernels::ParallelMemcpy(s.in, static_cast<const char*>(tokens.data) + size_t(row0 + b) * row_bytes,
                                size_t(nb) * row_bytes);
        TMS_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(im.d_raw, s.in, size_t(nb) * row_bytes, cudaMemcpyHostToDevice, a.stream));
        TMS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(im.d_bad, 0xff, sizeof(unsigned long long), a.stream));
        {
            const int64_t cnt = nb * m.dim;
            const int blocks = static_cast<int>(std::min<int64_t>((cnt + threads - 1) / threads, 8192));
            kernels::raw_to_float<<<blocks, threads, 0, a.stream>>>(im.d_raw, static_cast<int>(tokens.dtype), cnt,
                                                                    im.d_x, im.d_bad);
            TMS_CUDA_CHECK_LAUNCH();
        }
        const float* x = im.d_x;
        TMS_RETURN_IF_ERROR(assign_on_device(a, x, nb, im.d_lab, nullptr));
        if (im.pq) {
            TMS_RETURN_IF_ERROR(kernels::pq_encode_cuda(x, im.d_lab, a.d_c, nb, m.dim, m.pq_m, im.dsub, im.d_book,
                                                        im.d_norms, im.d_codes, a.stream));
        } else {
            TMS_RETURN_IF_ERROR(kernels::residual_encode_cuda(x, im.d_lab, a.d_c, nb, m.dim, m.residual_nbits, im.cut,
                                                              im.d_codes, a.stream));
        }
        TMS_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(s.cids, im.d_lab, size_t(nb) * sizeof(uint32_t), cudaMemcpyDeviceToHost, a.stream));
        TMS_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(s.codes, im.d_codes, size_t(nb) * im.ncb, cudaMemcpyDeviceToHost, a.stream));
        TMS_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(s.bad, im.d_bad, sizeof(unsigned long long), cudaMemcpyDeviceToHost, a.stream));
        TMS_CUDA_RETURN_IF_ERROR(cudaEventRecord(s.done, a.stream));
        s.first_row = b;
        s.dst_cids = cids + b;
        s.dst_codes = codes + size_t(b) * im.ncb;
        s.pending = nb;
    }
    TMS_RETURN_IF_ERROR(im.drain(im.slots[i % 2]));
    TMS_RETURN_IF_ERROR(im.drain(im.slots[(i + 1) % 2]));
    return Status::OK();
}

}  // namespace tms::index

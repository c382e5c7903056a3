// Copyright TileMaxSim authors. GpuShard over GpuCodeScorer and GpuExactScorer (CUDA builds).
#include "engine/gpu_shard_cuda.h"

#include <cuda_runtime.h>

#include <string>

#include "engine/gpu_code_scorer.h"
#include "engine/gpu_scorer.h"
#include "engine/vector_rows.h"
#include "index/index_data.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gpu_context.h"

namespace tms::engine {
namespace {

class CudaShard final : public GpuShard {
public:
    bool has_codes() const override { return code_ != nullptr; }
    bool has_vectors() const override { return exact_ != nullptr && exact_->resident(); }
    explicit CudaShard(std::shared_ptr<kernels::GpuContext> ctx) : ctx_(std::move(ctx)) {}
    ~CudaShard() override {
        kernels::DeviceGuard g(ctx_->device());
        cudaStreamSynchronize(ctx_->copy_stream());
        for (int s = 0; s < 2; ++s) {
            cudaFree(staged_[s]);
            if (ready_[s]) cudaEventDestroy(ready_[s]);
        }
        for (uint16_t* p : pinned_) cudaFreeHost(p);
        for (const void* p : registered_) cudaHostUnregister(const_cast<void*>(p));
    }
    Status StageRows(int slot, size_t elems, Rows* rows) override {
        if (slot < 0 || slot > 1 || !rows->tokens) return Status::InvalidArgument("StageRows: slot or rows");
        kernels::DeviceGuard g(ctx_->device());
        if (elems > staged_elems_[slot]) {
            // The slot's last rows were scored before this call (the contract), so only its
            // copy can still read the buffer.
            TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx_->copy_stream()));
        }
        TMS_RETURN_IF_ERROR(grow(true, elems, &staged_[slot], &staged_elems_[slot]));
        if (!ready_[slot]) TMS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ready_[slot], cudaEventDisableTiming));
        TMS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staged_[slot], rows->tokens, elems * sizeof(uint16_t),
                                                 cudaMemcpyHostToDevice, ctx_->copy_stream()));
        TMS_CUDA_RETURN_IF_ERROR(cudaEventRecord(ready_[slot], ctx_->copy_stream()));
        rows->device_tokens = staged_[slot];
        rows->ready = ready_[slot];
        return Status::OK();
    }
    bool RegisterHost(const void* p, size_t bytes) override {
        if (bytes == 0) return true;
        if (cudaHostRegister(const_cast<void*>(p), bytes, cudaHostRegisterMapped | cudaHostRegisterReadOnly) !=
            cudaSuccess) {
            (void)cudaGetLastError();
            return false;
        }
        registered_.push_back(p);
        return true;
    }
    Status PinnedRows(int slot, size_t elems, uint16_t** out) override {
        if (slot < 0 || slot > 1) return Status::InvalidArgument("PinnedRows: slot " + std::to_string(slot));
        TMS_RETURN_IF_ERROR(grow(false, elems, &pinned_[slot], &pinned_elems_[slot]));
        *out = pinned_[slot];
        return Status::OK();
    }
    // A slot's buffer on the device or pinned on the host, grown to at least `elems` fp16 values
    // (with headroom: steps and batches vary a little); its old contents are not kept.
    static Status grow(bool device, size_t elems, uint16_t** buf, size_t* have) {
        if (elems <= *have) return Status::OK();
        (void)(device ? cudaFree(*buf) : cudaFreeHost(*buf));
        *buf = nullptr;
        *have = 0;
        const size_t want = elems + elems / 4;
        void* p = nullptr;
        if ((device ? cudaMalloc(&p, want * sizeof(uint16_t)) : cudaMallocHost(&p, want * sizeof(uint16_t))) !=
            cudaSuccess) {
            (void)cudaGetLastError();
            return Status::ResourceExhausted("cannot allocate " + std::to_string(want * 2 >> 20) + " MiB of " +
                                             (device ? "GPU" : "pinned host") + " memory for the rows of a search");
        }
        *buf = static_cast<uint16_t*>(p);
        *have = want;
        return Status::OK();
    }
    Status Candidates(const void* q, DType dt, int nq, int qt, const int32_t* lens, int nprobe, int ncand,
                      Pruning pruning, std::vector<int64_t>* off, std::vector<int32_t>* docs, std::vector<float>* keys,
                      uint64_t* ticket, const uint32_t* allow, bool allow_per_query,
                      std::vector<kernels::ProbeFrame>* frames) override {
        return code_->Candidates(q, dt, nq, qt, lens, nprobe, ncand, pruning, off, docs, keys, ticket, allow,
                                 allow_per_query, frames);
    }
    Status ScoreLists(const void* q, DType dt, int nq, int qt, const int32_t* lens, const int64_t* h_off,
                      const int32_t* h_docs, int keep, std::vector<int64_t>* off, std::vector<int32_t>* docs,
                      std::vector<float>* scores, uint64_t ticket) override {
        return code_->ScoreLists(q, dt, nq, qt, lens, h_off, h_docs, keep, off, docs, scores, ticket);
    }
    Status ScoreCandidatesTop(int keep, std::vector<int64_t>* off, std::vector<int32_t>* docs,
                              std::vector<float>* scores) override {
        return code_->ScoreCandidatesTop(keep, off, docs, scores);
    }
    Status CodeScore(const float* q, int nq, int qt, const int32_t* lens, const int64_t* off, const int32_t* docs,
                     bool centroids_only, std::vector<float>* scores) override {
        // Centroid scores are recomputed on the device (a cuBLAS GEMM) rather than uploaded:
        // [n_queries, q_stride, n_centroids] floats can be a gigabyte.
        return code_->Score(q, nq, qt, lens, nullptr, off, docs, centroids_only, scores);
    }
    Status ExactScore(const void* q, DType dt, int nq, int qt, const int32_t* lens, const int64_t* off,
                      const int32_t* docs, std::vector<float>* scores, const Rows* rows) override {
        if (!exact_) return no_exact();
        return exact_->Score(q, dt, nq, qt, lens, off, docs, scores, rows);
    }
    Status ExactScoreTopK(const void* q, DType dt, int nq, int qt, const int32_t* lens, const int64_t* off,
                          const int32_t* docs, int k, std::vector<int32_t>* ids, std::vector<float>* scores,
                          const Rows* rows) override {
        if (!exact_) return no_exact();
        return exact_->ScoreTopK(q, dt, nq, qt, lens, off, docs, k, ids, scores, rows);
    }
    static Status no_exact() { return Status::NotSupported("exact scoring on the GPU: dimension not supported"); }

    std::unique_ptr<GpuCodeScorer> code_;
    std::unique_ptr<GpuExactScorer> exact_;  // resident vectors, or none (CreateForRows)
    std::shared_ptr<kernels::GpuContext> ctx_;
    uint16_t* pinned_[2] = {nullptr, nullptr};
    std::vector<const void*> registered_;
    size_t pinned_elems_[2] = {0, 0};
    // StageRows' device buffers and the events of their last copies.
    uint16_t* staged_[2] = {nullptr, nullptr};
    size_t staged_elems_[2] = {0, 0};
    cudaEvent_t ready_[2] = {nullptr, nullptr};
};

}  // namespace

Status CreateCudaShard(std::shared_ptr<kernels::GpuContext> ctx, const index::IndexData& d,
                       const std::vector<index::PodVector<uint16_t>>& vector_parts, const VectorRows* file_rows,
                       std::unique_ptr<GpuShard>* out) {
    auto s = std::make_unique<CudaShard>(ctx);
    Status st = GpuCodeScorer::Create(ctx, d.token_centroids.data(), d.codes.data(), d.info.n_tokens,
                                      d.model.n_code_bytes, d.model.codebook.data(), d.model.centroids.data(),
                                      d.model.n_centroids, d.info.dim, d.doc_offsets.data(), d.info.n_docs, &s->code_);
    // Shapes the fused kernel does not cover (code_maxsim_cuda_supported) stay on the CPU path.
    if (!st.ok() && st.code() != Status::Code::kNotSupported) return st;
    if (s->code_ && d.model.unit_norm) TMS_RETURN_IF_ERROR(s->code_->NormalizeDecoded(d.model.centroids.data()));
    // The IVF lists go with the codes: candidates are generated on the GPU too.
    if (s->code_) TMS_RETURN_IF_ERROR(s->code_->SetIvf(d.ivf_offsets.data(), d.ivf_docs.data()));
    std::vector<GpuExactScorer::TokenPart> parts;
    if (!d.vectors.empty()) parts.push_back({d.vectors.data(), int64_t(d.vectors.size()) / d.info.dim});
    for (const auto& v : vector_parts) {
        if (!v.empty()) parts.push_back({v.data(), int64_t(v.size()) / d.info.dim});
    }
    if (parts.empty() && file_rows && !file_rows->empty()) parts.push_back({nullptr, file_rows->n_tokens(), file_rows});
    if (!parts.empty()) {
        TMS_RETURN_IF_ERROR(
            GpuExactScorer::Create(ctx, parts, d.info.dim, d.doc_offsets.data(), d.info.n_docs, &s->exact_));
    } else {
        // Vectors off the device (host or disk tier, or none): calls bring the rows they score.
        Status st2 = GpuExactScorer::CreateForRows(ctx, d.info.dim, &s->exact_);
        if (!st2.ok() && st2.code() != Status::Code::kNotSupported) return st2;
    }
    *out = std::move(s);
    return Status::OK();
}

}  // namespace tms::engine

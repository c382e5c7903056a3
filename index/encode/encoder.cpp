// Copyright TileMaxSim authors. Encoding tokens with a trained model: nearest centroid (CPU or GPU), then the
// residual's PQ or PLAID code.

#include <faiss/impl/FaissException.h>
#include <omp.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "base/progress.h"
#include "index/encode/encoder.h"
#include "index/encode/gpu_assign.h"
#include "index/ingest/input_checks.h"
#include "kernels/cpu/parallel_copy.h"
#include "kernels/cpu/simd.h"
#include "kernels/maxsim.h"
#include "kernels/nearest.h"

namespace tms::index {

namespace {

constexpr int64_t kBatch = 16384;  // tokens per assignment / encoding batch

// Rows per CPU assignment batch: its score tile [rows, K] stays under 256 MB.
int64_t cpu_batch(int n_centroids) { return std::clamp<int64_t>((int64_t(1) << 26) / n_centroids, 256, kBatch); }

// Rows x [n, dim] (rows row0.. of `what`) are all storable, or the first offender's error.
Status check_finite_rows(const float* x, int64_t n, int dim, int64_t row0, const std::string& what) {
    const int64_t cnt = n * dim;
    int64_t first_bad = cnt;
#pragma omp parallel for reduction(min : first_bad) schedule(static) if (cnt > 65536)
    for (int64_t i = 0; i < cnt; ++i)
        if (!(std::abs(x[i]) <= kMaxEmbeddingValue) && i < first_bad) first_bad = i;
    if (first_bad == cnt) return Status::OK();
    return NonFiniteError(what, row0 + first_bad / dim, static_cast<int>(first_bad % dim), x[first_bad]);
}

// Nearest PQ code per sub-vector (the same choice as faiss::ProductQuantizer::compute_codes up to
// float rounding of near ties), OpenMP over tokens, vectorised over the 256 codes.
TMS_TARGET_CLONES void pq_encode_one(const float* x, int M, int dsub, const float* book_t, const float* norms,
                                     uint8_t* code) {
    float dist[256];
    for (int sq = 0; sq < M; ++sq) {
        const float* xs = x + sq * dsub;
        const float* nb = norms + size_t(sq) * 256;
        for (int c = 0; c < 256; ++c) dist[c] = nb[c];
        for (int j = 0; j < dsub; ++j) {
            const float xj = -2.0f * xs[j];
            const float* bt = book_t + (size_t(sq) * dsub + j) * 256;
            for (int c = 0; c < 256; ++c) dist[c] += xj * bt[c];
        }
        int best = 0;
        for (int c = 1; c < 256; ++c) best = dist[c] < dist[best] ? c : best;
        code[sq] = static_cast<uint8_t>(best);
    }
}

void pq_encode(const float* r, int64_t n, const IndexModel& m, const float* book_t, const float* norms,
               uint8_t* codes) {
    const int M = m.pq_m, dsub = m.dim / M;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < n; ++t) pq_encode_one(r + t * m.dim, M, dsub, book_t, norms, codes + t * M);
}

void residual_encode(const float* r, int64_t n, const IndexModel& m, uint8_t* codes) {
    const int nbits = m.residual_nbits, per_byte = 8 / nbits;
    const float* cut = m.residual_cutoffs.data();
    const int ncut = static_cast<int>(m.residual_cutoffs.size());
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
        uint8_t* out = codes + t * m.n_code_bytes;
        for (int b = 0; b < m.n_code_bytes; ++b) {
            uint32_t byte = 0;
            for (int j = 0; j < per_byte; ++j) {
                const float v = r[t * m.dim + b * per_byte + j];
                const uint32_t bucket = static_cast<uint32_t>(std::upper_bound(cut, cut + ncut, v) - cut);
                byte |= bucket << (nbits * j);
            }
            out[b] = static_cast<uint8_t>(byte);
        }
    }
}

}  // namespace

// Nearest centroid (max inner product; centroids have unit norm) of each row.
Status AssignNearest(const float* x, int64_t n, const IndexModel& m, uint32_t* out) {
    return kernels::nearest_cpu(
        {.x = x, .n = n, .dim = m.dim, .centroids = m.centroids.data(), .n_centroids = m.n_centroids, .labels = out});
}

void RowsToFloat(const EmbeddingView& v, int64_t row0, int64_t n, float* out) {
    kernels::load_as_float_parallel(v.data, v.dtype, row0 * v.dim, n * v.dim, out);
}

struct Encoder::Impl {
    const IndexModel* model;
    bool pq = false;
    // PQ encoding tables: codebook transposed to [M, dsub, 256] and squared norms [M, 256], so
    // that ||r - c||^2 - ||r||^2 = |c|^2 - 2 r.c vectorises over the 256 codes.
    std::vector<float> book_t, norms;
    std::unique_ptr<GpuEncoder> genc;  // the whole encoding on the GPU when present
    std::unique_ptr<GpuAssigner> gpu;  // else assignment on the GPU when present (codes on the CPU)
    std::vector<float> x;
};

Status MaybeGpuAssigner(Device device, int gpu, std::unique_ptr<GpuAssigner>* out) {
    out->reset();
    if (device == Device::kCpu) return Status::OK();
    Status st = GpuAssigner::Create(gpu, out);
    if (st.ok() || (device == Device::kAuto && st.code() == Status::Code::kNotSupported)) return Status::OK();
    return st.WithContext("device gpu");
}

Encoder::Encoder() : impl_(std::make_unique<Impl>()) {}
Encoder::~Encoder() = default;

Status Encoder::Create(const IndexModel& model, Device device, int gpu, std::unique_ptr<Encoder>* out) {
    std::unique_ptr<Encoder> e(new Encoder());
    e->impl_->model = &model;
    if (device != Device::kCpu) {
        Status st = GpuEncoder::Create(model, gpu, &e->impl_->genc);
        if (!st.ok()) {
            e->impl_->genc.reset();
            if (st.code() != Status::Code::kNotSupported) return st.WithContext("device gpu");
        }
    }
    if (e->impl_->genc) {
        *out = std::move(e);
        return Status::OK();
    }
    TMS_RETURN_IF_ERROR(MaybeGpuAssigner(device, gpu, &e->impl_->gpu));
    if (e->impl_->gpu)
        TMS_RETURN_IF_ERROR(e->impl_->gpu->SetCentroids(model.centroids.data(), model.n_centroids, model.dim));
    else
        TMS_RETURN_IF_ERROR(kernels::check_blas_room(omp_get_max_threads(), 0, "encoding on the CPU"));
    if (model.codec == "pq") {
        const int M = model.pq_m, dsub = model.dim / std::max(1, M);
        if (model.pq_nbits != 8 || model.codebook.size() != size_t(M) * 256 * dsub) {
            return Status::Corruption("PQ codebook size mismatch");
        }
        e->impl_->pq = true;
        e->impl_->book_t.resize(model.codebook.size());
        for (int m = 0; m < M; ++m)
            for (int c = 0; c < 256; ++c)
                for (int j = 0; j < dsub; ++j)
                    e->impl_->book_t[(size_t(m) * dsub + j) * 256 + c] =
                        model.codebook[(size_t(m) * 256 + c) * dsub + j];
        e->impl_->norms = PqCodeNorms(model);
    } else if (model.codec != "residual") {
        return Status::Corruption("unknown codec '" + model.codec + "'");
    }
    *out = std::move(e);
    return Status::OK();
}

Status Encoder::Encode(const EmbeddingView& tokens, int64_t row0, int64_t n, uint32_t* cids, uint8_t* codes,
                       const uint32_t* known_cids) {
    const IndexModel& m = *impl_->model;
    const int dim = m.dim;
    if (tokens.dim != dim)
        return Status::InvalidArgument("dimension " + std::to_string(tokens.dim) + " differs from the index's " +
                                       std::to_string(dim));
    // The GPU encoder assigns faster than known assignments could be uploaded beside the tokens.
    if (impl_->genc) return impl_->genc->Encode(tokens, row0, n, cids, codes);
    try {
        const int64_t batch = impl_->gpu ? 4 * kBatch : cpu_batch(m.n_centroids);
        for (int64_t b = 0; b < n; b += batch) {
            const int64_t nb = std::min(batch, n - b);
            impl_->x.resize(size_t(nb) * dim);
            float* x = impl_->x.data();
            RowsToFloat(tokens, row0 + b, nb, x);
            TMS_RETURN_IF_ERROR(check_finite_rows(x, nb, dim, row0 + b, "docs"));
            if (known_cids != nullptr) {
                std::copy_n(known_cids + b, nb, cids + b);
            } else if (impl_->gpu) {
                TMS_RETURN_IF_ERROR(impl_->gpu->Assign(x, nb, cids + b, nullptr));
            } else {
                TMS_RETURN_IF_ERROR(AssignNearest(x, nb, m, cids + b));
            }
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < nb; ++i) {
                const float* c = m.centroids.data() + size_t(cids[b + i]) * dim;
                for (int j = 0; j < dim; ++j) x[i * dim + j] -= c[j];
            }
            uint8_t* out = codes + b * m.n_code_bytes;
            if (impl_->pq) {
                pq_encode(x, nb, m, impl_->book_t.data(), impl_->norms.data(), out);
            } else {
                residual_encode(x, nb, m, out);
            }
        }
    } catch (const faiss::FaissException& e) {
        return Status::Internal(std::string("FAISS: ") + e.what());
    } catch (const std::bad_alloc&) {
        return Status::ResourceExhausted("out of host memory while encoding");
    }
    return Status::OK();
}

std::vector<float> ResidualCodebook(const std::vector<float>& weights, int nbits, int n_code_bytes) {
    const int per_byte = 8 / nbits, mask = (1 << nbits) - 1;
    std::vector<float> book(size_t(n_code_bytes) * 256 * per_byte);
    for (int b = 0; b < n_code_bytes; ++b)
        for (int v = 0; v < 256; ++v)
            for (int j = 0; j < per_byte; ++j)
                book[(size_t(b) * 256 + v) * per_byte + j] = weights[(v >> (nbits * j)) & mask];
    return book;
}

std::vector<float> PqCodeNorms(const IndexModel& m) {
    const int M = m.pq_m, dsub = m.dim / std::max(1, M);
    std::vector<float> norms(size_t(M) * 256, 0.0f);
    for (int s = 0; s < M; ++s)
        for (int c = 0; c < 256; ++c)
            for (int j = 0; j < dsub; ++j) {
                const float v = m.codebook[(size_t(s) * 256 + c) * dsub + j];
                norms[size_t(s) * 256 + c] += v * v;
            }
    return norms;
}

void ToHalf(const EmbeddingView& tokens, int64_t row0, int64_t n, uint16_t* out, bool parallel) {
    const int64_t base = row0 * tokens.dim, cnt = n * tokens.dim;
    if (tokens.dtype == DType::kF16) {
        const uint16_t* from = static_cast<const uint16_t*>(tokens.data) + base;
        if (parallel)
            kernels::ParallelMemcpy(out, from, size_t(cnt) * sizeof(uint16_t));
        else
            std::memcpy(out, from, size_t(cnt) * sizeof(uint16_t));
    } else {
#pragma omp parallel for schedule(static) if (parallel)
        for (int64_t i = 0; i < cnt; ++i)
            out[i] = kernels::float_to_half(kernels::load_as_float(tokens.data, tokens.dtype, base + i));
    }
}

}  // namespace tms::index

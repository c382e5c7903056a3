// Copyright TileMaxSim authors. Index construction: sampling, k-means (FAISS), assignment,
// codec training (FAISS ProductQuantizer / PLAID residual buckets), encoding, IVF lists.
// The only FAISS adapter of the project: FAISS exceptions become Status here.
#include <faiss/Clustering.h>
#include <faiss/IndexFlat.h>
#include <faiss/impl/FaissAssert.h>
#include <faiss/impl/FaissException.h>
#include <faiss/impl/ProductQuantizer.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <memory>
#include <numeric>
#if __has_include(<parallel/algorithm>)
#include <parallel/algorithm>  // libstdc++'s OpenMP sort
#endif
#include <random>
#include <unordered_set>

#include "index/gpu_assign.h"
#include "index/index_data.h"
#include "base/log.h"
#include "base/progress.h"
#include "kernels/cpu/parallel_copy.h"
#include "kernels/cpu/simd.h"
#include "kernels/maxsim.h"
#include "kernels/nearest.h"
#include "kernels/threads.h"

// OpenBLAS's pthread build fights OpenMP for the cores (seen: 3x slower PQ training and most of
// the time in the kernel); the engine parallelises with OpenMP, so BLAS runs single-threaded.
// Weak: absent when the BLAS is not OpenBLAS.
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace tms::index {
namespace {

constexpr int64_t kBatch = 16384;  // tokens per assignment / encoding batch

// Rows per CPU assignment batch: its score tile [rows, K] stays under 256 MB.
int64_t cpu_batch(int n_centroids) { return std::clamp<int64_t>((int64_t(1) << 26) / n_centroids, 256, kBatch); }

// fn() as a Status, with the exceptions FAISS and the allocator throw turned into one:
// FAISS errors and other std::exceptions Internal, exhausted memory "out of host memory while <doing>".
template <class Fn>
Status status_of(const char* doing, Fn&& fn) {
    try {
        return fn();
    } catch (const faiss::FaissException& e) {
        return Status::Internal(std::string("FAISS: ") + e.what());
    } catch (const std::bad_alloc&) {
        return Status::ResourceExhausted(std::string("out of host memory while ") + doing);
    } catch (const std::exception& e) {
        return Status::Internal(e.what());
    }
}

void rows_to_float(const EmbeddingView& v, int64_t row0, int64_t n, float* out) {
    kernels::load_as_float_parallel(v.data, v.dtype, row0 * v.dim, n * v.dim, out);
}

}  // namespace

std::string BadValueText(float v) {
    if (!std::isfinite(v)) return std::string("non-finite value (") + (std::isnan(v) ? "NaN" : "Inf") + ")";
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%g", double(v));
    return std::string("value ") + buf + " beyond fp16's range (|x| <= 65504; the index stores and scores fp16)";
}

Status NonFiniteError(const std::string& what, int64_t row, int col, float v) {
    return Status::InvalidArgument(what + ": " + BadValueText(v) + " at row " + std::to_string(row) + ", column " +
                                   std::to_string(col));
}

namespace {

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

// FAISS's flat index runs one BLAS call at a time; k-means assignment (k = 1) here runs
// kernels::nearest_cpu (row blocks over the OpenMP threads) instead.
// With a GpuAssigner, the assignment runs on the GPU instead (centroids re-uploaded per call:
// k-means replaces them every iteration).
struct ParallelFlatIP : faiss::IndexFlatIP {
    ParallelFlatIP(int d, GpuAssigner* gpu, Progress* iterations) : faiss::IndexFlatIP(d), gpu_(gpu), its_(iterations) {}
    GpuAssigner* gpu_;
    Progress* its_;               // advanced once a k = 1 search: k-means runs one an iteration
    mutable double assign_s = 0;  // seconds in k = 1 searches (the assignments)
    mutable std::vector<char> assigned;  // per centroid: whether the last assignment gave it a row
    void search(faiss::Index::idx_t n, const float* x, faiss::Index::idx_t k, float* distances, faiss::Index::idx_t* labels,
                const faiss::SearchParameters* params = nullptr) const override {
        if (k != 1 || ntotal == 0) {
            faiss::IndexFlatIP::search(n, x, k, distances, labels, params);
            return;
        }
        const auto t0 = std::chrono::steady_clock::now();
        const int K = static_cast<int>(ntotal);
        std::vector<uint32_t> lab(n);
        Status st;
        if (gpu_ != nullptr) {
            st = gpu_->SetCentroids(get_xb(), K, static_cast<int>(d));
            if (st.ok()) st = gpu_->Assign(x, n, lab.data(), distances);
            if (!st.ok()) FAISS_THROW_MSG("GPU assignment: " + st.ToString());
        } else {
            st = kernels::nearest_cpu({.x = x, .n = n, .dim = static_cast<int>(d), .centroids = get_xb(),
                                       .n_centroids = K, .labels = lab.data(), .best = distances});
            if (!st.ok()) FAISS_THROW_MSG(st.ToString());
        }
        assigned.assign(size_t(K), 0);
        for (faiss::Index::idx_t i = 0; i < n; ++i) {
            labels[i] = lab[i];
            assigned[lab[i]] = 1;
        }
        assign_s += SecondsSince(t0);
        if (its_) its_->Add(1);
    }
};

void normalize_rows(float* x, int64_t n, int dim) {
    for (int64_t r = 0; r < n; ++r) {
        double s = 0;
        for (int c = 0; c < dim; ++c) s += double(x[r * dim + c]) * x[r * dim + c];
        if (s <= 0) continue;
        const float inv = static_cast<float>(1.0 / std::sqrt(s));
        for (int c = 0; c < dim; ++c) x[r * dim + c] *= inv;
    }
}

// PLAID's default: the power of two nearest 16 * sqrt(n_tokens) (floor of log2), capped so
// that every centroid has at least 8 training tokens.
int auto_centroids(int64_t n_tokens, int64_t n_train) {
    const double target = 16.0 * std::sqrt(static_cast<double>(n_tokens));
    int k = 1 << static_cast<int>(std::floor(std::log2(std::max(1.0, target))));
    while (k > 1 && int64_t(k) * 8 > n_train) k >>= 1;
    return k;
}

}  // namespace

int64_t TrainSampleTokens(int64_t n_tokens, int n_centroids, const IndexBuildOptions& opts) {
    int64_t n = std::max(kMinTrainTokens, int64_t(opts.train_tokens_per_centroid) * n_centroids);
    if (opts.max_train_tokens > 0) n = std::min(n, opts.max_train_tokens);
    return std::min(n, n_tokens);
}

namespace {
template <typename It>
void sort_on_every_thread(It first, It last) {
#if __has_include(<parallel/algorithm>)
    __gnu_parallel::sort(first, last);
#else
    std::sort(first, last);
#endif
}

// k distinct values of [0, n), uniformly at random, sorted: random draws, sorted and
// deduplicated, topped up (each top-up sorted and merged in) until there are enough. Above n / 2
// the complement is drawn instead (so the top-ups always converge fast). The sorts run on every
// thread: at 1M documents a sample is 4M values. The draw ends by shuffling a copy, only to
// advance `rng` as this sampler always has: the codec's sample is drawn next from the same `rng`,
// and every index built depends on both.
std::vector<int64_t> sorted_sample_impl(int64_t n, int64_t k, std::mt19937_64& rng) {
    std::vector<int64_t> out;
    if (k >= n) {
        out.resize(n);
        std::iota(out.begin(), out.end(), int64_t(0));
        return out;
    }
    const bool complement = k > n / 2;
    const int64_t want = complement ? n - k : k;
    std::uniform_int_distribution<int64_t> any(0, n - 1);
    std::vector<int64_t> pick;
    while (int64_t(pick.size()) < want) {
        const auto sorted = static_cast<std::ptrdiff_t>(pick.size());
        while (int64_t(pick.size()) < want) pick.push_back(any(rng));
        sort_on_every_thread(pick.begin() + sorted, pick.end());
        std::inplace_merge(pick.begin(), pick.begin() + sorted, pick.end());
        pick.erase(std::unique(pick.begin(), pick.end()), pick.end());
    }
    {
        std::vector<int64_t> order(pick);
        std::shuffle(order.begin(), order.end(), rng);
    }
    if (!complement) return pick;
    out.reserve(k);
    size_t j = 0;
    for (int64_t v = 0; v < n; ++v) {
        if (j < pick.size() && pick[j] == v) {
            ++j;
        } else {
            out.push_back(v);
        }
    }
    return out;
}

// The codec's training sample (PQ trains each sub-quantizer on up to 16,384 of them; the residual
// buckets are quantiles of up to 4M values).
constexpr int64_t kCodecTrainTokens = 65536;

int auto_pq_m(int dim) {
    int m = std::min(32, std::max(1, dim / 8));
    while (m > 1 && dim % m != 0) --m;
    return m;
}


Status validate_input(const EmbeddingView& tokens, const std::vector<int64_t>& doclens,
                      std::vector<std::string>* doc_ids) {
    if (tokens.dim < 32 || tokens.dim > 1024) {
        return Status::InvalidArgument("docs: dimension " + std::to_string(tokens.dim) +
                                       " outside the supported range [32, 1024]");
    }
    if (doclens.empty()) return Status::InvalidArgument("doclens: no documents");
    if (doclens.size() > size_t(INT32_MAX)) {
        return Status::NotSupported("doclens: " + std::to_string(doclens.size()) +
                                    " documents; one index holds at most 2^31 - 1 (split the corpus into shards)");
    }
    TMS_RETURN_IF_ERROR(CheckDocLens(doclens, tokens.rows, "doclens", "docs"));
    if (doc_ids->empty()) {
        doc_ids->resize(doclens.size());
        for (size_t i = 0; i < doclens.size(); ++i) (*doc_ids)[i] = std::to_string(i);
    }
    if (doc_ids->size() != doclens.size()) {
        return Status::InvalidArgument("doc-ids: " + std::to_string(doc_ids->size()) + " ids for " +
                                       std::to_string(doclens.size()) + " documents");
    }
    std::unordered_set<std::string> seen;
    seen.reserve(doc_ids->size());
    for (size_t i = 0; i < doc_ids->size(); ++i) {
        const std::string& id = (*doc_ids)[i];
        TMS_RETURN_IF_ERROR(CheckId(id, "doc-ids: line " + std::to_string(i + 1)));
        if (!seen.insert(id).second) {
            return Status::InvalidArgument("doc-ids: line " + std::to_string(i + 1) + ": duplicate id '" + id + "'");
        }
    }
    return Status::OK();
}

// Nearest centroid (max inner product; centroids have unit norm) of each row.
Status assign(const float* x, int64_t n, const IndexModel& m, uint32_t* out) {
    return kernels::nearest_cpu(
        {.x = x, .n = n, .dim = m.dim, .centroids = m.centroids.data(), .n_centroids = m.n_centroids, .labels = out});
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

void pq_encode(const float* r, int64_t n, const IndexModel& m, const float* book_t, const float* norms, uint8_t* codes) {
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

Status train_codec(const float* residuals, int64_t n, const IndexBuildOptions& opts, IndexModel* m,
                   std::unique_ptr<faiss::ProductQuantizer>* pq) {
    const int dim = m->dim;
    if (m->codec == "pq") {
        m->pq_m = opts.pq_m > 0 ? opts.pq_m : auto_pq_m(dim);
        m->pq_nbits = opts.pq_nbits;
        if (m->pq_nbits != 8) return Status::NotSupported("pq_nbits " + std::to_string(m->pq_nbits) + ": only 8 is supported");
        if (dim % m->pq_m != 0) {
            return Status::InvalidArgument("pq_m " + std::to_string(m->pq_m) + " does not divide dim " + std::to_string(dim));
        }
        if (n < 256) {
            return Status::InvalidArgument("the pq codec needs at least 256 tokens to train, corpus has " +
                                           std::to_string(n) + " (use --codec residual)");
        }
        // Same as faiss::ProductQuantizer::train, but the M sub-quantizers train in parallel
        // (FAISS trains them one after the other). 16K samples per sub-quantizer.
        const int M = m->pq_m, dsub = dim / M, ksub = 1 << m->pq_nbits;
        const int64_t ns = std::min<int64_t>(n, int64_t(64) * ksub);
        m->codebook.assign(size_t(M) * ksub * dsub, 0.0f);
        std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 1)
        for (int sq = 0; sq < M; ++sq) {
            try {
                std::vector<float> sub(size_t(ns) * dsub);
                for (int64_t i = 0; i < ns; ++i)
                    std::copy_n(residuals + i * dim + sq * dsub, dsub, sub.data() + i * dsub);
                faiss::ClusteringParameters cp;
                cp.niter = 25;
                cp.min_points_per_centroid = 1;
                cp.max_points_per_centroid = 1 << 30;
                cp.seed = static_cast<int>(opts.seed) + sq;
                cp.verbose = false;
                faiss::Clustering clus(dsub, ksub, cp);
                faiss::IndexFlatL2 l2(dsub);
                clus.train(ns, sub.data(), l2);
                std::copy(clus.centroids.begin(), clus.centroids.end(), m->codebook.begin() + size_t(sq) * ksub * dsub);
            } catch (...) {
#pragma omp critical
                if (!error) error = std::current_exception();
            }
        }
        if (error) std::rethrow_exception(error);
        m->n_code_bytes = M;
        return Status::OK();
    }
    if (m->codec == "residual") {
        const int nbits = opts.residual_nbits;
        if (nbits != 1 && nbits != 2 && nbits != 4) {
            return Status::InvalidArgument("residual_nbits " + std::to_string(nbits) + ": expected 1, 2 or 4");
        }
        if ((dim * nbits) % 8 != 0) {
            return Status::NotSupported("residual codec needs dim * nbits to be a multiple of 8");
        }
        m->residual_nbits = nbits;
        // Quantiles of the residual values: of all of them, or of an evenly strided (stride coprime to dim) ~4M-value
        // subsample (a full sort of a 262K x 128 sample alone took 3.7 s).
        const int64_t total = n * dim, cap = int64_t(1) << 22;
        int64_t stride = std::max<int64_t>(1, (total + cap - 1) / cap);
        while (stride > 1 && std::gcd(stride, int64_t(dim)) != 1) ++stride;  // every dimension sampled
        std::vector<float> vals;
        vals.reserve(size_t(total / stride + 1));
        for (int64_t i = 0; i < total; i += stride) vals.push_back(residuals[i]);
        std::sort(vals.begin(), vals.end());
        const int nb = 1 << nbits;
        auto q = [&](double f) { return vals[std::min<size_t>(vals.size() - 1, static_cast<size_t>(f * vals.size()))]; };
        // Cutoffs at the quantiles (PLAID's equal-mass buckets); each bucket decodes to the mean of
        // its values, the reconstruction of least squared error for these cutoffs (PLAID takes
        // the bucket's median, the quantile between its cutoffs; an empty bucket still does).
        m->residual_cutoffs.clear();
        m->residual_weights.clear();
        for (int i = 1; i < nb; ++i) m->residual_cutoffs.push_back(q(double(i) / nb));
        size_t lo = 0;
        for (int i = 0; i < nb; ++i) {
            // Encoding puts v in the bucket of the cutoffs <= v: bucket i is [cutoff i-1, cutoff i).
            const size_t hi = i + 1 < nb ? static_cast<size_t>(std::lower_bound(vals.begin(), vals.end(),
                                                                                m->residual_cutoffs[i]) - vals.begin())
                                         : vals.size();
            double sum = 0;
            for (size_t k = lo; k < hi; ++k) sum += vals[k];
            m->residual_weights.push_back(hi > lo ? static_cast<float>(sum / double(hi - lo)) : q((i + 0.5) / nb));
            lo = hi;
        }
        m->n_code_bytes = dim * nbits / 8;
        m->codebook = ResidualCodebook(m->residual_weights, nbits, m->n_code_bytes);
        return Status::OK();
    }
    return Status::InvalidArgument("unknown codec '" + m->codec + "' (expected pq or residual)");
}

}  // namespace

Status ValidateInput(const EmbeddingView& tokens, const std::vector<int64_t>& doclens, std::vector<std::string>* doc_ids) {
    return validate_input(tokens, doclens, doc_ids);
}

namespace {
Status train_model(const std::vector<EmbeddingView>& shards, const IndexBuildOptions& opts, IndexModel* out,
                   std::vector<std::pair<std::string, double>>* phases, const std::vector<std::string>* names,
                   const ReleaseFn& release);
}  // namespace

Status TrainModel(const std::vector<EmbeddingView>& shards, const IndexBuildOptions& opts, IndexModel* out,
                  std::vector<std::pair<std::string, double>>* phases, const std::vector<std::string>* names,
                  const ReleaseFn& release) {
    return status_of("training the index model", [&] { return train_model(shards, opts, out, phases, names, release); });
}

namespace {
Status train_model(const std::vector<EmbeddingView>& shards, const IndexBuildOptions& opts, IndexModel* out,
                   std::vector<std::pair<std::string, double>>* phases, const std::vector<std::string>* names,
                   const ReleaseFn& release) {
    kernels::SetThreads(opts.threads);
    SingleThreadedBlas();
    if (shards.empty()) return Status::InvalidArgument("no token embeddings");
    const int dim = shards[0].dim;
    int64_t n_tokens = 0;
    for (const auto& v : shards) n_tokens += v.rows;
    IndexModel m;
    m.dim = dim;
    m.codec = opts.codec;
    if (m.codec != "pq" && m.codec != "residual") {
        return Status::InvalidArgument("unknown codec '" + m.codec + "' (expected pq or residual)");
    }
    auto t0 = std::chrono::steady_clock::now();
    // 1. Sample training tokens: n_train distinct rows drawn directly (no pass over the corpus),
    //    read in increasing order; memory is the sample only, whatever the corpus size.
    const int64_t most = opts.max_train_tokens > 0 ? std::min(n_tokens, opts.max_train_tokens) : n_tokens;
    m.n_centroids = opts.n_centroids > 0 ? opts.n_centroids : auto_centroids(n_tokens, most);
    const int64_t n_train = TrainSampleTokens(n_tokens, m.n_centroids, opts);
    if (m.n_centroids > n_train) {
        return Status::InvalidArgument("n_centroids " + std::to_string(m.n_centroids) + " exceeds the " +
                                       std::to_string(n_train) + " training tokens");
    }
    // The codec trains on the residuals of its own sample, drawn independently of the k-means
    // one: residuals of the k-means sample to the centroids fitted to it are smaller than the
    // corpus's (at 32 tokens a centroid, 5% in RMS), which set the bucket cutoffs too narrow.
    // Drawn independently, it holds k-means rows in their share of the corpus, as the encoder
    // will meet them. PLAID holds out part of its sample for the same reason.
    const int64_t n_codec = std::min(n_tokens, kCodecTrainTokens);
    // Not zeroed: every row is written by the parallel read below (its first touch, so that the
    // pages fault in on every thread, not in one memset).
    std::unique_ptr<float[]> train(new float[size_t(n_train) * dim]);
    std::unique_ptr<float[]> codec(new float[size_t(n_codec) * dim]);
    bool unit = true;  // every sampled token a unit vector (IndexModel::unit_norm)
    {
        std::mt19937_64 rng(opts.seed);
        const std::vector<int64_t> pick = sorted_sample_impl(n_tokens, n_train, rng);
        const std::vector<int64_t> pick_codec = sorted_sample_impl(n_tokens, n_codec, rng);
        phases->emplace_back("kmeans.sample.draw", SecondsSince(t0));
        // Both samples in one increasing read: each row once, into the k-means sample where it
        // is in it (then copied to the codec's), else into the codec's.
        struct Read {
            int64_t row;
            float* dst;
            float* copy;  // or null
        };
        std::vector<Read> reads;
        reads.reserve(pick.size() + pick_codec.size());
        for (size_t i = 0, j = 0; i < pick.size() || j < pick_codec.size();) {
            const bool take_i = i < pick.size() && (j == pick_codec.size() || pick[i] <= pick_codec[j]);
            const bool both = take_i && j < pick_codec.size() && pick[i] == pick_codec[j];
            if (take_i) {
                reads.push_back({pick[i], train.get() + i * dim, both ? codec.get() + j * dim : nullptr});
                ++i;
                j += both;
            } else {
                reads.push_back({pick_codec[j], codec.get() + j * dim, nullptr});
                ++j;
            }
        }
        std::vector<int64_t> starts(shards.size() + 1, 0);  // first global row of each shard
        for (size_t i = 0; i < shards.size(); ++i) starts[i + 1] = starts[i] + shards[i].rows;
        auto shard_of = [&](int64_t r) {
            return static_cast<size_t>(std::upper_bound(starts.begin() + 1, starts.end(), r) - starts.begin() - 1);
        };
        // Blocks of rows in parallel, the pages behind each block released after it.
        constexpr int64_t kSampleBlock = 65536;
        const int64_t n_reads = static_cast<int64_t>(reads.size());
        for (int64_t b0 = 0; b0 < n_reads; b0 += kSampleBlock) {
            const int64_t b1 = std::min(n_reads, b0 + kSampleBlock);
            int64_t first_bad = b1;  // read of the first non-finite value
            bool block_unit = true;
#pragma omp parallel for schedule(static) reduction(min : first_bad) reduction(&& : block_unit)
            for (int64_t i = b0; i < b1; ++i) {
                const Read& r = reads[i];
                const size_t sh = shard_of(r.row);
                float* row = r.dst;
                rows_to_float(shards[sh], r.row - starts[sh], 1, row);
                double ss = 0;
                bool finite = true;
                for (int j = 0; j < dim; ++j) {
                    finite = finite && std::abs(row[j]) <= kMaxEmbeddingValue;
                    ss += double(row[j]) * row[j];
                }
                if (!finite) first_bad = std::min(first_bad, i);
                block_unit = block_unit && std::abs(std::sqrt(ss) - 1.0) <= 0.01;
                if (r.copy) std::copy_n(row, dim, r.copy);
            }
            if (first_bad < b1) {
                const Read& r = reads[first_bad];
                const size_t sh = shard_of(r.row);
                int j = 0;
                while (j < dim && std::abs(r.dst[j]) <= kMaxEmbeddingValue) ++j;
                return NonFiniteError(names && sh < names->size() ? (*names)[sh] : "docs", r.row - starts[sh], j,
                                      r.dst[std::min(j, dim - 1)]);
            }
            unit = unit && block_unit;
            if (release) {
                const size_t sh = shard_of(reads[b1 - 1].row);
                release(sh, reads[b1 - 1].row - starts[sh]);  // sampled pages behind us
            }
        }
    }
    phases->emplace_back("kmeans.sample", SecondsSince(t0));
    m.unit_norm = unit && n_train > 0;
    // 2. k-means.
    std::unique_ptr<GpuAssigner> gpu;
    TMS_RETURN_IF_ERROR(MaybeGpuAssigner(opts.device, opts.gpu, &gpu));
    if (gpu) (void)gpu->PinHost(train.get(), size_t(n_train) * dim * sizeof(float));  // read 5 times
    const bool say = opts.progress && StderrIsTerminal();
    if (say) {
        LogInfo("k-means: %d centroids, %lld sampled tokens, %d iterations on the %s...\n", m.n_centroids,
                static_cast<long long>(n_train), opts.kmeans_iters, gpu ? "GPU" : "CPU");
    }
    {
        // Every iteration in one FAISS call (one call per iteration would check the whole sample
        // is finite each time, and reseeds the splitting of empty clusters: other centroids);
        // the progress bar advances once an assignment.
        faiss::ClusteringParameters cp;
        cp.spherical = true;
        cp.verbose = false;
        cp.seed = static_cast<int>(opts.seed);
        cp.min_points_per_centroid = 1;
        cp.max_points_per_centroid = 1 << 30;
        faiss::Clustering clus(dim, m.n_centroids, cp);
        Progress prog("k-means", opts.kmeans_iters, opts.progress, " it");
        ParallelFlatIP ip(dim, gpu.get(), &prog);
        clus.niter = opts.kmeans_iters;
        if (clus.niter > 0) clus.train(n_train, train.get(), ip);
        prog.Done();
        m.centroids.assign(clus.centroids.begin(), clus.centroids.end());
        // FAISS never leaves a cluster empty: it fills one with a copy of a populated centroid
        // scaled by 1 +- 1/1024 on alternate dimensions (split_clusters), and the last
        // iteration's copies are never assigned again. Where the sample has fewer distinct
        // tokens than centroids (every token equal, a few repeated) most centroids are such
        // copies, spread around their token along those two directions: they outrank it for
        // almost any query token, and probing would pick their empty lists. They are dropped:
        // every centroid kept is the mean of sampled tokens.
        if (ip.assigned.size() == size_t(m.n_centroids)) {
            int kept = 0;
            for (int c = 0; c < m.n_centroids; ++c) {
                if (!ip.assigned[size_t(c)]) continue;
                if (kept != c) std::copy_n(m.centroids.begin() + int64_t(c) * dim, dim, m.centroids.begin() + int64_t(kept) * dim);
                ++kept;
            }
            m.n_centroids = kept;
            m.centroids.resize(size_t(kept) * dim);
        }
        normalize_rows(m.centroids.data(), m.n_centroids, dim);
        phases->emplace_back("kmeans.assign", ip.assign_s);
    }
    phases->emplace_back("kmeans", SecondsSince(t0));
    // 3. Train the codec on the residuals of its sample.
    t0 = std::chrono::steady_clock::now();
    {
        if (say) LogInfo("training the %s codec on %lld tokens' residuals...\n", m.codec.c_str(),
                         static_cast<long long>(n_codec));
        std::vector<uint32_t> ta(n_codec);
        if (gpu) {
            TMS_RETURN_IF_ERROR(gpu->SetCentroids(m.centroids.data(), m.n_centroids, dim));
            TMS_RETURN_IF_ERROR(gpu->Assign(codec.get(), n_codec, ta.data(), nullptr));
        } else {
            TMS_RETURN_IF_ERROR(assign(codec.get(), n_codec, m, ta.data()));
        }
        for (int64_t i = 0; i < n_codec; ++i) {
            const float* c = m.centroids.data() + size_t(ta[i]) * dim;
            for (int j = 0; j < dim; ++j) codec[i * dim + j] -= c[j];
        }
        std::unique_ptr<faiss::ProductQuantizer> pq;
        TMS_RETURN_IF_ERROR(train_codec(codec.get(), n_codec, opts, &m, &pq));
    }
    phases->emplace_back("train_codec", SecondsSince(t0));
    *out = std::move(m);
    return Status::OK();
}
}  // namespace

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
    if (e->impl_->gpu) TMS_RETURN_IF_ERROR(e->impl_->gpu->SetCentroids(model.centroids.data(), model.n_centroids, model.dim));
    else TMS_RETURN_IF_ERROR(kernels::check_blas_room(omp_get_max_threads(), 0, "encoding on the CPU"));
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
                    e->impl_->book_t[(size_t(m) * dsub + j) * 256 + c] = model.codebook[(size_t(m) * 256 + c) * dsub + j];
        e->impl_->norms = PqCodeNorms(model);
    } else if (model.codec != "residual") {
        return Status::Corruption("unknown codec '" + model.codec + "'");
    }
    *out = std::move(e);
    return Status::OK();
}

Status Encoder::Encode(const EmbeddingView& tokens, int64_t row0, int64_t n, uint32_t* cids, uint8_t* codes) {
    const IndexModel& m = *impl_->model;
    const int dim = m.dim;
    if (tokens.dim != dim) return Status::InvalidArgument("dimension " + std::to_string(tokens.dim) + " differs from the index's " + std::to_string(dim));
    if (impl_->genc) return impl_->genc->Encode(tokens, row0, n, cids, codes);
    try {
        const int64_t batch = impl_->gpu ? 4 * kBatch : cpu_batch(m.n_centroids);
        for (int64_t b = 0; b < n; b += batch) {
            const int64_t nb = std::min(batch, n - b);
            impl_->x.resize(size_t(nb) * dim);
            float* x = impl_->x.data();
            rows_to_float(tokens, row0 + b, nb, x);
            TMS_RETURN_IF_ERROR(check_finite_rows(x, nb, dim, row0 + b, "docs"));
            if (impl_->gpu) {
                TMS_RETURN_IF_ERROR(impl_->gpu->Assign(x, nb, cids + b, nullptr));
            } else {
                TMS_RETURN_IF_ERROR(assign(x, nb, m, cids + b));
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
            for (int j = 0; j < per_byte; ++j) book[(size_t(b) * 256 + v) * per_byte + j] = weights[(v >> (nbits * j)) & mask];
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

std::vector<int64_t> SortedSample(int64_t n, int64_t k, uint64_t seed) {
    std::mt19937_64 rng(seed);
    return sorted_sample_impl(n, k, rng);
}

void ToHalf(const EmbeddingView& tokens, int64_t row0, int64_t n, uint16_t* out, bool parallel) {
    const int64_t base = row0 * tokens.dim, cnt = n * tokens.dim;
    if (tokens.dtype == DType::kF16) {
        const uint16_t* from = static_cast<const uint16_t*>(tokens.data) + base;
        if (parallel) kernels::ParallelMemcpy(out, from, size_t(cnt) * sizeof(uint16_t));
        else std::memcpy(out, from, size_t(cnt) * sizeof(uint16_t));
    } else {
#pragma omp parallel for schedule(static) if (parallel)
        for (int64_t i = 0; i < cnt; ++i) out[i] = kernels::float_to_half(kernels::load_as_float(tokens.data, tokens.dtype, base + i));
    }
}

namespace {

Status build_impl(const EmbeddingView& tokens, const std::vector<int64_t>& doclens, std::vector<std::string> doc_ids,
                  const IndexBuildOptions& opts, IndexData* out, std::vector<std::pair<std::string, double>>* phases) {
    TMS_RETURN_IF_ERROR(validate_input(tokens, doclens, &doc_ids));
    TMS_RETURN_IF_ERROR(TrainModel({tokens}, opts, &out->model, phases));
    const IndexModel& m = out->model;
    const int dim = tokens.dim;
    const int64_t n_tokens = tokens.rows;
    const int64_t n_docs = static_cast<int64_t>(doclens.size());
    auto t0 = std::chrono::steady_clock::now();
    out->token_centroids.resize(n_tokens);
    out->codes.resize(size_t(n_tokens) * m.n_code_bytes);
    std::unique_ptr<Encoder> enc;
    TMS_RETURN_IF_ERROR(Encoder::Create(m, opts.device, opts.gpu, &enc));
    TMS_RETURN_IF_ERROR(enc->Encode(tokens, 0, n_tokens, out->token_centroids.data(), out->codes.data()));
    phases->emplace_back("encode", SecondsSince(t0));
    t0 = std::chrono::steady_clock::now();
    out->doc_offsets.assign(n_docs + 1, 0);
    for (int64_t d = 0; d < n_docs; ++d) out->doc_offsets[d + 1] = out->doc_offsets[d] + doclens[d];
    {
        std::vector<std::vector<int32_t>> lists(m.n_centroids);
        for (int64_t d = 0; d < n_docs; ++d) {
            for (int64_t t = out->doc_offsets[d]; t < out->doc_offsets[d + 1]; ++t) {
                auto& l = lists[out->token_centroids[t]];
                if (l.empty() || l.back() != d) l.push_back(static_cast<int32_t>(d));
            }
        }
        out->ivf_offsets.assign(m.n_centroids + 1, 0);
        for (int k = 0; k < m.n_centroids; ++k) out->ivf_offsets[k + 1] = out->ivf_offsets[k] + int64_t(lists[k].size());
        out->ivf_docs.clear();
        out->ivf_docs.reserve(out->ivf_offsets.back());
        for (auto& l : lists) out->ivf_docs.insert(out->ivf_docs.end(), l.begin(), l.end());
    }
    if (opts.keep_vectors) {
        out->vectors.resize(size_t(n_tokens) * dim);
        ToHalf(tokens, 0, n_tokens, out->vectors.data());
    } else {
        out->vectors.clear();
    }
    out->doc_ids = std::move(doc_ids);
    phases->emplace_back("ivf", SecondsSince(t0));
    FillInfo(m, n_docs, n_tokens, opts, &out->info);
    return Status::OK();
}

}  // namespace

void FillInfo(const IndexModel& m, int64_t n_docs, int64_t n_tokens, const IndexBuildOptions& opts, IndexInfo* info) {
    *info = IndexInfo{};
    info->n_docs = n_docs;
    info->n_tokens = n_tokens;
    info->dim = m.dim;
    info->n_centroids = m.n_centroids;
    info->codec = m.codec;
    info->pq_m = m.pq_m;
    info->pq_nbits = m.pq_nbits;
    info->residual_nbits = m.residual_nbits;
    info->has_vectors = opts.keep_vectors;
    info->code_bytes_per_token = 4.0 + m.n_code_bytes;  // u32 centroid id + codes
    info->vector_bytes_per_token = opts.keep_vectors ? 2.0 * m.dim : 0.0;
    info->build_config_json = BuildOptionsToJson(opts);
}

void SingleThreadedBlas() {
    if (openblas_set_num_threads != nullptr) openblas_set_num_threads(1);
}

void CentroidScores(const float* x, int64_t n, const IndexModel& model, float* out) {
    kernels::inner_products_cpu(x, n, model.centroids.data(), model.n_centroids, model.dim, out);
}

Status BuildIndexData(const EmbeddingView& tokens, const std::vector<int64_t>& doclens, std::vector<std::string> doc_ids,
                      const IndexBuildOptions& opts, IndexData* out,
                      std::vector<std::pair<std::string, double>>* phase_seconds) {
    return status_of("building the index",
                     [&] { return build_impl(tokens, doclens, std::move(doc_ids), opts, out, phase_seconds); });
}

}  // namespace tms::index

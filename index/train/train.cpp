// Copyright TileMaxSim authors. Training an index's model: sampling, k-means (FAISS), codec training (FAISS
// ProductQuantizer / PLAID residual buckets). The only FAISS adapter of the project: FAISS
// exceptions become Status here.

#include <faiss/Clustering.h>
#include <faiss/IndexFlat.h>
#include <faiss/impl/FaissAssert.h>
#include <faiss/impl/FaissException.h>
#include <faiss/impl/ProductQuantizer.h>
#include <omp.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#if __has_include(<parallel/algorithm>)
#include <parallel/algorithm>  // libstdc++'s OpenMP sort
#endif
#include <random>

#include "base/log.h"
#include "base/progress.h"
#include "index/encode/encoder.h"
#include "index/encode/gpu_assign.h"
#include "index/ingest/input_checks.h"
#include "index/store/index_reader.h"
#include "index/train/train.h"
#include "kernels/nearest.h"
#include "kernels/threads.h"

namespace tms::index {

namespace {

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

// FAISS's flat index runs one BLAS call at a time; k-means assignment (k = 1) here runs
// kernels::nearest_cpu (row blocks over the OpenMP threads) instead.
// With a GpuAssigner, the assignment runs on the GPU instead (centroids re-uploaded per call:
// k-means replaces them every iteration).
struct ParallelFlatIP : faiss::IndexFlatIP {
    ParallelFlatIP(int d, GpuAssigner* gpu, Progress* iterations)
        : faiss::IndexFlatIP(d), gpu_(gpu), its_(iterations) {}
    GpuAssigner* gpu_;
    Progress* its_;                      // advanced once a k = 1 search: k-means runs one an iteration
    mutable double assign_s = 0;         // seconds in k = 1 searches (the assignments)
    mutable std::vector<char> assigned;  // per centroid: whether the last assignment gave it a row
    void search(faiss::Index::idx_t n, const float* x, faiss::Index::idx_t k, float* distances,
                faiss::Index::idx_t* labels, const faiss::SearchParameters* params = nullptr) const override {
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
            st = kernels::nearest_cpu({.x = x,
                                       .n = n,
                                       .dim = static_cast<int>(d),
                                       .centroids = get_xb(),
                                       .n_centroids = K,
                                       .labels = lab.data(),
                                       .best = distances});
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

}  // namespace

int AutoCentroids(int64_t n_tokens, int64_t n_train) {
    const double target = 16.0 * std::sqrt(static_cast<double>(n_tokens));
    int k = 1 << static_cast<int>(std::floor(std::log2(std::max(1.0, target))));
    while (k > 1 && int64_t(k) * 8 > n_train) k >>= 1;
    return k;
}

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

Status train_codec(const float* residuals, int64_t n, const IndexBuildOptions& opts, IndexModel* m,
                   std::unique_ptr<faiss::ProductQuantizer>* pq) {
    const int dim = m->dim;
    if (m->codec == "pq") {
        m->pq_m = opts.pq_m > 0 ? opts.pq_m : auto_pq_m(dim);
        m->pq_nbits = opts.pq_nbits;
        if (m->pq_nbits != 8)
            return Status::NotSupported("pq_nbits " + std::to_string(m->pq_nbits) + ": only 8 is supported");
        if (dim % m->pq_m != 0) {
            return Status::InvalidArgument("pq_m " + std::to_string(m->pq_m) + " does not divide dim " +
                                           std::to_string(dim));
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
        auto q = [&](double f) {
            return vals[std::min<size_t>(vals.size() - 1, static_cast<size_t>(f * vals.size()))];
        };
        // Cutoffs at the quantiles (PLAID's equal-mass buckets); each bucket decodes to the mean of
        // its values, the reconstruction of least squared error for these cutoffs (PLAID takes
        // the bucket's median, the quantile between its cutoffs; an empty bucket still does).
        m->residual_cutoffs.clear();
        m->residual_weights.clear();
        for (int i = 1; i < nb; ++i) m->residual_cutoffs.push_back(q(double(i) / nb));
        size_t lo = 0;
        for (int i = 0; i < nb; ++i) {
            // Encoding puts v in the bucket of the cutoffs <= v: bucket i is [cutoff i-1, cutoff i).
            const size_t hi =
                i + 1 < nb ? static_cast<size_t>(std::lower_bound(vals.begin(), vals.end(), m->residual_cutoffs[i]) -
                                                 vals.begin())
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

namespace {
Status train_model(const std::vector<EmbeddingView>& shards, const IndexBuildOptions& opts, IndexModel* out,
                   std::vector<std::pair<std::string, double>>* phases, const std::vector<std::string>* names,
                   const ReleaseFn& release);
}  // namespace

Status TrainModel(const std::vector<EmbeddingView>& shards, const IndexBuildOptions& opts, IndexModel* out,
                  std::vector<std::pair<std::string, double>>* phases, const std::vector<std::string>* names,
                  const ReleaseFn& release) {
    return status_of("training the index model",
                     [&] { return train_model(shards, opts, out, phases, names, release); });
}

namespace {
Status train_model(const std::vector<EmbeddingView>& shards, const IndexBuildOptions& opts, IndexModel* out,
                   std::vector<std::pair<std::string, double>>* phases, const std::vector<std::string>* names,
                   const ReleaseFn& release) {
    kernels::SetThreads(opts.threads);
    kernels::SingleThreadedBlas();
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
    // Centroids reused from another index (IndexBuildOptions::centroids_from): no k-means sample.
    IndexModel given;
    const bool reuse = !opts.centroids_from.empty();
    if (reuse) {
        TMS_RETURN_IF_ERROR(ReadIndexModel(opts.centroids_from, &given).WithContext("centroids_from"));
        if (given.dim != dim) {
            return Status::InvalidArgument("centroids_from " + opts.centroids_from + ": its centroids have dimension " +
                                           std::to_string(given.dim) + "; the documents have " + std::to_string(dim));
        }
    }
    // 1. Sample training tokens: n_train distinct rows drawn directly (no pass over the corpus),
    //    read in increasing order; memory is the sample only, whatever the corpus size.
    const int64_t most = opts.max_train_tokens > 0 ? std::min(n_tokens, opts.max_train_tokens) : n_tokens;
    m.n_centroids = reuse ? given.n_centroids : opts.n_centroids > 0 ? opts.n_centroids : AutoCentroids(n_tokens, most);
    const int64_t n_train = reuse ? 0 : TrainSampleTokens(n_tokens, m.n_centroids, opts);
    if (!reuse && m.n_centroids > n_train) {
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
                RowsToFloat(shards[sh], r.row - starts[sh], 1, row);
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
    m.unit_norm = unit && n_train + n_codec > 0;
    // 2. k-means.
    std::unique_ptr<GpuAssigner> gpu;
    TMS_RETURN_IF_ERROR(MaybeGpuAssigner(opts.device, opts.gpu, &gpu));
    if (gpu && n_train > 0) (void)gpu->PinHost(train.get(), size_t(n_train) * dim * sizeof(float));  // read 5 times
    const bool say = opts.progress && StderrIsTerminal();
    if (say && !reuse) {
        LogInfo("k-means: %d centroids, %lld sampled tokens, %d iterations on the %s...\n", m.n_centroids,
                static_cast<long long>(n_train), opts.kmeans_iters, gpu ? "GPU" : "CPU");
    }
    if (reuse) {
        m.centroids = std::move(given.centroids);
    } else {
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
                if (kept != c)
                    std::copy_n(m.centroids.begin() + int64_t(c) * dim, dim, m.centroids.begin() + int64_t(kept) * dim);
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
        if (say)
            LogInfo("training the %s codec on %lld tokens' residuals...\n", m.codec.c_str(),
                    static_cast<long long>(n_codec));
        std::vector<uint32_t> ta(n_codec);
        if (gpu) {
            TMS_RETURN_IF_ERROR(gpu->SetCentroids(m.centroids.data(), m.n_centroids, dim));
            TMS_RETURN_IF_ERROR(gpu->Assign(codec.get(), n_codec, ta.data(), nullptr));
        } else {
            TMS_RETURN_IF_ERROR(AssignNearest(codec.get(), n_codec, m, ta.data()));
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

std::vector<int64_t> SortedSample(int64_t n, int64_t k, uint64_t seed) {
    std::mt19937_64 rng(seed);
    return sorted_sample_impl(n, k, rng);
}

}  // namespace tms::index

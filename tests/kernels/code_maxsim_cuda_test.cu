// Copyright TileMaxSim authors. CUDA compressed MaxSim (PQ / PLAID residual codes) vs the fp64
// reference code_maxsim_ref, over one case table: PQ M in {8, 16, 32, 64} at d = 128,
// residual nbits in {1, 2, 4} at d in {64, 96, 128, 256}, centroid-only, empty and 1-token
// documents, ragged and dense candidates, empty candidate lists, query_lens including 0,
// two query groups; plus unsupported shapes and the engine's GpuCodeScorer vs the CPU path.
// Tolerance: |GPU - ref| <= 2 |naive - ref| + 1e-3 (1 + |ref|), where "naive" is the same
// computation on the CPU with the GPU's input roundings (fp16 queries, codebook, centroid
// scores; fp32 sums).
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <cmath>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tools/bench/bench_kernels.h"
#include "engine/gpu_code_scorer.h"
#include "kernels/cuda/code_maxsim_cuda.h"
#include "kernels/cuda/maxsim_cuda.h"
#include "kernels/maxsim.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/maxsim_cases.h"

namespace tms {
namespace {

using kernels::CodeMaxSimParams;
using test::DevBuf;

struct CodeCase {
    std::string name;
    int dim;
    int n_code_bytes;    // 0: centroid-only
    int residual_nbits;  // 0: PQ-style random codebook; 1/2/4: PLAID residual buckets
    int n_centroids;
    int n_queries;
    int q_stride;
    std::vector<int> query_lens;  // empty: all q_stride
    std::vector<int> doc_lens;
    bool ragged;
    std::vector<int> cand_counts;  // ragged: candidates per query (may be 0)
    uint32_t seed;
};

std::vector<int> lens(int n, int lo, int hi, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> u(lo, hi);
    std::vector<int> v(n);
    for (int& x : v) x = u(rng);
    return v;
}

// One case a line reads as a table.
// clang-format off
std::vector<CodeCase> code_cases() {
    std::vector<CodeCase> c;
    const std::vector<int> mixed = {0, 1, 2, 5, 17, 31, 32, 33, 64, 127, 128, 129, 300, 0, 1};
    for (int m : {8, 16, 32, 64}) {
        c.push_back({"pq" + std::to_string(m) + "_d128_ragged", 128, m, 0, 64, 3, 32, {32, 7, 0}, mixed, true,
                     {20, 0, 9}, uint32_t(100 + m)});
        c.push_back({"pq" + std::to_string(m) + "_d128_dense", 128, m, 0, 300, 2, 32, {}, lens(40, 1, 140, m), false,
                     {}, uint32_t(200 + m)});
    }
    for (int nbits : {1, 2, 4})
        for (int dim : {64, 96, 128, 256}) {
            const std::string n = "res" + std::to_string(nbits) + "_d" + std::to_string(dim);
            c.push_back({n + "_ragged", dim, dim * nbits / 8, nbits, 50, 3, 32, {32, 0, 13}, mixed, true, {25, 3, 0},
                         uint32_t(300 + nbits * 1000 + dim)});
            c.push_back({n + "_dense", dim, dim * nbits / 8, nbits, 17, 2, 32, {}, lens(30, 1, 90, dim + nbits), false,
                         {}, uint32_t(400 + nbits * 1000 + dim)});
        }
    c.push_back({"centroid_only_d128", 128, 0, 0, 100, 3, 32, {32, 5, 0}, mixed, true, {30, 30, 30}, 501});
    c.push_back({"centroid_only_d100_dense", 100, 0, 0, 7, 2, 20, {}, lens(20, 0, 70, 9), false, {}, 502});
    c.push_back({"one_token_docs", 128, 16, 0, 40, 2, 32, {}, std::vector<int>(50, 1), true, {50, 1}, 503});
    c.push_back({"empty_docs_only", 128, 32, 2, 40, 2, 32, {}, std::vector<int>(10, 0), false, {}, 504});
    c.push_back({"all_candidate_lists_empty", 128, 16, 0, 40, 3, 32, {}, {3, 4, 5}, true, {0, 0, 0}, 505});
    c.push_back({"no_docs_dense", 128, 16, 0, 40, 2, 32, {}, {}, false, {}, 506});
    c.push_back({"two_query_groups", 128, 32, 2, 60, 3, 70, {70, 33, 31}, lens(30, 1, 200, 10), true,
                 {40, 40, 40}, 507});
    // dsub 2 at dim 32 or 96 scores with the query fragments in registers (per-byte codebook),
    // loaded per group; at dim 128 with the paired codebook.
    c.push_back({"two_query_groups_dsub2", 96, 48, 0, 60, 3, 70, {70, 33, 31}, lens(30, 1, 200, 10), true,
                 {40, 40, 40}, 511});
    c.push_back({"two_query_groups_dsub2_d128", 128, 64, 0, 60, 3, 70, {70, 33, 31}, lens(30, 1, 200, 10), true,
                 {40, 40, 40}, 512});
    c.push_back({"q_stride1", 128, 16, 0, 60, 3, 1, {}, lens(30, 1, 60, 11), true, {10, 10, 10}, 508});
    c.push_back({"q_stride0", 128, 16, 0, 60, 2, 0, {}, lens(5, 1, 60, 12), false, {}, 509});
    c.push_back({"pq4_d128_dsub32", 128, 4, 0, 30, 2, 32, {}, lens(20, 1, 100, 13), true, {20, 20}, 510});
    return c;
}
// clang-format on

/// Host data of one case (float values exactly as the kernels see them).
struct CodeData {
    std::vector<float> q, cent, book, cs;
    std::vector<float> scales;  // decoded_scales_ref's, rounded to fp32 (with codes)
    std::vector<uint32_t> tc;
    std::vector<uint8_t> codes;
    std::vector<int64_t> doc_offsets, cand_offsets;
    std::vector<int32_t> query_lens, cand_docs;

    explicit CodeData(const CodeCase& c) {
        std::mt19937 rng(c.seed);
        std::normal_distribution<float> n01;
        const int dim = c.dim, K = c.n_centroids, nb = c.n_code_bytes;
        q.resize(size_t(c.n_queries) * c.q_stride * dim);
        for (size_t r = 0; r < q.size() / std::max(1, dim); ++r) {  // unit rows, like ColBERT output
            double ss = 0;
            for (int j = 0; j < dim; ++j) ss += std::pow(q[r * dim + j] = n01(rng), 2);
            for (int j = 0; j < dim; ++j) q[r * dim + j] = float(q[r * dim + j] / std::sqrt(ss));
        }
        cent.resize(size_t(K) * dim);
        for (int k = 0; k < K; ++k) {
            double ss = 0;
            for (int j = 0; j < dim; ++j) ss += std::pow(cent[size_t(k) * dim + j] = n01(rng), 2);
            for (int j = 0; j < dim; ++j) cent[size_t(k) * dim + j] = float(cent[size_t(k) * dim + j] / std::sqrt(ss));
        }
        const int dsub = nb ? dim / nb : 0;
        book.resize(size_t(nb) * 256 * dsub);
        if (c.residual_nbits == 0) {
            for (auto& x : book) x = n01(rng) * 0.05f;
        } else {
            const int nbits = c.residual_nbits, per = 8 / nbits, levels = 1 << nbits;
            std::vector<float> w(levels);
            for (int i = 0; i < levels; ++i) w[i] = 0.06f * (float(i) + 0.5f - levels / 2.0f) + n01(rng) * 0.005f;
            for (int b = 0; b < nb; ++b)
                for (int v = 0; v < 256; ++v)
                    for (int j = 0; j < per; ++j)
                        book[(size_t(b) * 256 + v) * per + j] = w[(v >> (nbits * j)) & (levels - 1)];
        }
        doc_offsets.assign(1, 0);
        for (int l : c.doc_lens) doc_offsets.push_back(doc_offsets.back() + l);
        const int64_t nt = doc_offsets.back();
        tc.resize(nt);
        codes.resize(size_t(nt) * nb);
        for (auto& x : tc) x = rng() % K;
        for (auto& x : codes) x = uint8_t(rng());
        if (nb > 0) {
            kernels::DecodedScaleParams sp;
            sp.centroids = cent.data();
            sp.n_centroids = K;
            sp.dim = dim;
            sp.token_centroids = tc.data();
            sp.codes = codes.data();
            sp.n_code_bytes = nb;
            sp.codebook = book.data();
            sp.n_tokens = nt;
            std::vector<double> s64(static_cast<size_t>(nt));
            if (!kernels::decoded_scales_ref(sp, s64.data()).ok()) std::abort();
            scales.assign(s64.begin(), s64.end());
        }
        cs.resize(size_t(c.n_queries) * c.q_stride * K);
        for (int i = 0; i < c.n_queries * c.q_stride; ++i)
            for (int k = 0; k < K; ++k) {
                double s = 0;
                for (int j = 0; j < dim; ++j) s += double(q[size_t(i) * dim + j]) * cent[size_t(k) * dim + j];
                cs[size_t(i) * K + k] = float(s);
            }
        query_lens.assign(c.query_lens.begin(), c.query_lens.end());
        if (c.ragged) {
            cand_offsets.assign(1, 0);
            const int nd = int(c.doc_lens.size());
            for (int qq = 0; qq < c.n_queries; ++qq) {
                const int cnt = nd ? c.cand_counts[qq] : 0;
                for (int i = 0; i < cnt; ++i) cand_docs.push_back(int32_t(rng() % nd));
                cand_offsets.push_back(int64_t(cand_docs.size()));
            }
        }
    }

    CodeMaxSimParams host_params(const CodeCase& c, float* scores) const {
        CodeMaxSimParams p;
        p.queries = q.data();
        p.n_queries = c.n_queries;
        p.q_stride = c.q_stride;
        p.dim = c.dim;
        p.query_lens = query_lens.empty() ? nullptr : query_lens.data();
        p.centroid_scores = cs.data();
        p.n_centroids = c.n_centroids;
        p.token_centroids = tc.data();
        p.codes = c.n_code_bytes ? codes.data() : nullptr;
        p.n_code_bytes = c.n_code_bytes;
        p.codebook = c.n_code_bytes ? book.data() : nullptr;
        p.doc_offsets = doc_offsets.data();
        p.n_docs = int64_t(c.doc_lens.size());
        p.cand_offsets = c.ragged ? cand_offsets.data() : nullptr;
        p.cand_docs = c.ragged ? cand_docs.data() : nullptr;
        p.scores = scores;
        return p;
    }
};

/// A case's inputs on the device, and its parameters pointing at them.
struct DevCase {
    DevBuf<float> q, book, cs, scales;
    DevBuf<uint32_t> tc;
    DevBuf<uint8_t> codes;
    DevBuf<int64_t> offs, coffs;
    DevBuf<int32_t> qlens, cdocs;
    explicit DevCase(const CodeData& d)
        : q(d.q),
          book(d.book),
          cs(d.cs),
          scales(d.scales),
          tc(d.tc),
          codes(d.codes),
          offs(d.doc_offsets),
          coffs(d.cand_offsets),
          qlens(d.query_lens),
          cdocs(d.cand_docs) {}
    CodeMaxSimParams params(const CodeCase& c, const CodeData& d, float* d_scores) const {
        CodeMaxSimParams p = d.host_params(c, d_scores);
        p.queries = q.d;
        p.query_lens = d.query_lens.empty() ? nullptr : qlens.d;
        p.centroid_scores = cs.d;
        p.token_centroids = tc.d;
        p.codes = c.n_code_bytes ? codes.d : nullptr;
        p.codebook = c.n_code_bytes ? book.d : nullptr;
        p.doc_offsets = offs.d;
        p.cand_offsets = c.ragged ? coffs.d : nullptr;
        p.cand_docs = c.ragged ? cdocs.d : nullptr;
        return p;
    }
};

float h16(float x) { return kernels::half_to_float(kernels::float_to_half(x)); }

/// The GPU's computation on the CPU: fp16 inputs, fp32 sums (for the tolerance); fp16_max (the
/// warpgroup-MMA kernel): each token's term is the fp16 sum of the fp16-rounded similarity and
/// the fp16 centroid score, as that kernel's fp16 fold. scaled: each token's term times its
/// scale (d.scales; in fp16 with fp16_max).
std::vector<double> naive_same_precision(const CodeCase& c, const CodeData& d, bool fp16_max, bool scaled = false) {
    std::vector<double> out;
    const int dim = c.dim, nb = c.n_code_bytes, dsub = nb ? dim / nb : 0, K = c.n_centroids;
    const int64_t n_docs = int64_t(c.doc_lens.size());
    for (int qq = 0; qq < c.n_queries; ++qq) {
        const int ql = d.query_lens.empty() ? c.q_stride : d.query_lens[qq];
        const int64_t n = c.ragged ? d.cand_offsets[qq + 1] - d.cand_offsets[qq] : n_docs;
        for (int64_t i = 0; i < n; ++i) {
            const int64_t doc = c.ragged ? d.cand_docs[d.cand_offsets[qq] + i] : i;
            float score = 0;
            for (int r = 0; r < ql; ++r) {
                const float* qv = d.q.data() + (size_t(qq) * c.q_stride + r) * dim;
                float best = -INFINITY;
                for (int64_t t = d.doc_offsets[doc]; t < d.doc_offsets[doc + 1]; ++t) {
                    const float cs = h16(d.cs[(size_t(qq) * c.q_stride + r) * K + d.tc[t]]);
                    float dot = 0;
                    for (int b = 0; b < nb; ++b) {
                        const float* e = d.book.data() + (size_t(b) * 256 + d.codes[size_t(t) * nb + b]) * dsub;
                        for (int j = 0; j < dsub; ++j) dot += h16(qv[b * dsub + j]) * h16(e[j]);
                    }
                    float term = fp16_max ? h16(float(double(h16(dot)) + double(cs))) : cs + dot;
                    if (scaled) term = fp16_max ? h16(term * h16(d.scales[t])) : term * d.scales[t];
                    best = std::max(best, term);
                }
                if (d.doc_offsets[doc + 1] > d.doc_offsets[doc]) score += best;
            }
            out.push_back(score);
        }
    }
    return out;
}

std::string describe(const CodeCase& c) {
    return "case " + c.name + " seed " + std::to_string(c.seed) + " dim " + std::to_string(c.dim) + " code bytes " +
           std::to_string(c.n_code_bytes) + " K " + std::to_string(c.n_centroids) + " nq " +
           std::to_string(c.n_queries) + " q_stride " + std::to_string(c.q_stride) + " docs " +
           std::to_string(c.doc_lens.size()) + (c.ragged ? " ragged" : " dense");
}

// The warpgroup-MMA kernel is what scores on an H100 / H200 in a build with sm_90a code (the
// default architectures) at dim 128, for every codec, and never in top-k mode, at other dims,
// without codes, or when not allowed.
TEST(CodeMaxSimCuda, WarpgroupMmaSelection) {
    SKIP_WITHOUT_GPU();
    cudaDeviceProp prop{};
    ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
    CodeMaxSimParams p{};
    p.dim = 128;
    p.n_code_bytes = 16;
    const bool hopper = prop.major == 9 && prop.minor == 0;
    EXPECT_EQ(kernels::code_maxsim_cuda_uses_wgmma(p), hopper && kernels::code_maxsim_cuda_built_sm90a());
    p.allow_wgmma = false;
    EXPECT_FALSE(kernels::code_maxsim_cuda_uses_wgmma(p));
    p.allow_wgmma = true;
    p.n_code_bytes = 0;
    EXPECT_FALSE(kernels::code_maxsim_cuda_uses_wgmma(p));
    p.n_code_bytes = 5;  // unsupported shape
    EXPECT_FALSE(kernels::code_maxsim_cuda_uses_wgmma(p));
    p.n_code_bytes = 32;  // 2-bit residual: yes at dim 128, not at 64 or 256
    p.codebook_shared = true;
    EXPECT_EQ(kernels::code_maxsim_cuda_uses_wgmma(p), hopper && kernels::code_maxsim_cuda_built_sm90a());
    p.dim = 64;
    p.n_code_bytes = 16;
    EXPECT_FALSE(kernels::code_maxsim_cuda_uses_wgmma(p));
    p.dim = 256;
    p.n_code_bytes = 64;
    EXPECT_FALSE(kernels::code_maxsim_cuda_uses_wgmma(p));
    // At dim 128 every decode class: PQ-8 .. PQ-64 (general or paired codebook) and 1-, 2- and
    // 4-bit residual (shared block).
    p.dim = 128;
    for (const bool shared : {false, true}) {
        for (const int n_code_bytes : {8, 16, 32, 64}) {
            if (shared && n_code_bytes == 8) continue;  // residual codes: 1, 2 or 4 bits a dim
            p.codebook_shared = shared;
            p.n_code_bytes = n_code_bytes;
            EXPECT_EQ(kernels::code_maxsim_cuda_uses_wgmma(p), hopper && kernels::code_maxsim_cuda_built_sm90a())
                << n_code_bytes << " code bytes, shared " << shared;
        }
    }
}

TEST(CodeMaxSimCuda, MatchesRefOnCaseTable) {
    SKIP_WITHOUT_GPU();
    for (const CodeCase& c : code_cases()) {
        SCOPED_TRACE(describe(c));
        const CodeData d(c);
        // With codes, every variant also with token scales (the decoded tokens' inverse norms).
        for (const bool scaled : {false, true}) {
            if (scaled && c.n_code_bytes == 0) continue;
            SCOPED_TRACE(scaled ? "token scales" : "no scales");
            CodeMaxSimParams hp = d.host_params(c, nullptr);
            hp.token_scales = scaled ? d.scales.data() : nullptr;
            const int64_t n = kernels::code_maxsim_num_scores(hp);
            std::vector<double> ref(static_cast<size_t>(n));
            ASSERT_TRUE(kernels::code_maxsim_ref(hp, d.cent.data(), ref.data()).ok());
            const std::vector<double> naive32 = naive_same_precision(c, d, false, scaled);
            const std::vector<double> naive16 = naive_same_precision(c, d, true, scaled);
            ASSERT_EQ(int64_t(naive32.size()), n);
            ASSERT_EQ(int64_t(naive16.size()), n);

            const DevCase dev(d);
            DevBuf<float> scores(static_cast<size_t>(n));
            CodeMaxSimParams p = dev.params(c, d, scores.d);
            p.token_scales = scaled ? dev.scales.d : nullptr;
            // Residual codebooks have one block for every code byte: score them through the general
            // layout (paired when dim % 64 == 0, else per byte) and through the replicated
            // shared block.
            ASSERT_EQ(kernels::codebook_blocks_equal(d.book.data(), c.dim, c.n_code_bytes),
                      c.n_code_bytes > 0 && c.residual_nbits > 0);
            // The queries again one float into a buffer: not 16-byte aligned, so the kernel fills
            // the query rows one value a load instead of 16 bytes a load.
            std::vector<float> shifted(1, 0.f);
            shifted.insert(shifted.end(), d.q.begin(), d.q.end());
            const DevBuf<float> q_shifted(shifted);
            // Variants 3 and 4: the codebook prepared once (code_codebook_image_cuda) and copied by
            // every CTA, for the general and the shared layout; p.codebook is then not read (null).
            const char* const names[] = {"per-byte codebook", "codebook_shared", "queries not 16-byte aligned",
                                         "codebook image", "codebook image, codebook_shared"};
            // Every variant through both kernels: the warpgroup-MMA one where this build and device
            // have it (sm_90a, compute capability 9.0), and the mma.sync one.
            for (const bool wg : {true, false})
                for (const int variant : {0, 1, 2, 3, 4}) {
                    const bool shared = variant == 1 || variant == 4, image = variant >= 3;
                    if (shared && c.residual_nbits == 0) continue;
                    if (image && c.n_code_bytes == 0) continue;
                    SCOPED_TRACE(names[variant]);
                    p.allow_wgmma = wg;
                    SCOPED_TRACE(kernels::code_maxsim_cuda_uses_wgmma(p) ? "warpgroup MMA" : "mma.sync");
                    p.codebook_shared = shared;
                    p.queries = variant == 2 ? q_shifted.d + 1 : dev.q.d;
                    p.codebook = dev.params(c, d, scores.d).codebook;
                    p.codebook_image = nullptr;
                    DevBuf<unsigned char> img(kernels::code_codebook_image_bytes(p));
                    if (image) {
                        ASSERT_GT(img.n, size_t(0));
                        ASSERT_EQ(cudaMemset(img.d, 0xff, img.n), cudaSuccess);  // every byte must be written
                        const Status ist = kernels::code_codebook_image_cuda(p, img.d, nullptr);
                        ASSERT_TRUE(ist.ok()) << ist.ToString();
                        p.codebook_image = img.d;
                        p.codebook = nullptr;
                    }
                    // Poison the output: every score must be written.
                    ASSERT_EQ(cudaMemset(scores.d, 0xff, std::max<size_t>(1, size_t(n)) * sizeof(float)), cudaSuccess);
                    const size_t ws_bytes = kernels::code_maxsim_cuda_workspace_bytes(p);
                    DevBuf<unsigned char> ws(ws_bytes);
                    const Status st = kernels::code_maxsim_cuda(p, ws.d, ws_bytes, nullptr);
                    ASSERT_TRUE(st.ok()) << st.ToString();
                    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                    const std::vector<float> got = scores.get();
                    const std::vector<double>& naive = kernels::code_maxsim_cuda_uses_wgmma(p) ? naive16 : naive32;
                    int bad = 0;
                    for (int64_t i = 0; i < n; ++i) {
                        const double tol = 2 * std::fabs(naive[i] - ref[i]) + 1e-3 * (1 + std::fabs(ref[i]));
                        if (!(std::fabs(got[i] - ref[i]) <= tol) && bad++ < 5) {
                            ADD_FAILURE()
                                << "score " << i << ": gpu " << got[i] << " ref " << ref[i] << " naive " << naive[i];
                        }
                    }
                    EXPECT_EQ(bad, 0);
                }
        }
    }
}

// The decoded tokens' inverse norms on the device against the CPU path and the reference,
// over the case table's codecs.
TEST(DecodedScalesCuda, MatchesCpuAndRef) {
    SKIP_WITHOUT_GPU();
    for (const CodeCase& c : code_cases()) {
        if (c.n_code_bytes == 0 || c.doc_lens.empty()) continue;
        SCOPED_TRACE(describe(c));
        const CodeData d(c);
        const int64_t nt = int64_t(d.tc.size());
        kernels::DecodedScaleParams p;
        p.centroids = d.cent.data();
        p.n_centroids = c.n_centroids;
        p.dim = c.dim;
        p.token_centroids = d.tc.data();
        p.codes = d.codes.data();
        p.n_code_bytes = c.n_code_bytes;
        p.codebook = d.book.data();
        p.n_tokens = nt;
        std::vector<float> cpu(static_cast<size_t>(nt));
        p.scales = cpu.data();
        ASSERT_TRUE(kernels::decoded_scales_cpu(p).ok());
        const DevBuf<float> cent(d.cent), book(d.book);
        const DevBuf<uint32_t> tc(d.tc);
        const DevBuf<uint8_t> codes(d.codes);
        DevBuf<float> out(static_cast<size_t>(nt));
        ASSERT_EQ(cudaMemset(out.d, 0xff, out.n * sizeof(float)), cudaSuccess);
        p.centroids = cent.d;
        p.token_centroids = tc.d;
        p.codes = codes.d;
        p.codebook = book.d;
        p.scales = out.d;
        const Status st = kernels::decoded_scales_cuda(p, nullptr);
        ASSERT_TRUE(st.ok()) << st.ToString();
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> got = out.get();
        for (int64_t t = 0; t < nt; ++t) {
            EXPECT_NEAR(got[t], d.scales[t], 1e-5 * d.scales[t]) << t;
            EXPECT_NEAR(got[t], cpu[t], 1e-5 * cpu[t]) << t;
        }
    }
}

// Per-query top-k on the device (code_maxsim_topk_cuda) against the host's top-k of the same
// kernel's scores, over the case table: ids and scores exactly, ties (empty and 1-token
// documents score alike) to the lower document index, short lists padded with -1 / -inf.
TEST(CodeMaxSimCuda, TopKEqualsTopOfScores) {
    SKIP_WITHOUT_GPU();
    for (const CodeCase& c : code_cases()) {
        SCOPED_TRACE(describe(c));
        const CodeData d(c);
        const DevCase dev(d);
        const int64_t n = kernels::code_maxsim_num_scores(d.host_params(c, nullptr));
        DevBuf<float> scores(static_cast<size_t>(n));
        CodeMaxSimParams p = dev.params(c, d, scores.d);
        p.allow_wgmma = false;  // top-k runs the mma.sync kernel: the same arithmetic, equal scores
        // With codes, the tokens scaled (the seed's parity picks: half the cases each way).
        const bool scaled = c.n_code_bytes > 0 && c.seed % 2 == 1;
        SCOPED_TRACE(scaled ? "token scales" : "no scales");
        p.token_scales = scaled ? dev.scales.d : nullptr;
        const size_t ws_bytes = kernels::code_maxsim_cuda_workspace_bytes(p);
        DevBuf<unsigned char> ws(ws_bytes);
        ASSERT_TRUE(kernels::code_maxsim_cuda(p, ws.d, ws_bytes, nullptr).ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> all = scores.get();
        const int64_t n_docs = int64_t(c.doc_lens.size());
        for (const int k : {1, 5, 64, 1024}) {
            SCOPED_TRACE("k " + std::to_string(k));
            CodeMaxSimParams pk = p;
            pk.scores = nullptr;
            const size_t tk_bytes = kernels::code_maxsim_topk_cuda_workspace_bytes(pk, k);
            DevBuf<unsigned char> tws(std::max<size_t>(tk_bytes, 1));
            DevBuf<int32_t> ids(size_t(std::max(1, c.n_queries)) * k);
            DevBuf<float> top(size_t(std::max(1, c.n_queries)) * k);
            const Status st = kernels::code_maxsim_topk_cuda(pk, k, ids.d, top.d, tws.d, tk_bytes, nullptr);
            if (c.n_queries > 0 && tk_bytes == 0) {
                EXPECT_EQ(st.code(), Status::Code::kNotSupported) << st.ToString();
                continue;
            }
            ASSERT_TRUE(st.ok()) << st.ToString();
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            const std::vector<int32_t> got_ids = ids.get();
            const std::vector<float> got_top = top.get();
            for (int qq = 0; qq < c.n_queries; ++qq) {
                const int64_t b = c.ragged ? d.cand_offsets[qq] : int64_t(qq) * n_docs;
                const int64_t e = c.ragged ? d.cand_offsets[qq + 1] : b + n_docs;
                std::vector<std::pair<float, int32_t>> ref;
                for (int64_t i = b; i < e; ++i)
                    ref.push_back({all[size_t(i)], c.ragged ? d.cand_docs[size_t(i)] : int32_t(i - b)});
                std::sort(ref.begin(), ref.end(), [](const auto& x, const auto& y) {
                    return x.first != y.first ? x.first > y.first : x.second < y.second;
                });
                for (int j = 0; j < k; ++j) {
                    const int32_t want_id = j < int(ref.size()) ? ref[size_t(j)].second : -1;
                    const float want_s = j < int(ref.size()) ? ref[size_t(j)].first : -INFINITY;
                    ASSERT_EQ(got_ids[size_t(qq) * k + j], want_id) << "query " << qq << " rank " << j;
                    ASSERT_EQ(got_top[size_t(qq) * k + j], want_s) << "query " << qq << " rank " << j;
                }
            }
        }
    }
    // Bad requests: k outside [1, 1024], null outputs, a short workspace.
    const CodeCase c = code_cases().front();
    const CodeData d(c);
    CodeMaxSimParams p = d.host_params(c, nullptr);
    DevBuf<int32_t> ids(64);
    DevBuf<float> top(64);
    DevBuf<unsigned char> ws(1 << 20);
    EXPECT_EQ(kernels::code_maxsim_topk_cuda(p, 0, ids.d, top.d, ws.d, 1 << 20, nullptr).code(),
              Status::Code::kInvalidArgument);
    EXPECT_EQ(kernels::code_maxsim_topk_cuda(p, 1025, ids.d, top.d, ws.d, 1 << 20, nullptr).code(),
              Status::Code::kInvalidArgument);
    EXPECT_EQ(kernels::code_maxsim_topk_cuda(p, 5, nullptr, top.d, ws.d, 1 << 20, nullptr).code(),
              Status::Code::kInvalidArgument);
    EXPECT_EQ(kernels::code_maxsim_topk_cuda(p, 5, ids.d, top.d, ws.d, 16, nullptr).code(),
              Status::Code::kInvalidArgument);
}

/// A compressed batch (scores, then the top-k with its merge rounds) captured into a CUDA graph
/// and replayed gives, bit for bit, what the same calls give directly: the launches take a
/// stream and never allocate or synchronise.
TEST(CodeMaxSimCuda, CapturesIntoACudaGraph) {
    SKIP_WITHOUT_GPU();
    int n_run = 0;
    for (const CodeCase& c : code_cases()) {
        if (c.n_queries == 0) continue;
        SCOPED_TRACE(describe(c));
        const CodeData d(c);
        const DevCase dev(d);
        const int64_t n = kernels::code_maxsim_num_scores(d.host_params(c, nullptr));
        const int k = 5;
        CodeMaxSimParams p0 = dev.params(c, d, nullptr);
        const size_t ws_bytes = kernels::code_maxsim_cuda_workspace_bytes(p0);
        const size_t tk_bytes = kernels::code_maxsim_topk_cuda_workspace_bytes(p0, k);
        if (tk_bytes == 0) continue;  // shapes without a top-k instantiation (TopKEqualsTopOfScores)
        struct Out {
            DevBuf<float> scores, top;
            DevBuf<int32_t> ids;
            DevBuf<unsigned char> ws, tws;
            Out(int64_t n, int nk, size_t w, size_t tw)
                : scores(size_t(std::max<int64_t>(n, 1))),
                  top(size_t(nk)),
                  ids(size_t(nk)),
                  ws(std::max<size_t>(w, 1)),
                  tws(tw) {
                EXPECT_EQ(cudaMemset(scores.d, 0, scores.n * sizeof(float)), cudaSuccess);
            }
        };
        const auto enqueue = [&](Out& o, cudaStream_t st) -> Status {
            CodeMaxSimParams p = dev.params(c, d, o.scores.d);
            TMS_RETURN_IF_ERROR(kernels::code_maxsim_cuda(p, o.ws.d, ws_bytes, st));
            p.scores = nullptr;
            return kernels::code_maxsim_topk_cuda(p, k, o.ids.d, o.top.d, o.tws.d, tk_bytes, st);
        };
        cudaStream_t st = nullptr;
        ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
        Out direct(n, c.n_queries * k, ws_bytes, tk_bytes), replay(n, c.n_queries * k, ws_bytes, tk_bytes);
        ASSERT_TRUE(enqueue(direct, st).ok());
        ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
        cudaGraph_t graph = nullptr;
        ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), cudaSuccess);
        const Status captured = enqueue(replay, st);
        ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
        ASSERT_TRUE(captured.ok()) << captured.ToString();
        cudaGraphExec_t exec = nullptr;
        ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
        for (int rep = 0; rep < 2; ++rep) {
            // Each replay rewrites these (0x7f bytes: neither a result nor the -1 / -inf padding).
            ASSERT_EQ(cudaMemsetAsync(replay.ids.d, 0x7f, size_t(c.n_queries) * k * sizeof(int32_t), st), cudaSuccess);
            ASSERT_EQ(cudaMemsetAsync(replay.top.d, 0x7f, size_t(c.n_queries) * k * sizeof(float), st), cudaSuccess);
            if (n > 0) ASSERT_EQ(cudaMemsetAsync(replay.scores.d, 0x7f, size_t(n) * sizeof(float), st), cudaSuccess);
            ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
            ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
            EXPECT_EQ(replay.scores.get(), direct.scores.get()) << "replay " << rep;
            EXPECT_EQ(replay.ids.get(), direct.ids.get()) << "replay " << rep;
            EXPECT_EQ(replay.top.get(), direct.top.get()) << "replay " << rep;
        }
        ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
        ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
        ASSERT_EQ(cudaStreamDestroy(st), cudaSuccess);
        ++n_run;
    }
    EXPECT_GT(n_run, 3);
}

TEST(CodeMaxSimCuda, TableThenScoreEqualsOneCall) {
    SKIP_WITHOUT_GPU();
    const CodeCase c{"pq16_split", 128, 16, 0, 64, 3, 32, {32, 9, 1}, lens(60, 1, 150, 21), true, {30, 30, 30}, 600};
    SCOPED_TRACE(describe(c));
    const CodeData d(c);
    const DevCase dev(d);
    DevBuf<float> s1(d.cand_docs.size()), s2(d.cand_docs.size());
    CodeMaxSimParams p = dev.params(c, d, s1.d);
    const size_t ws_bytes = kernels::code_maxsim_cuda_workspace_bytes(p);
    DevBuf<unsigned char> ws(ws_bytes);
    ASSERT_TRUE(kernels::code_maxsim_cuda(p, ws.d, ws_bytes, nullptr).ok());
    DevBuf<unsigned char> table(kernels::code_centroid_table_bytes(p));
    ASSERT_TRUE(kernels::code_centroid_table_cuda(p, table.d, nullptr).ok());
    p.scores = s2.d;
    p.centroid_scores = nullptr;  // not read by the table path
    ASSERT_TRUE(kernels::code_maxsim_table_cuda(p, table.d, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(s1.get(), s2.get());
}

/// The table writer and the scoring kernel are programmatic dependent launches (their CTAs may
/// start while the stream's previous kernel runs): queries and centroid scores written by that
/// kernel (two sets in turn, copied in late by a kernel that released its dependents at its
/// start) must give the scores of synchronised calls on the same inputs, bit for bit.
TEST(CodeMaxSimCuda, ReadsInputsThePreviousKernelWrites) {
    SKIP_WITHOUT_GPU();
    const CodeCase c1{"pdl_a", 128, 16, 0, 4096, 3, 32, {}, lens(3000, 1, 150, 41), false, {}, 41};
    CodeCase c2 = c1;
    c2.name = "pdl_b";
    c2.seed = 42;
    const CodeData d1(c1), d2(c2);
    ASSERT_EQ(d1.q.size(), d2.q.size());
    ASSERT_EQ(d1.cs.size(), d2.cs.size());
    const DevCase src1(d1), src2(d2), dst(d1);
    const int64_t n = kernels::code_maxsim_num_scores(d1.host_params(c1, nullptr));
    const size_t ws_bytes = kernels::code_maxsim_cuda_workspace_bytes(dst.params(c1, d1, nullptr));
    DevBuf<unsigned char> ws(ws_bytes);
    test::expect_reads_late_inputs(
        size_t(n), 4,
        [&](int r, cudaStream_t st) {
            const DevCase& src = r % 2 ? src2 : src1;
            test::late_copy<<<4, 256, 0, st>>>(
                reinterpret_cast<uint32_t*>(dst.q.d), reinterpret_cast<const uint32_t*>(src.q.d), int64_t(d1.q.size()),
                reinterpret_cast<uint32_t*>(dst.cs.d), reinterpret_cast<const uint32_t*>(src.cs.d),
                int64_t(d1.cs.size()), 100000);
        },
        [&](int, float* out, cudaStream_t st) {
            return kernels::code_maxsim_cuda(dst.params(c1, d1, out), ws.d, ws_bytes, st);
        });
}

/// CodeMaxSimParams::n_candidates only sizes the grid: a ragged call of many queries then runs more
/// slices a query (the tables of a few queries at a time, in L2), and every candidate's score is
/// the same bit for bit, through both kernels; a negative count is refused.
TEST(CodeMaxSimCuda, CandidateCountOnlySizesTheGrid) {
    SKIP_WITHOUT_GPU();
    const int nq = 64;
    const CodeCase c{"pq64_many_queries",        128, 64, 0, 64, nq, 32, lens(nq, 0, 32, 41), lens(300, 1, 6, 42), true,
                     std::vector<int>(nq, 4096), 602};
    const CodeData d(c);
    const DevCase dev(d);
    const size_t n = d.cand_docs.size();
    for (const bool wg : {true, false}) {
        SCOPED_TRACE(wg ? "warpgroup MMA allowed" : "mma.sync");
        DevBuf<float> s0(n), s1(n);
        CodeMaxSimParams p = dev.params(c, d, s0.d);
        p.allow_wgmma = wg;
        const size_t ws_bytes = kernels::code_maxsim_cuda_workspace_bytes(p);
        DevBuf<unsigned char> ws(ws_bytes);
        int64_t slices0 = 0, slices1 = 0;
        ASSERT_TRUE(kernels::code_maxsim_cuda_slices(p, &slices0).ok());
        ASSERT_EQ(cudaMemset(s0.d, 0x7f, n * sizeof(float)), cudaSuccess);
        ASSERT_TRUE(kernels::code_maxsim_cuda(p, ws.d, ws_bytes, nullptr).ok());
        p.n_candidates = int64_t(n);
        p.scores = s1.d;
        ASSERT_TRUE(kernels::code_maxsim_cuda_slices(p, &slices1).ok());
        EXPECT_GT(slices1, slices0);
        ASSERT_EQ(cudaMemset(s1.d, 0x7f, n * sizeof(float)), cudaSuccess);
        ASSERT_TRUE(kernels::code_maxsim_cuda(p, ws.d, ws_bytes, nullptr).ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> a = s0.get(), b = s1.get();
        EXPECT_EQ(a, b);
        // Every candidate written (0x7f7f7f7f: a finite float no score here reaches).
        const uint32_t pattern = 0x7f7f7f7fu;
        float unset;
        std::memcpy(&unset, &pattern, sizeof unset);
        int64_t unwritten = 0;
        for (const float v : b) unwritten += v == unset;
        EXPECT_EQ(unwritten, 0);
        p.n_candidates = -1;
        EXPECT_EQ(kernels::code_maxsim_cuda(p, ws.d, ws_bytes, nullptr).code(), Status::Code::kInvalidArgument);
    }
}

/// The table against its layout, written out here: slot g*4 + m*2 + h of a group holds row
/// m*16 + h*8 + g (fp16), rows at or past query_lens[q] are 0. K = 130 and 64 take the 16-byte
/// loads (partial and whole tiles), K = 131 the scalar ones; q_stride 40 gives two groups.
TEST(CodeMaxSimCuda, CentroidTableLayout) {
    SKIP_WITHOUT_GPU();
    for (const int K : {130, 131, 64}) {
        SCOPED_TRACE("K " + std::to_string(K));
        const int nq = 3, q_stride = 40, n_groups = 2;
        const std::vector<int32_t> qlens = {40, 5, 0};
        std::mt19937 rng{uint32_t(K)};
        std::uniform_real_distribution<float> u(-2.f, 2.f);
        std::vector<float> cs(size_t(nq) * q_stride * K);
        for (float& x : cs) x = u(rng);
        DevBuf<float> d_cs(cs);
        DevBuf<int32_t> d_lens(qlens);
        CodeMaxSimParams p;
        p.n_queries = nq;
        p.q_stride = q_stride;
        p.n_centroids = K;
        p.query_lens = d_lens.d;
        p.centroid_scores = d_cs.d;
        const size_t bytes = kernels::code_centroid_table_bytes(p);
        ASSERT_EQ(bytes, size_t(nq) * n_groups * K * 32 * 2);
        DevBuf<uint16_t> table(bytes / 2 + 8);
        ASSERT_TRUE(kernels::code_centroid_table_cuda(p, table.d, nullptr).ok());
        EXPECT_EQ(kernels::code_centroid_table_cuda(p, table.d + 1, nullptr).code(), Status::Code::kInvalidArgument);
        std::vector<uint16_t> got = table.get();
        int bad = 0;
        for (int q = 0; q < nq; ++q)
            for (int grp = 0; grp < n_groups; ++grp)
                for (int k = 0; k < K; ++k)
                    for (int slot = 0; slot < 32; ++slot) {
                        const int g = slot / 4, m = (slot / 2) % 2, h = slot % 2;
                        const int row = grp * 32 + m * 16 + h * 8 + g;
                        const float want = row < qlens[q] ? cs[(size_t(q) * q_stride + row) * K + k] : 0.f;
                        const uint16_t bits = __half_as_ushort(__float2half_rn(want));
                        const size_t at = ((size_t(q) * n_groups + grp) * K + k) * 32 + slot;
                        if (got[at] != bits && ++bad <= 5) {
                            ADD_FAILURE() << "q " << q << " group " << grp << " k " << k << " slot " << slot;
                        }
                    }
        EXPECT_EQ(bad, 0);
    }
}

TEST(CodeMaxSimCuda, RejectsUnsupportedShapes) {
    SKIP_WITHOUT_GPU();
    DevBuf<float> dummy(size_t(1) << 20);
    DevBuf<int64_t> offs(std::vector<int64_t>{0, 1});
    CodeMaxSimParams p;
    p.queries = dummy.d;
    p.n_queries = 1;
    p.q_stride = 32;
    p.n_centroids = 4;
    p.token_centroids = reinterpret_cast<const uint32_t*>(dummy.d);
    p.codes = reinterpret_cast<const uint8_t*>(dummy.d);
    p.codebook = dummy.d;
    p.doc_offsets = offs.d;
    p.n_docs = 1;
    p.scores = dummy.d;
    p.dim = 96;
    p.n_code_bytes = 8;  // dsub 12
    EXPECT_EQ(kernels::code_maxsim_table_cuda(p, dummy.d, nullptr).code(), Status::Code::kNotSupported);
    p.dim = 128;
    p.n_code_bytes = 3;  // does not divide dim
    EXPECT_EQ(kernels::code_maxsim_table_cuda(p, dummy.d, nullptr).code(), Status::Code::kNotSupported);
    p.dim = 1024;
    p.n_code_bytes = 128;  // fp16 codebook of 512 KB does not fit in shared memory
    EXPECT_EQ(kernels::code_maxsim_table_cuda(p, dummy.d, nullptr).code(), Status::Code::kNotSupported);
    p.dim = 100;
    p.n_code_bytes = 50;  // dim not a multiple of 32
    EXPECT_EQ(kernels::code_maxsim_table_cuda(p, dummy.d, nullptr).code(), Status::Code::kNotSupported);
    EXPECT_EQ(kernels::code_codebook_image_bytes(p), size_t(0));
    EXPECT_EQ(kernels::code_codebook_image_cuda(p, dummy.d, nullptr).code(), Status::Code::kNotSupported);
    // A codebook image: 16-byte aligned, and it stands in for a null codebook.
    p.dim = 128;
    p.n_code_bytes = 16;
    EXPECT_EQ(kernels::code_codebook_image_bytes(p), size_t(128 * 512));
    EXPECT_EQ(kernels::code_codebook_image_cuda(p, reinterpret_cast<char*>(dummy.d) + 4, nullptr).code(),
              Status::Code::kInvalidArgument);
    p.codebook_image = reinterpret_cast<char*>(dummy.d) + 4;
    EXPECT_EQ(kernels::code_maxsim_table_cuda(p, dummy.d, nullptr).code(), Status::Code::kInvalidArgument);
    p.codebook = nullptr;
    p.codebook_image = nullptr;
    EXPECT_EQ(kernels::code_maxsim_table_cuda(p, dummy.d, nullptr).code(), Status::Code::kInvalidArgument);
    p.codebook = dummy.d;
    // The up-front check agrees, and accepts every shape of the case table.
    EXPECT_EQ(kernels::code_maxsim_cuda_supported(1024, 128).code(), Status::Code::kNotSupported);
    EXPECT_EQ(kernels::code_maxsim_cuda_supported(96, 8).code(), Status::Code::kNotSupported);
    EXPECT_EQ(kernels::code_maxsim_cuda_supported(100, 50).code(), Status::Code::kNotSupported);
    EXPECT_EQ(kernels::code_maxsim_cuda_supported(128, 3).code(), Status::Code::kNotSupported);
    for (const CodeCase& c : code_cases()) {
        EXPECT_TRUE(kernels::code_maxsim_cuda_supported(c.dim, c.n_code_bytes).ok()) << describe(c);
    }
}

// GpuCodeScorer against the CPU path; after NormalizeDecoded with the decoded tokens' inverse
// norms (not for centroid-only scores).
TEST(GpuCodeScorerCuda, MatchesCpuPath) {
    SKIP_WITHOUT_GPU();
    for (const bool normalized : {false, true})
        for (const bool centroids_only : {false, true}) {
            const CodeCase c{"scorer", 128,         32, 2, 64, 3, 32, {32, 11, 0}, lens(80, 0, 150, 31),
                             true,     {50, 0, 40}, 700};
            SCOPED_TRACE(describe(c) + (centroids_only ? " centroids only" : "") + (normalized ? " normalized" : ""));
            const CodeData d(c);
            std::unique_ptr<engine::GpuCodeScorer> scorer;
            const Status cs =
                engine::GpuCodeScorer::Create(test::TestGpuContext(), d.tc.data(), d.codes.data(), int64_t(d.tc.size()),
                                              c.n_code_bytes, d.book.data(), d.cent.data(), c.n_centroids, c.dim,
                                              d.doc_offsets.data(), int64_t(c.doc_lens.size()), &scorer);
            ASSERT_TRUE(cs.ok()) << cs.ToString();
            if (normalized) {
                const Status ns = scorer->NormalizeDecoded(d.cent.data());
                ASSERT_TRUE(ns.ok()) << ns.ToString();
            }
            for (const bool ragged : {true, false}) {
                std::vector<float> got;
                // Dense calls let the scorer compute the centroid scores itself (cuBLAS).
                const Status st =
                    scorer->Score(d.q.data(), c.n_queries, c.q_stride, d.query_lens.data(),
                                  ragged ? d.cs.data() : nullptr, ragged ? d.cand_offsets.data() : nullptr,
                                  ragged ? d.cand_docs.data() : nullptr, centroids_only, &got);
                ASSERT_TRUE(st.ok()) << st.ToString();
                CodeMaxSimParams p = d.host_params(c, nullptr);
                if (!ragged) {
                    p.cand_offsets = nullptr;
                    p.cand_docs = nullptr;
                }
                if (centroids_only) {
                    p.n_code_bytes = 0;
                    p.codes = nullptr;
                    p.codebook = nullptr;
                }
                p.token_scales = normalized ? d.scales.data() : nullptr;
                std::vector<float> want(size_t(kernels::code_maxsim_num_scores(p)));
                p.scores = want.data();
                ASSERT_TRUE(kernels::code_maxsim_cpu(p).ok());
                ASSERT_EQ(got.size(), want.size());
                for (size_t i = 0; i < got.size(); ++i)
                    EXPECT_NEAR(got[i], want[i], 2e-2 + 1e-3 * std::fabs(want[i])) << i;
            }
        }
}

/// <a, b> over dim floats, accumulated in fp64 in index order: the probe tests' reference scores.
double dot64(const float* a, const float* b, int dim) {
    double s = 0;
    for (int j = 0; j < dim; ++j) s += double(a[j]) * b[j];
    return s;
}

/// A GpuCodeScorer for probing only: the centroids, and one document of one token, no codes.
Status probe_only_scorer(const std::vector<float>& cent, int K, int dim, std::unique_ptr<engine::GpuCodeScorer>* out) {
    const std::vector<uint32_t> tc(1, 0);
    const std::vector<int64_t> off = {0, 1};
    return engine::GpuCodeScorer::Create(test::TestGpuContext(), tc.data(), nullptr, 1, 0, nullptr, cent.data(), K, dim,
                                         off.data(), 1, out);
}

// Probing on the device against fp64 scores: every pick is distinct, in score order up to fp32
// rounding, and duplicated centroids (exact ties) come out lower id first. K = 300: every score
// row 16-byte aligned (read 4 elements a load); K = 303: three rows in four are not (read one).
class GpuCodeScorerProbe : public ::testing::TestWithParam<int> {};

TEST_P(GpuCodeScorerProbe, MatchesCpuOrder) {
    SKIP_WITHOUT_GPU();
    const int dim = 64, K = GetParam(), nq = 5, qt = 7, nprobe = 9;
    std::mt19937 rng(5);
    std::normal_distribution<float> n01;
    std::vector<float> cent(size_t(K) * dim), q(size_t(nq) * qt * dim);
    for (auto& v : cent) v = n01(rng);
    for (auto& v : q) v = n01(rng);
    // Centroid 200 + i duplicates centroid i for i < 20: exact ties.
    for (int i = 0; i < 20; ++i) std::copy_n(cent.begin() + size_t(i) * dim, dim, cent.begin() + size_t(200 + i) * dim);
    // Make some duplicated pairs the best of a row: row r's query is centroid r (scaled).
    for (int r = 0; r < 10; ++r)
        for (int j = 0; j < dim; ++j) q[size_t(r) * dim + j] = 3.0f * cent[size_t(r) * dim + j];
    std::unique_ptr<engine::GpuCodeScorer> scorer;
    ASSERT_TRUE(probe_only_scorer(cent, K, dim, &scorer).ok());
    std::vector<int32_t> probe;
    ASSERT_TRUE(scorer->Probe(q.data(), nq, qt, nprobe, &probe).ok());
    ASSERT_EQ(probe.size(), size_t(nq) * qt * nprobe);
    for (int r = 0; r < nq * qt; ++r) {
        std::vector<std::pair<double, int>> ref(K);
        for (int k = 0; k < K; ++k) ref[k] = {-dot64(&q[size_t(r) * dim], &cent[size_t(k) * dim], dim), k};
        std::sort(ref.begin(), ref.end());
        std::set<int> seen;
        for (int p = 0; p < nprobe; ++p) {
            const int c = probe[size_t(r) * nprobe + p];
            ASSERT_GE(c, 0);
            ASSERT_LT(c, K);
            EXPECT_TRUE(seen.insert(c).second) << "row " << r << " picks " << c << " twice";
            const double sc = dot64(&q[size_t(r) * dim], &cent[size_t(c) * dim], dim);
            EXPECT_NEAR(sc, -ref[p].first, 1e-3 * (1 + std::fabs(sc))) << "row " << r << " pick " << p;
            if (c >= 200 && c < 220)
                EXPECT_TRUE(seen.count(c - 200)) << "row " << r << ": duplicate " << c << " before " << c - 200;
        }
        if (r < 10) {
            EXPECT_EQ(probe[size_t(r) * nprobe], r) << "exact tie: the lower id first";
            EXPECT_EQ(probe[size_t(r) * nprobe + 1], r + 200);
        }
    }
    EXPECT_FALSE(scorer->Probe(q.data(), nq, qt, 65, &probe).ok());
}

INSTANTIATE_TEST_SUITE_P(GpuCodeScorerCuda, GpuCodeScorerProbe, ::testing::Values(300, 303));

/// Probing against many centroids (65,536, dim 128: the centroid-score GEMM of a large index, 8,192
/// query rows) ranks them to fp32 accuracy:
/// - 16 rows whose two best centroids differ by 2^-16 in one coordinate (1 against 1 + 2^-16,
///   the higher id the better by 4.6e-5 of ~6): the better one first. A GEMM on TF32-rounded
///   inputs (10-bit mantissas) sees a tie there and puts the lower id first.
/// - 64 more rows: every pick's score (fp64) equals the fp64 reference's score of its rank.
/// Prints the call's time.
TEST(GpuCodeScorerCuda, ProbeAtManyCentroids) {
    SKIP_WITHOUT_GPU();
    const int dim = 128, K = 65536, nq = 256, qt = 32, nprobe = 8, n_pairs = 16;
    std::mt19937 rng(17);
    std::normal_distribution<float> n01;
    const float sd = 1.f / std::sqrt(float(dim));
    std::vector<float> cent(size_t(K) * dim), q(size_t(nq) * qt * dim);
    for (auto& v : cent) v = n01(rng) * sd;
    for (auto& v : q) v = n01(rng) * sd;
    for (int i = 0; i < n_pairs; ++i) {  // centroids 1000 + 2i and 1001 + 2i; row i's query is 3x the first
        float* a = cent.data() + size_t(1000 + 2 * i) * dim;
        float* b = a + dim;
        a[0] = 1.f;
        std::copy_n(a, dim, b);
        b[0] = 1.f + std::ldexp(1.f, -16);
        for (int j = 0; j < dim; ++j) q[size_t(i) * dim + j] = 3.f * a[j];
    }
    std::unique_ptr<engine::GpuCodeScorer> scorer;
    ASSERT_TRUE(probe_only_scorer(cent, K, dim, &scorer).ok());
    std::vector<int32_t> probe;
    ASSERT_TRUE(scorer->Probe(q.data(), nq, qt, nprobe, &probe).ok());  // warm-up
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(scorer->Probe(q.data(), nq, qt, nprobe, &probe).ok());
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("Probe: %d rows x %d centroids, dim %d: %.3f ms\n", nq * qt, K, dim, ms);
    ASSERT_EQ(probe.size(), size_t(nq) * qt * nprobe);
    auto dot = [&](int r, int k) { return dot64(&q[size_t(r) * dim], &cent[size_t(k) * dim], dim); };
    for (int i = 0; i < n_pairs; ++i) {
        EXPECT_EQ(probe[size_t(i) * nprobe], 1001 + 2 * i) << "row " << i;
        EXPECT_EQ(probe[size_t(i) * nprobe + 1], 1000 + 2 * i) << "row " << i;
    }
    for (int r = n_pairs; r < nq * qt; r += (nq * qt) / 64) {
        std::vector<double> ref(K);
        for (int k = 0; k < K; ++k) ref[k] = dot(r, k);
        std::partial_sort(ref.begin(), ref.begin() + nprobe, ref.end(), std::greater<double>());
        for (int p = 0; p < nprobe; ++p) {
            const int c = probe[size_t(r) * nprobe + p];
            ASSERT_GE(c, 0);
            ASSERT_LT(c, K);
            EXPECT_NEAR(dot(r, c), ref[p], 2e-5 * (1 + std::fabs(ref[p]))) << "row " << r << " pick " << p;
        }
    }
}

/// A random shard for the GpuCodeScorer tests: n_docs documents of 1..max_len tokens with random
/// centroid ids in [0, K), and its IVF lists (the documents of each centroid, ascending).
struct IvfShard {
    std::vector<int64_t> doc_off{0};
    std::vector<uint32_t> tc;
    std::vector<std::vector<int32_t>> lists;
    std::vector<int64_t> ivf_off{0};
    std::vector<int32_t> ivf_docs;
};

IvfShard random_ivf_shard(std::mt19937& rng, int n_docs, int max_len, int K) {
    IvfShard s;
    std::uniform_int_distribution<int> len(1, max_len), cid(0, K - 1);
    for (int d = 0; d < n_docs; ++d) {
        const int l = len(rng);
        for (int t = 0; t < l; ++t) s.tc.push_back(uint32_t(cid(rng)));
        s.doc_off.push_back(int64_t(s.tc.size()));
    }
    s.lists.resize(size_t(K));
    for (int d = 0; d < n_docs; ++d)
        for (int64_t t = s.doc_off[d]; t < s.doc_off[d + 1]; ++t)
            if (s.lists[s.tc[t]].empty() || s.lists[s.tc[t]].back() != d) s.lists[s.tc[t]].push_back(d);
    for (const auto& l : s.lists) {
        s.ivf_docs.insert(s.ivf_docs.end(), l.begin(), l.end());
        s.ivf_off.push_back(int64_t(s.ivf_docs.size()));
    }
    return s;
}

// Candidate generation on the device against the host: the union of the probed IVF lists (no
// pruning) equals the host union built from fp64 probes, and pruned lists keep the best by the
// CPU's centroid-only score (up to the fp16 table), in score order.
TEST(GpuCodeScorerCuda, CandidatesMatchHostUnionAndPruning) {
    SKIP_WITHOUT_GPU();
    const int dim = 64, K = 96, n_docs = 3000, nq = 6, qt = 9, nprobe = 3;
    std::mt19937 rng(17);
    std::normal_distribution<float> n01;
    std::vector<float> cent(size_t(K) * dim), q(size_t(nq) * qt * dim);
    for (auto& v : cent) v = n01(rng);
    for (auto& v : q) v = n01(rng);
    const IvfShard shard = random_ivf_shard(rng, n_docs, 12, K);
    const std::vector<int64_t>& doc_off = shard.doc_off;
    const std::vector<uint32_t>& tc = shard.tc;
    const std::vector<std::vector<int32_t>>& lists = shard.lists;
    const std::vector<int64_t>& ivf_off = shard.ivf_off;
    const std::vector<int32_t>& ivf_docs = shard.ivf_docs;
    const std::vector<int32_t> qlens = {9, 4, 0, 9, 1, 7};
    std::unique_ptr<engine::GpuCodeScorer> scorer;
    ASSERT_TRUE(engine::GpuCodeScorer::Create(test::TestGpuContext(), tc.data(), nullptr, int64_t(tc.size()), 0,
                                              nullptr, cent.data(), K, dim, doc_off.data(), n_docs, &scorer)
                    .ok());
    std::vector<int64_t> off;
    std::vector<int32_t> docs;
    EXPECT_FALSE(scorer->Candidates(q.data(), nq, qt, qlens.data(), nprobe, 0, Pruning::kInteraction, &off, &docs).ok())
        << "needs SetIvf";
    ASSERT_TRUE(scorer->SetIvf(ivf_off.data(), ivf_docs.data()).ok());
    // Host reference: fp64 probes, union in id order; fp32 centroid scores for pruning.
    std::vector<float> cs(size_t(nq) * qt * K);
    std::vector<std::vector<int32_t>> uni(nq);
    for (int qi = 0; qi < nq; ++qi) {
        std::set<int32_t> u;
        for (int i = 0; i < qt; ++i) {
            std::vector<std::pair<double, int>> sc(K);
            for (int k = 0; k < K; ++k) {
                const double v = dot64(&q[(size_t(qi) * qt + i) * dim], &cent[size_t(k) * dim], dim);
                sc[k] = {-v, k};
                cs[(size_t(qi) * qt + i) * K + k] = float(v);
            }
            std::sort(sc.begin(), sc.end());
            if (i >= qlens[qi]) continue;
            for (int p = 0; p < nprobe; ++p) u.insert(lists[sc[p].second].begin(), lists[sc[p].second].end());
        }
        uni[qi].assign(u.begin(), u.end());
    }
    ASSERT_TRUE(scorer->Candidates(q.data(), nq, qt, qlens.data(), nprobe, 0, Pruning::kInteraction, &off, &docs).ok());
    ASSERT_EQ(off.size(), size_t(nq + 1));
    for (int qi = 0; qi < nq; ++qi) {
        const std::vector<int32_t> got(docs.begin() + off[qi], docs.begin() + off[qi + 1]);
        EXPECT_EQ(got, uni[qi]) << "query " << qi;
    }
    EXPECT_EQ(off[3] - off[2], 0) << "an empty query has no candidates";
    // Pruning to 40: the CPU's centroid-only scores of the union, best first.
    const int keep = 40;
    ASSERT_TRUE(
        scorer->Candidates(q.data(), nq, qt, qlens.data(), nprobe, keep, Pruning::kInteraction, &off, &docs).ok());
    for (int qi = 0; qi < nq; ++qi) {
        auto score = [&](int32_t d) {
            double s = 0;
            for (int i = 0; i < qlens[qi]; ++i) {
                float m = -INFINITY;
                for (int64_t t = doc_off[d]; t < doc_off[d + 1]; ++t)
                    m = std::max(m, cs[(size_t(qi) * qt + i) * K + tc[t]]);
                s += m;
            }
            return s;
        };
        std::vector<std::pair<double, int32_t>> ref;
        for (int32_t d : uni[qi]) ref.push_back({-score(d), d});
        std::sort(ref.begin(), ref.end());
        const size_t n = std::min<size_t>(ref.size(), keep);
        ASSERT_EQ(size_t(off[qi + 1] - off[qi]), n) << "query " << qi;
        const double kth = n ? -ref[n - 1].first : 0;
        double prev = INFINITY;
        for (int64_t e = off[qi]; e < off[qi + 1]; ++e) {
            const double s = score(docs[e]);
            EXPECT_GE(s, kth - 0.05 * (1 + std::fabs(kth))) << "query " << qi << " keeps a doc below the cut";
            EXPECT_LE(s, prev + 0.05 * (1 + std::fabs(s))) << "query " << qi << ": not in score order";
            prev = s;
        }
    }
    // Probe-score pruning: each query keeps min(union, 40) documents of its union, each once.
    ASSERT_TRUE(scorer->Candidates(q.data(), nq, qt, qlens.data(), nprobe, keep, Pruning::kProbe, &off, &docs).ok());
    for (int qi = 0; qi < nq; ++qi) {
        std::vector<int32_t> got(docs.begin() + off[qi], docs.begin() + off[qi + 1]);
        EXPECT_EQ(got.size(), std::min<size_t>(uni[qi].size(), keep)) << "query " << qi;
        std::sort(got.begin(), got.end());
        EXPECT_TRUE(std::adjacent_find(got.begin(), got.end()) == got.end()) << "query " << qi;
        EXPECT_TRUE(std::includes(uni[qi].begin(), uni[qi].end(), got.begin(), got.end())) << "query " << qi;
    }
    // fp16 and bf16 queries, converted on the device, against the same values given as fp32:
    // the same lists, pruned or not.
    for (const DType t : {DType::kF16, DType::kBF16}) {
        SCOPED_TRACE(t == DType::kF16 ? "fp16 queries" : "bf16 queries");
        std::vector<float> qr = q;
        std::vector<uint8_t> raw;
        testing::encode(&qr, t, &raw);  // qr: the values rounded to t; raw: their bytes
        for (const int nc : {0, keep}) {
            std::vector<int64_t> off32, off16;
            std::vector<int32_t> docs32, docs16;
            ASSERT_TRUE(
                scorer->Candidates(qr.data(), nq, qt, qlens.data(), nprobe, nc, Pruning::kInteraction, &off32, &docs32)
                    .ok());
            ASSERT_TRUE(scorer
                            ->Candidates(raw.data(), t, nq, qt, qlens.data(), nprobe, nc, Pruning::kInteraction, &off16,
                                         &docs16)
                            .ok());
            EXPECT_EQ(off16, off32) << "ncandidates " << nc;
            EXPECT_EQ(docs16, docs32) << "ncandidates " << nc;
        }
    }
}

// ScoreCandidates (the device state of the last Candidates call) against Score with the same
// queries and the candidate lists on the host: bit-identical, pruned or not; ScoreCandidatesTop
// against the host's top-k order over those scores; both refused with no Candidates call
// before them, or after a Score or Probe call.
TEST(GpuCodeScorerCuda, ScoreCandidatesEqualsScore) {
    SKIP_WITHOUT_GPU();
    const int dim = 64, nb = 16, K = 80, n_docs = 2000, nq = 5, qt = 11, nprobe = 4;
    std::mt19937 rng(23);
    std::normal_distribution<float> n01;
    std::uniform_int_distribution<int> byte(0, 255);
    std::vector<float> cent(size_t(K) * dim), q(size_t(nq) * qt * dim), book(size_t(nb) * 256 * (dim / nb));
    for (auto& v : cent) v = n01(rng);
    for (auto& v : q) v = n01(rng);
    for (auto& v : book) v = 0.1f * n01(rng);
    const IvfShard sh = random_ivf_shard(rng, n_docs, 40, K);
    std::vector<uint8_t> codes(sh.tc.size() * nb);
    for (auto& c : codes) c = uint8_t(byte(rng));
    const std::vector<int32_t> qlens = {11, 3, 0, 7, 11};
    std::unique_ptr<engine::GpuCodeScorer> scorer;
    ASSERT_TRUE(engine::GpuCodeScorer::Create(test::TestGpuContext(), sh.tc.data(), codes.data(), int64_t(sh.tc.size()),
                                              nb, book.data(), cent.data(), K, dim, sh.doc_off.data(), n_docs, &scorer)
                    .ok());
    ASSERT_TRUE(scorer->SetIvf(sh.ivf_off.data(), sh.ivf_docs.data()).ok());
    std::vector<float> got, want;
    EXPECT_EQ(scorer->ScoreCandidates(&got).code(), Status::Code::kInvalidArgument) << "no Candidates call yet";
    for (const auto& [keep, pruning] :
         {std::pair{0, Pruning::kProbe}, std::pair{50, Pruning::kInteraction}, std::pair{50, Pruning::kProbe}}) {
        SCOPED_TRACE("ncandidates " + std::to_string(keep) + (pruning == Pruning::kProbe ? " probe" : " interaction"));
        std::vector<int64_t> off;
        std::vector<int32_t> docs;
        ASSERT_TRUE(scorer->Candidates(q.data(), nq, qt, qlens.data(), nprobe, keep, pruning, &off, &docs).ok());
        ASSERT_GT(docs.size(), 0u);
        if (keep) EXPECT_LE(off[1] - off[0], keep);
        ASSERT_TRUE(scorer->ScoreCandidates(&got).ok());
        ASSERT_TRUE(scorer->ScoreCandidates(&got).ok()) << "a second call scores the same lists";
        // The best `top` of each list on the device against the host's order (score descending,
        // lower id first) over the same scores.
        for (const int top : {1, 7, 100000}) {
            std::vector<int64_t> toff;
            std::vector<int32_t> tdocs;
            std::vector<float> tscores;
            ASSERT_TRUE(scorer->ScoreCandidatesTop(top, &toff, &tdocs, &tscores).ok());
            ASSERT_EQ(toff.size(), off.size());
            for (int qi = 0; qi < nq; ++qi) {
                std::vector<std::pair<float, int32_t>> ref;
                for (int64_t i = off[qi]; i < off[qi + 1]; ++i) ref.push_back({got[size_t(i)], docs[size_t(i)]});
                std::sort(ref.begin(), ref.end(), [](const auto& a, const auto& b) {
                    return a.first != b.first ? a.first > b.first : a.second < b.second;
                });
                ref.resize(std::min<size_t>(ref.size(), size_t(top)));
                ASSERT_EQ(size_t(toff[qi + 1] - toff[qi]), ref.size()) << "top " << top << " query " << qi;
                for (size_t j = 0; j < ref.size(); ++j) {
                    EXPECT_EQ(tdocs[size_t(toff[qi]) + j], ref[j].second)
                        << "top " << top << " query " << qi << " rank " << j;
                    EXPECT_EQ(tscores[size_t(toff[qi]) + j], ref[j].first)
                        << "top " << top << " query " << qi << " rank " << j;
                }
            }
        }
        EXPECT_EQ(scorer->ScoreCandidatesTop(0, &off, &docs, &got).code(), Status::Code::kInvalidArgument);
        ASSERT_TRUE(scorer->ScoreCandidates(&got).ok());
        ASSERT_TRUE(scorer->Score(q.data(), nq, qt, qlens.data(), nullptr, off.data(), docs.data(), false, &want).ok());
        ASSERT_EQ(got.size(), docs.size());
        EXPECT_EQ(got, want);
        EXPECT_EQ(scorer->ScoreCandidates(&got).code(), Status::Code::kInvalidArgument) << "Score ran in between";
        std::vector<int32_t> probe;
        ASSERT_TRUE(scorer->Candidates(q.data(), nq, qt, qlens.data(), nprobe, keep, pruning, &off, &docs).ok());
        ASSERT_TRUE(scorer->Probe(q.data(), nq, qt, nprobe, &probe).ok());
        EXPECT_EQ(scorer->ScoreCandidates(&got).code(), Status::Code::kInvalidArgument) << "Probe ran in between";
        // Lists left on the device only (no docs download): the same offsets and the same best.
        std::vector<int64_t> off_dev, t1off, t2off;
        std::vector<int32_t> t1d, t2d;
        std::vector<float> t1s, t2s;
        ASSERT_TRUE(scorer->Candidates(q.data(), nq, qt, qlens.data(), nprobe, keep, pruning, &off_dev, nullptr).ok());
        EXPECT_EQ(off_dev, off);
        ASSERT_TRUE(scorer->ScoreCandidatesTop(7, &t1off, &t1d, &t1s).ok());
        ASSERT_TRUE(scorer->Candidates(q.data(), nq, qt, qlens.data(), nprobe, keep, pruning, &off, &docs).ok());
        ASSERT_TRUE(scorer->ScoreCandidatesTop(7, &t2off, &t2d, &t2s).ok());
        EXPECT_EQ(t1off, t2off);
        EXPECT_EQ(t1d, t2d);
        EXPECT_EQ(t1s, t2s);
    }
    // No queries: nothing to score.
    std::vector<int64_t> off;
    std::vector<int32_t> docs;
    ASSERT_TRUE(scorer->Candidates(q.data(), 0, qt, nullptr, nprobe, 0, Pruning::kProbe, &off, &docs).ok());
    ASSERT_TRUE(scorer->ScoreCandidates(&got).ok());
    EXPECT_TRUE(got.empty());
}

/// Benchmark driver (not a test): --gtest_also_run_disabled_tests --gtest_filter='*Bench*';
/// TMS_CODE_BENCH_FILTER selects cases, TMS_CODE_BENCH_JSON names the output file.
TEST(CodeMaxSimCudaBench, DISABLED_Run) {
    SKIP_WITHOUT_GPU();
    const char* filter = std::getenv("TMS_CODE_BENCH_FILTER");
    std::string rows;
    const Status st = bench::RunCodeKernelBench(filter ? filter : "", &rows);
    ASSERT_TRUE(st.ok()) << st.ToString();
    const std::string json = "{\"cases\":[\n" + rows + "\n]}\n";
    const char* path = std::getenv("TMS_CODE_BENCH_JSON");
    if (path) {
        FILE* f = std::fopen(path, "w");
        ASSERT_NE(f, nullptr);
        std::fputs(json.c_str(), f);
        std::fclose(f);
    } else {
        std::fputs(json.c_str(), stdout);
    }
}

}  // namespace
}  // namespace tms

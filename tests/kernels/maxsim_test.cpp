// Copyright TileMaxSim authors. MaxSim / code MaxSim / top-k: ref vs hand-computed cases,
// cpu vs ref on the shared case table (tests/kernels/maxsim_cases.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "kernels/maxsim.h"
#include "tests/kernels/maxsim_cases.h"

namespace tms {
namespace {

using kernels::MaxSimParams;

// q: 2 tokens in 2-d padded to dim 2; docs: hand-picked so every max is obvious.
TEST(MaxSimRef, HandComputed) {
    const float q[] = {1, 0, 0, 1};                 // q0 = e0, q1 = e1
    const float d[] = {0.5f,  0.5f,  1, -1, -2, 3,  // doc 0: 3 tokens
                       0.25f, 0.125f};              // doc 1: 1 token
    const int64_t off[] = {0, 3, 4, 4};             // doc 2 is empty
    MaxSimParams p;
    p.queries = q;
    p.n_queries = 1;
    p.q_stride = 2;
    p.dim = 2;
    p.doc_tokens = d;
    p.d_dtype = DType::kF32;
    p.doc_offsets = off;
    p.n_docs = 3;
    double s[3];
    ASSERT_TRUE(kernels::maxsim_ref(p, s).ok());
    EXPECT_DOUBLE_EQ(s[0], 1.0 + 3.0);  // max(0.5,1,-2) + max(0.5,-1,3)
    EXPECT_DOUBLE_EQ(s[1], 0.25 + 0.125);
    EXPECT_DOUBLE_EQ(s[2], 0.0);  // empty document scores 0
    // Query lengths: only q0 counts.
    const int32_t lens[] = {1};
    p.query_lens = lens;
    ASSERT_TRUE(kernels::maxsim_ref(p, s).ok());
    EXPECT_DOUBLE_EQ(s[0], 1.0);
    // Ragged candidates with a repeat.
    const int64_t co[] = {0, 3};
    const int32_t cd[] = {1, 0, 1};
    p.cand_offsets = co;
    p.cand_docs = cd;
    p.query_lens = nullptr;
    ASSERT_TRUE(kernels::maxsim_ref(p, s).ok());
    EXPECT_DOUBLE_EQ(s[0], 0.375);
    EXPECT_DOUBLE_EQ(s[1], 4.0);
    EXPECT_DOUBLE_EQ(s[2], 0.375);
}

TEST(MaxSimRef, RejectsBadCandidates) {
    const float q[] = {1, 0};
    const float d[] = {1, 0};
    const int64_t off[] = {0, 1};
    const int64_t co[] = {0, 1};
    const int32_t cd[] = {5};
    MaxSimParams p;
    p.queries = q;
    p.n_queries = 1;
    p.q_stride = 1;
    p.dim = 2;
    p.doc_tokens = d;
    p.d_dtype = DType::kF32;
    p.doc_offsets = off;
    p.n_docs = 1;
    p.cand_offsets = co;
    p.cand_docs = cd;
    double s[1];
    float f[1];
    EXPECT_EQ(kernels::maxsim_ref(p, s).code(), Status::Code::kInvalidArgument);
    p.scores = f;
    EXPECT_EQ(kernels::maxsim_cpu(p).code(), Status::Code::kInvalidArgument);
}

TEST(MaxSimCpu, UnsupportedDim) {
    MaxSimParams p;
    p.dim = 5000;
    p.n_queries = 0;
    EXPECT_EQ(kernels::maxsim_cpu(p).code(), Status::Code::kNotSupported);
}

TEST(MaxSimCpu, MatchesRefOnCaseTable) {
    for (const auto& c : testing::maxsim_cases()) {
        SCOPED_TRACE("case " + c.name + " seed " + std::to_string(c.seed) + " dim " + std::to_string(c.dim));
        const auto d = testing::make_data(c);
        const int64_t n = c.ragged ? d.cand_offsets.back() : int64_t(c.n_queries) * int64_t(c.doc_lens.size());
        std::vector<float> got(n + 1, NAN);
        std::vector<double> ref(n + 1);
        ASSERT_TRUE(kernels::maxsim_ref(d.params(c, nullptr), ref.data()).ok());
        ASSERT_TRUE(kernels::maxsim_cpu(d.params(c, got.data())).ok());
        const auto naive = testing::naive_f32(c, d);
        ASSERT_EQ(static_cast<int64_t>(naive.size()), n);
        for (int64_t i = 0; i < n; ++i) {
            const double err = std::fabs(got[i] - ref[i]);
            ASSERT_LE(err, testing::allowed_error(std::fabs(naive[i] - ref[i]), ref[i])) << "score " << i;
        }
        EXPECT_TRUE(std::isnan(got[n])) << "wrote past the end";
        if (c.duplicate_docs) {
            for (size_t doc = 1; doc < c.doc_lens.size(); doc += 2) EXPECT_EQ(got[doc], got[doc - 1]);
        }
    }
}

// Top-k against the reference, tie-aware: ids unique, scores gathered by id equal.
TEST(TopKCpu, MatchesRefWithTiesAndShortSegments) {
    std::mt19937 rng(77);
    std::uniform_int_distribution<int> small(0, 5);  // many exact ties
    for (int k : {1, 3, 10, 50}) {
        std::vector<int64_t> off = {0, 0, 1, 8, 40, 140};  // segment sizes 0, 1, 7, 32, 100
        std::vector<float> s(off.back());
        std::vector<int32_t> ids(off.back());
        for (size_t i = 0; i < s.size(); ++i) {
            s[i] = static_cast<float>(small(rng));
            ids[i] = static_cast<int32_t>(1000 - i);
        }
        const int64_t ns = static_cast<int64_t>(off.size()) - 1;
        std::vector<int32_t> ri(ns * k), ci(ns * k);
        std::vector<float> rs(ns * k), cs(ns * k);
        kernels::TopKParams p;
        p.scores = s.data();
        p.offsets = off.data();
        p.n_segments = ns;
        p.ids = ids.data();
        p.k = k;
        p.out_ids = ri.data();
        p.out_scores = rs.data();
        ASSERT_TRUE(kernels::topk_ref(p).ok());
        p.out_ids = ci.data();
        p.out_scores = cs.data();
        ASSERT_TRUE(kernels::topk_cpu(p).ok());
        EXPECT_EQ(ri, ci) << "k=" << k;  // ties broken by lower id in both
        EXPECT_EQ(rs, cs);
        for (int64_t seg = 0; seg < ns; ++seg) {
            std::set<int32_t> seen;
            for (int j = 0; j < k; ++j) {
                const int32_t id = ci[seg * k + j];
                if (j >= off[seg + 1] - off[seg]) {
                    EXPECT_EQ(id, -1);
                    EXPECT_TRUE(std::isinf(cs[seg * k + j]));
                    continue;
                }
                EXPECT_TRUE(seen.insert(id).second) << "duplicate id";
                if (j > 0) {
                    EXPECT_TRUE(cs[seg * k + j - 1] > cs[seg * k + j] ||
                                (cs[seg * k + j - 1] == cs[seg * k + j] && ci[seg * k + j - 1] < id));
                }
            }
        }
    }
    kernels::TopKParams bad;
    bad.k = 0;
    EXPECT_EQ(kernels::topk_cpu(bad).code(), Status::Code::kInvalidArgument);
}

TEST(TopKCpu, DenseRowsUsePositions) {
    const float s[] = {0.1f, 0.9f, 0.5f, 0.9f, 0.2f, 0.3f};
    int32_t ids[4];
    float out[4];
    kernels::TopKParams p;
    p.scores = s;
    p.row_len = 3;
    p.n_segments = 2;
    p.k = 2;
    p.out_ids = ids;
    p.out_scores = out;
    ASSERT_TRUE(kernels::topk_cpu(p).ok());
    EXPECT_EQ(ids[0], 1);
    EXPECT_EQ(ids[1], 2);
    EXPECT_EQ(ids[2], 0);  // tie 0.9 between none; row 1 = {0.9, 0.2, 0.3}
    EXPECT_EQ(ids[3], 2);
}

// Code MaxSim: cpu (lookup tables) vs ref (decode in fp64), over codecs shaped like PQ and
// residual codes, ragged and dense candidates, empty docs, query lengths, n_code_bytes = 0.
TEST(CodeMaxSimCpu, MatchesRefOnDecodedVectors) {
    struct Case {
        int dim, n_code_bytes, n_centroids;
        bool ragged;
    };
    for (const Case cc : {Case{128, 16, 32, false}, Case{128, 32, 8, true}, Case{96, 12, 16, true},
                          Case{64, 0, 16, true}, Case{32, 4, 1, false}, Case{256, 64, 64, true}}) {
        SCOPED_TRACE("dim " + std::to_string(cc.dim) + " bytes " + std::to_string(cc.n_code_bytes));
        std::mt19937 rng(cc.dim * 7 + cc.n_code_bytes);
        std::normal_distribution<float> n01;
        const int nq = 3, qs = 32, dim = cc.dim, K = cc.n_centroids, nb = cc.n_code_bytes;
        const std::vector<int> lens = {1, 0, 5, 40, 17, 2, 90};
        std::vector<int64_t> off(1, 0);
        for (int l : lens) off.push_back(off.back() + l);
        const int64_t nt = off.back();
        std::vector<float> q(size_t(nq) * qs * dim), cent(size_t(K) * dim);
        for (auto& x : q) x = n01(rng) * 0.1f;
        for (auto& x : cent) x = n01(rng) * 0.1f;
        const int dsub = nb ? dim / nb : 0;
        std::vector<float> book(size_t(nb) * 256 * dsub);
        for (auto& x : book) x = n01(rng) * 0.05f;
        std::vector<uint32_t> tc(nt);
        std::vector<uint8_t> codes(size_t(nt) * nb);
        for (auto& x : tc) x = rng() % K;
        for (auto& x : codes) x = static_cast<uint8_t>(rng());
        std::vector<float> cs(size_t(nq) * qs * K);
        for (int i = 0; i < nq * qs; ++i)
            for (int k = 0; k < K; ++k) {
                double s = 0;
                for (int j = 0; j < dim; ++j) s += double(q[size_t(i) * dim + j]) * cent[size_t(k) * dim + j];
                cs[size_t(i) * K + k] = static_cast<float>(s);
            }
        const int32_t qlens[] = {32, 7, 0};
        std::vector<int64_t> co = {0, 9, 9, 16};
        std::vector<int32_t> cd = {6, 5, 4, 3, 2, 1, 0, 3, 3, 0, 1, 2, 3, 4, 5, 6};
        kernels::CodeMaxSimParams p;
        p.queries = q.data();
        p.n_queries = nq;
        p.q_stride = qs;
        p.dim = dim;
        p.query_lens = qlens;
        p.centroid_scores = cs.data();
        p.n_centroids = K;
        p.token_centroids = tc.data();
        p.codes = nb ? codes.data() : nullptr;
        p.n_code_bytes = nb;
        p.codebook = nb ? book.data() : nullptr;
        p.doc_offsets = off.data();
        p.n_docs = static_cast<int64_t>(lens.size());
        if (cc.ragged) {
            p.cand_offsets = co.data();
            p.cand_docs = cd.data();
        }
        // Each token scaled (token_scales) by 0.5 .. 1.5, or not; unread without codes.
        std::vector<float> scales(static_cast<size_t>(nt));
        for (auto& x : scales) x = 0.5f + float(rng() % 1000) / 1000.f;
        for (const bool scaled : {false, true}) {
            SCOPED_TRACE(scaled ? "token scales" : "no scales");
            p.token_scales = scaled ? scales.data() : nullptr;
            const int64_t n = kernels::code_maxsim_num_scores(p);
            std::vector<double> ref(n), plain(n);
            std::vector<float> got(n);
            p.scores = got.data();
            ASSERT_TRUE(kernels::code_maxsim_ref(p, cent.data(), ref.data()).ok());
            ASSERT_TRUE(kernels::code_maxsim_cpu(p).ok());
            for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(got[i], ref[i], 1e-4 * (1 + std::fabs(ref[i]))) << i;
            // The scales change the scores (where there are codes to scale).
            p.token_scales = nullptr;
            ASSERT_TRUE(kernels::code_maxsim_ref(p, cent.data(), plain.data()).ok());
            int differ = 0;
            for (int64_t i = 0; i < n; ++i) differ += std::fabs(plain[i] - ref[i]) > 1e-6;
            EXPECT_EQ(differ > 0, scaled && nb > 0 && n > 0);
        }
    }
}

// The decoded tokens' inverse norms: cpu (fp32) against ref (fp64), and the ref against a norm
// computed here from the decoded vector; a zero vector gets 1; a bad centroid id is refused.
TEST(DecodedScales, CpuMatchesRef) {
    for (const int nb : {16, 32, 64}) {
        const int dim = 128, K = 20, dsub = dim / nb;
        const int64_t nt = 700;
        std::mt19937 rng(nb);
        std::normal_distribution<float> n01;
        std::vector<float> cent(size_t(K) * dim), book(size_t(nb) * 256 * dsub);
        for (auto& x : cent) x = n01(rng) * 0.09f;
        for (auto& x : book) x = n01(rng) * 0.03f;
        for (int j = 0; j < dim; ++j) cent[j] = 0.f;   // centroid 0 is zero, and so is
        for (int j = 0; j < dsub; ++j) book[j] = 0.f;  // entry 0 of block 0 ...
        std::vector<uint32_t> tc(nt);
        std::vector<uint8_t> codes(size_t(nt) * nb);
        for (auto& x : tc) x = rng() % K;
        for (auto& x : codes) x = uint8_t(rng());
        tc[5] = 0;
        for (int b = 0; b < nb; ++b) codes[5 * nb + b] = 0;  // ... so token 5 decodes to zero
        for (int b = 1; b < nb; ++b)
            for (int j = 0; j < dsub; ++j) book[(size_t(b) * 256) * dsub + j] = 0.f;
        kernels::DecodedScaleParams p;
        p.centroids = cent.data();
        p.n_centroids = K;
        p.dim = dim;
        p.token_centroids = tc.data();
        p.codes = codes.data();
        p.n_code_bytes = nb;
        p.codebook = book.data();
        p.n_tokens = nt;
        std::vector<double> ref(static_cast<size_t>(nt));
        std::vector<float> got(static_cast<size_t>(nt));
        p.scales = got.data();
        ASSERT_TRUE(kernels::decoded_scales_ref(p, ref.data()).ok());
        ASSERT_TRUE(kernels::decoded_scales_cpu(p).ok());
        EXPECT_EQ(ref[5], 1.0);
        EXPECT_EQ(got[5], 1.0f);
        for (int64_t t = 0; t < nt; ++t) {
            double ss = 0;
            for (int j = 0; j < dim; ++j) {
                const int b = j / dsub;
                const double x = double(cent[size_t(tc[t]) * dim + j]) +
                                 book[(size_t(b) * 256 + codes[t * nb + b]) * dsub + j % dsub];
                ss += x * x;
            }
            if (t != 5) EXPECT_NEAR(ref[t], 1.0 / std::sqrt(ss), 1e-12 * ref[t]) << t;
            EXPECT_NEAR(got[t], ref[t], 1e-5 * ref[t]) << t;
        }
        tc[9] = K;
        EXPECT_FALSE(kernels::decoded_scales_ref(p, ref.data()).ok());
        EXPECT_FALSE(kernels::decoded_scales_cpu(p).ok());
        p.n_code_bytes = 0;
        EXPECT_FALSE(kernels::decoded_scales_cpu(p).ok());
    }
}

// Residual codebooks (one block of bucket-weight combinations for every code byte) have equal
// blocks; one changed value, a PQ-style codebook or an empty one do not.
TEST(CodebookBlocksEqual, ResidualYesPqNo) {
    const int dim = 64, nb = 16, dsub = dim / nb;
    std::vector<float> book(size_t(nb) * 256 * dsub);
    for (int b = 0; b < nb; ++b)
        for (int e = 0; e < 256; ++e)
            for (int j = 0; j < dsub; ++j) book[(size_t(b) * 256 + e) * dsub + j] = 0.01f * float((e >> (2 * j)) & 3);
    EXPECT_TRUE(kernels::codebook_blocks_equal(book.data(), dim, nb));
    book[(size_t(nb - 1) * 256 + 200) * dsub + 1] += 0.5f;
    EXPECT_FALSE(kernels::codebook_blocks_equal(book.data(), dim, nb));
    for (size_t i = 0; i < book.size(); ++i) book[i] = float(i % 97) * 0.001f;
    EXPECT_FALSE(kernels::codebook_blocks_equal(book.data(), dim, nb));
    EXPECT_TRUE(kernels::codebook_blocks_equal(book.data(), dim, 1));  // one block
    EXPECT_FALSE(kernels::codebook_blocks_equal(nullptr, dim, 0));
    EXPECT_FALSE(kernels::codebook_blocks_equal(book.data(), dim, 3));  // 3 does not divide 64
}

TEST(HalfCpu, RoundTripsAndRounds) {
    for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333333f}) {
        EXPECT_EQ(kernels::half_to_float(kernels::float_to_half(f)),
                  kernels::half_to_float(kernels::float_to_half(kernels::half_to_float(kernels::float_to_half(f)))));
    }
    EXPECT_EQ(kernels::float_to_half(1.0f), 0x3c00);
    EXPECT_EQ(kernels::float_to_half(-2.0f), 0xc000);
    EXPECT_EQ(kernels::float_to_half(65520.0f), 0x7c00);        // rounds to +inf
    EXPECT_EQ(kernels::float_to_half(5.9604645e-08f), 0x0001);  // smallest subnormal
    EXPECT_EQ(kernels::half_to_float(0x0001), 5.9604645e-08f);
    EXPECT_EQ(kernels::float_to_half(1.0f + 1.0f / 2048), 0x3c00);  // tie -> even
    EXPECT_EQ(kernels::float_to_half(1.0f + 3.0f / 2048), 0x3c02);
    EXPECT_TRUE(std::isnan(kernels::half_to_float(kernels::float_to_half(NAN))));
    EXPECT_EQ(kernels::float_to_bf16(1.0f), 0x3f80);
    EXPECT_EQ(kernels::bf16_to_float(0x4040), 3.0f);
}

}  // namespace
}  // namespace tms

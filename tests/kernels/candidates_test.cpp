// Copyright TileMaxSim authors. Candidate-generation ops: the CPU path equals the spec.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tests/kernels/candidates_cases.h"

namespace tms {
namespace {

TEST(IvfUnionCpu, EqualsReferenceOnEveryCase) {
    for (const test::UnionCase& c : test::UnionCases()) {
        const test::UnionData d = test::MakeUnionData(c);
        std::vector<int64_t> ro, co;
        std::vector<int32_t> rd, cd;
        ASSERT_TRUE(kernels::ivf_union_ref(d.p, &ro, &rd).ok()) << c.name;
        ASSERT_TRUE(kernels::ivf_union_cpu(d.p, &co, &cd).ok()) << c.name;
        EXPECT_EQ(ro, co) << c.name;
        EXPECT_EQ(rd, cd) << c.name;
        ASSERT_EQ(ro.size(), size_t(c.n_queries) + 1) << c.name;
        if (c.name == "nothing_probed") {
            EXPECT_TRUE(rd.empty());
        }
        if (c.name == "lists_hold_everything" && c.n_queries > 0) {
            EXPECT_GT(ro[1], 0);  // the case probes something
        }
        for (int q = 0; q < c.n_queries; ++q) {  // ascending, unique, in range
            for (int64_t i = ro[q] + 1; i < ro[q + 1]; ++i) ASSERT_LT(rd[i - 1], rd[i]) << c.name;
            for (int64_t i = ro[q]; i < ro[q + 1]; ++i) ASSERT_LT(rd[i], c.n_docs) << c.name;
        }
    }
}

TEST(ProbeScoresCpu, EqualsReferenceOnEveryCase) {
    for (const test::UnionCase& c : test::UnionCases()) {
        for (const int keep : {0, 1, 7, 1000}) {
            SCOPED_TRACE(c.name + ", keep " + std::to_string(keep));
            const test::ProbeData d = test::MakeProbeData(c, keep);
            std::vector<int64_t> ro, co, uo;
            std::vector<int32_t> rd, cd, ud;
            std::vector<uint32_t> rs, cs;
            ASSERT_TRUE(kernels::probe_scores_ref(d.p, &ro, &rd, &rs).ok());
            ASSERT_TRUE(kernels::probe_scores_cpu(d.p, &co, &cd, &cs).ok());
            EXPECT_EQ(ro, co);
            EXPECT_EQ(rd, cd);
            EXPECT_EQ(rs, cs);
            // Each query keeps min(keep, union) documents of its union, in score order.
            ASSERT_TRUE(kernels::ivf_union_ref(d.p.lists, &uo, &ud).ok());
            for (int q = 0; q < c.n_queries; ++q) {
                const int64_t n = uo[q + 1] - uo[q];
                ASSERT_EQ(ro[q + 1] - ro[q], keep ? std::min<int64_t>(n, keep) : n) << "query " << q;
                for (int64_t i = ro[q]; i < ro[q + 1]; ++i) {
                    EXPECT_TRUE(std::binary_search(ud.begin() + uo[q], ud.begin() + uo[q + 1], rd[i]));
                    EXPECT_LE(rs[i], uint32_t(kernels::kProbeScoreUnit) + 64);
                    if (i > ro[q]) EXPECT_TRUE(rs[i - 1] > rs[i] || (rs[i - 1] == rs[i] && rd[i - 1] < rd[i]));
                }
            }
        }
    }
}

// A filter removes exactly the documents it does not allow: the filtered union is the unfiltered
// one less those, and each allowed document keeps its unfiltered probe score.
TEST(CandidatesFilter, RemovesExactlyTheDocumentsNotAllowed) {
    int filtered = 0;
    for (const test::UnionCase& c : test::UnionCases()) {
        if (!c.allow) continue;
        ++filtered;
        SCOPED_TRACE(c.name);
        test::ProbeData d = test::MakeProbeData(c, 0);
        kernels::IvfUnionParams all = d.p.lists;
        all.allow = nullptr;
        std::vector<int64_t> fo, ao, po, pao;
        std::vector<int32_t> fd, ad, pd, pad;
        std::vector<uint32_t> ps, pas;
        ASSERT_TRUE(kernels::ivf_union_ref(d.p.lists, &fo, &fd).ok());
        ASSERT_TRUE(kernels::ivf_union_ref(all, &ao, &ad).ok());
        kernels::ProbeScoreParams unfiltered = d.p;
        unfiltered.lists = all;
        ASSERT_TRUE(kernels::probe_scores_ref(d.p, &po, &pd, &ps).ok());
        ASSERT_TRUE(kernels::probe_scores_ref(unfiltered, &pao, &pad, &pas).ok());
        int64_t dropped = 0;
        for (int q = 0; q < c.n_queries; ++q) {
            std::vector<int32_t> want;
            for (int64_t i = ao[q]; i < ao[q + 1]; ++i) {
                if (kernels::doc_allowed(d.p.lists, q, ad[i]))
                    want.push_back(ad[i]);
                else
                    ++dropped;
            }
            EXPECT_EQ(std::vector<int32_t>(fd.begin() + fo[q], fd.begin() + fo[q + 1]), want) << "query " << q;
            std::vector<std::pair<int32_t, uint32_t>> got, expect;
            for (int64_t i = po[q]; i < po[q + 1]; ++i) got.push_back({pd[i], ps[i]});
            for (int64_t i = pao[q]; i < pao[q + 1]; ++i)
                if (kernels::doc_allowed(d.p.lists, q, pad[i])) expect.push_back({pad[i], pas[i]});
            std::sort(got.begin(), got.end());
            std::sort(expect.begin(), expect.end());
            EXPECT_EQ(got, expect) << "query " << q;
        }
        EXPECT_GT(dropped, 0);  // the case's filter removes something
    }
    EXPECT_GE(filtered, 2);
}

// One query of two rows over four documents, by hand: row 0 probes lists A = {0, 1} (0.9) and
// B = {1, 2} (0.7), floor 0.5; row 1 probes B (0.6), floor 0.2. The range is (0.9 - 0.5) +
// (0.6 - 0.2) = 0.8: document 1 gets its best probe of row 0 (A) and B of row 1: 0.4 + 0.4 =
// the whole unit; document 0: 0.4 (half), document 2: 0.2 + 0.4 (three quarters); 3: never probed.
TEST(ProbeScoresCpu, HandComputedQuery) {
    const std::vector<int64_t> ivf_off = {0, 2, 4};
    const std::vector<int32_t> ivf_docs = {0, 1, 1, 2};
    const std::vector<int32_t> probe = {0, 1, 1, -1};
    const std::vector<float> scores = {0.9f, 0.7f, 0.6f, 0.f}, floors = {0.5f, 0.2f};
    kernels::ProbeScoreParams p;
    p.lists.probe = probe.data();
    p.lists.n_queries = 1;
    p.lists.q_stride = 2;
    p.lists.nprobe = 2;
    p.lists.ivf_offsets = ivf_off.data();
    p.lists.ivf_docs = ivf_docs.data();
    p.lists.n_centroids = 2;
    p.lists.n_docs = 4;
    p.probe_scores = scores.data();
    p.floor_scores = floors.data();
    std::vector<int64_t> off;
    std::vector<int32_t> docs;
    std::vector<uint32_t> s;
    ASSERT_TRUE(kernels::probe_scores_cpu(p, &off, &docs, &s).ok());
    EXPECT_EQ(docs, (std::vector<int32_t>{1, 2, 0}));
    const double unit = kernels::kProbeScoreUnit;
    ASSERT_EQ(s.size(), 3u);
    EXPECT_NEAR(s[0], unit, 4);
    EXPECT_NEAR(s[1], 0.75 * unit, 4);
    EXPECT_NEAR(s[2], 0.5 * unit, 4);
    p.keep = 2;
    ASSERT_TRUE(kernels::probe_scores_cpu(p, &off, &docs, &s).ok());
    EXPECT_EQ(docs, (std::vector<int32_t>{1, 2}));
    p.keep = -1;
    EXPECT_FALSE(kernels::probe_scores_cpu(p, &off, &docs, &s).ok());
}

TEST(SplitTf32x3, PartsAreExactAndSumToTheValue) {
    std::mt19937 rng(3);
    std::normal_distribution<float> g(0, 3);
    const int rows = 17, dim = 40;
    std::vector<float> x(size_t(rows) * dim), out(size_t(rows) * dim * 3);
    for (float& v : x) v = g(rng);
    x[5] = 0.f;
    x[6] = -1e-30f;
    kernels::split_tf32x3_ref(x.data(), rows, dim, 0b010u, out.data());  // hi, lo, hi
    for (int r = 0; r < rows; ++r) {
        for (int j = 0; j < dim; ++j) {
            const float hi = out[(size_t(r) * 3 + 0) * dim + j], lo = out[(size_t(r) * 3 + 1) * dim + j];
            EXPECT_EQ(out[(size_t(r) * 3 + 2) * dim + j], hi);
            EXPECT_EQ(hi + lo, x[size_t(r) * dim + j]);
            uint32_t u;
            std::memcpy(&u, &hi, 4);
            EXPECT_EQ(u & 0x1fffu, 0u);  // hi has TF32's 10 mantissa bits
            EXPECT_LE(std::fabs(lo), std::fabs(x[size_t(r) * dim + j]) * std::ldexp(1.f, -10));
        }
    }
}

}  // namespace
}  // namespace tms

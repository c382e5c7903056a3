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

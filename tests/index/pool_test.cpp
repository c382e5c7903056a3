// Copyright TileMaxSim authors. Token pooling: the clustering, and builds and adds that pool.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "index/index_data.h"
#include "index/ingest/pool.h"
#include "index/store/index_reader.h"
#include "kernels/maxsim.h"
#include "tests/scratch_dir.h"
#include "tilemaxsim/tilemaxsim.h"

namespace tms {
namespace {

std::vector<float> unit_vector(std::vector<float> v) {
    double s = 0;
    for (float x : v) s += double(x) * x;
    for (float& x : v) x = float(x / std::sqrt(s));
    return v;
}

// Tokens that are copies of a few directions pool back to those directions, in the order of their
// first tokens; the most similar pair merges first; a cluster keeps its tokens' mean norm.
TEST(PoolCpu, MergesTheMostSimilarTokensFirst) {
    const int dim = 4;
    const auto a = unit_vector({1, 0, 0, 0}), b = unit_vector({0, 1, 0, 0}), c = unit_vector({0, 0, 1, 1});
    // a b a c b a: three directions, six tokens.
    std::vector<float> x;
    for (const auto* v : {&a, &b, &a, &c, &b, &a}) x.insert(x.end(), v->begin(), v->end());
    std::vector<float> out(3 * dim);
    index::PoolTokens(x.data(), 6, dim, 3, out.data());
    for (int j = 0; j < dim; ++j) {
        EXPECT_NEAR(out[size_t(j)], a[size_t(j)], 1e-6);
        EXPECT_NEAR(out[size_t(dim + j)], b[size_t(j)], 1e-6);
        EXPECT_NEAR(out[size_t(2 * dim + j)], c[size_t(j)], 1e-6);
    }
    // p ~ q (cosine 0.995) and r ~ s (0.98), the pairs far apart: two clusters, p+q then r+s.
    const auto p = unit_vector({1, 0.1f, 0, 0}), q = unit_vector({1, 0, 0, 0}), r = unit_vector({0, 0, 1, 0.2f}),
               s = unit_vector({0, 0, 1, 0});
    x.clear();
    for (const auto* v : {&r, &p, &s, &q}) x.insert(x.end(), v->begin(), v->end());
    out.assign(2 * dim, 0);
    index::PoolTokens(x.data(), 4, dim, 2, out.data());
    const auto rs = unit_vector({r[0] + s[0], r[1] + s[1], r[2] + s[2], r[3] + s[3]});
    const auto pq = unit_vector({p[0] + q[0], p[1] + q[1], p[2] + q[2], p[3] + q[3]});
    for (int j = 0; j < dim; ++j) {
        EXPECT_NEAR(out[size_t(j)], rs[size_t(j)], 1e-6);  // the cluster of token 0 first
        EXPECT_NEAR(out[size_t(dim + j)], pq[size_t(j)], 1e-6);
    }
    // Norms: two tokens of norms 2 and 4 in one direction pool to norm 3; keep >= n copies.
    x = {2, 0, 0, 0, 4, 0, 0, 0};
    out.assign(dim, 0);
    index::PoolTokens(x.data(), 2, dim, 1, out.data());
    EXPECT_NEAR(out[0], 3.0f, 1e-6);
    out.assign(2 * dim, 0);
    index::PoolTokens(x.data(), 2, dim, 5, out.data());
    EXPECT_EQ(out, x);
}

// Every document keeps ceil(len / factor) tokens, pooled as PoolTokens pools it alone.
TEST(PoolCpu, DocumentsPoolAsEachAlone) {
    const int dim = 32;
    std::mt19937 rng(4);
    std::normal_distribution<float> n01;
    const std::vector<int64_t> lens = {1, 2, 3, 7, 30, 64, 5};
    std::vector<float> x;
    for (int64_t l : lens)
        for (int64_t i = 0; i < l * dim; ++i) x.push_back(n01(rng));
    for (int factor : {1, 2, 3, 4}) {
        std::vector<uint16_t> out;
        std::vector<int64_t> got;
        ASSERT_TRUE(index::PoolDocuments(EmbeddingView{x.data(), DType::kF32, int64_t(x.size()) / dim, dim}, lens,
                                         factor, &out, &got)
                        .ok());
        int64_t in = 0, at = 0;
        for (size_t d = 0; d < lens.size(); ++d) {
            EXPECT_EQ(got[d], (lens[d] + factor - 1) / factor);
            std::vector<float> want(size_t(got[d]) * dim);
            index::PoolTokens(x.data() + in * dim, lens[d], dim, got[d], want.data());
            for (size_t i = 0; i < want.size(); ++i)
                ASSERT_EQ(out[size_t(at * dim) + i], kernels::float_to_half(want[i])) << factor << " " << d;
            in += lens[d];
            at += got[d];
        }
        EXPECT_EQ(int64_t(out.size()), at * dim);
    }
}

// An index built with pool_factor (from memory, from a stream) holds the pooled tokens, and a
// document added later is pooled alike.
TEST(PoolCpu, BuildsStreamsAndAddsPool) {
    const int dim = 32;
    std::mt19937 rng(8);
    std::normal_distribution<float> n01;
    std::vector<int64_t> lens;
    std::vector<uint16_t> x;
    std::vector<std::string> ids;
    for (int d = 0; d < 300; ++d) {
        lens.push_back(1 + int(rng() % 40));
        ids.push_back("d" + std::to_string(d));
        for (int64_t i = 0; i < lens.back() * dim; ++i) x.push_back(kernels::float_to_half(n01(rng) * 0.2f));
    }
    const EmbeddingView v{x.data(), DType::kF16, int64_t(x.size()) / dim, dim};
    std::vector<uint16_t> pooled;
    std::vector<int64_t> plens;
    ASSERT_TRUE(index::PoolDocuments(v, lens, 2, &pooled, &plens).ok());
    const std::string dir = testing::ScratchDir("tms_pool_build").string();
    IndexBuildOptions o;
    o.n_centroids = 16;
    o.keep_vectors = true;
    o.progress = false;
    o.pool_factor = 2;
    std::unique_ptr<IndexBuilder> b;
    ASSERT_TRUE(IndexBuilder::Create(o, dir + "/built", &b).ok());
    ASSERT_TRUE(b->Build(v, lens, ids).ok());
    std::unique_ptr<IndexStreamBuilder> sb;
    ASSERT_TRUE(IndexStreamBuilder::Create(o, dir + "/streamed", 0, &sb).ok());
    int64_t row = 0;
    for (size_t d0 = 0; d0 < lens.size(); d0 += 50) {
        const std::vector<int64_t> l(lens.begin() + int64_t(d0), lens.begin() + int64_t(d0 + 50));
        int64_t n = 0;
        for (int64_t k : l) n += k;
        ASSERT_TRUE(sb->Add(EmbeddingView{x.data() + row * dim, DType::kF16, n, dim}, l,
                            std::vector<std::string>(ids.begin() + int64_t(d0), ids.begin() + int64_t(d0 + 50)))
                        .ok());
        row += n;
    }
    ASSERT_TRUE(sb->Finish().ok());
    for (const char* name : {"/built", "/streamed"}) {
        index::IndexData got;
        ASSERT_TRUE(index::ReadIndex(dir + name, true, false, &got).ok());
        EXPECT_EQ(std::vector<uint16_t>(got.vectors.begin(), got.vectors.end()), pooled) << name;
        EXPECT_EQ(got.info.n_tokens, int64_t(pooled.size()) / dim) << name;
    }
    // Added later: pooled by the index's factor.
    std::unique_ptr<IndexUpdater> u;
    ASSERT_TRUE(IndexUpdater::Open(dir + "/built", false, &u).ok());
    const std::vector<int64_t> one = {lens[5]};
    int64_t off = 0;
    for (int d = 0; d < 5; ++d) off += lens[size_t(d)];
    ASSERT_TRUE(u->Add(EmbeddingView{x.data() + off * dim, DType::kF16, lens[5], dim}, one, {"again"}, false).ok());
    ASSERT_TRUE(u->Commit().ok());
    index::IndexData got;
    ASSERT_TRUE(index::ReadIndex(dir + "/built", true, false, &got).ok());
    int64_t poff = 0;
    for (int d = 0; d < 5; ++d) poff += plens[size_t(d)];
    const std::vector<uint16_t> added(got.vectors.end() - plens[5] * dim, got.vectors.end());
    EXPECT_EQ(added, std::vector<uint16_t>(pooled.begin() + poff * dim, pooled.begin() + (poff + plens[5]) * dim));
    // The option is refused out of range.
    IndexBuildOptions bad = o;
    bad.pool_factor = 0;
    EXPECT_FALSE(IndexBuilder::Create(bad, dir + "/bad", &b).ok());
}

}  // namespace
}  // namespace tms

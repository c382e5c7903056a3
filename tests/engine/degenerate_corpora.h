// Copyright TileMaxSim authors. Approximate search on degenerate corpora answers every query,
// shared by the CPU and the GPU test.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tests/scratch_dir.h"
#include "tilemaxsim/tilemaxsim.h"

namespace tms::testing {

// Degenerate corpora: every token the same vector, or three distinct ones (fewer distinct tokens
// than the centroids asked for). FAISS's k-means fills its empty clusters with near-copies of a
// populated centroid that outrank it for most query tokens, so probing picked empty lists and
// approximate search answered 1 of 20 queries. Every query must get min(k, documents) results,
// with vectors (exact rerank) and without, on both codecs, as exhaustive search does. `device`
// builds (k-means, encoding) and searches.
inline void ExpectDegenerateCorporaAnswered(Device device) {
    const int dim = 64, n_docs = 200, k = 10;
    std::mt19937 rng(7);
    std::normal_distribution<float> n01;
    auto unit = [&] {
        std::vector<float> v(dim);
        double s = 0;
        for (auto& x : v) s += double(x = n01(rng)) * x;
        for (auto& x : v) x = float(x / std::sqrt(s));
        return v;
    };
    std::vector<std::vector<float>> distinct = {unit(), unit(), unit()};
    std::vector<float> queries;
    const int nq = 20, qt = 8;
    for (int i = 0; i < nq * qt; ++i) {
        const std::vector<float> u = unit();
        queries.insert(queries.end(), u.begin(), u.end());
    }
    for (const int n_distinct : {1, 3}) {
        std::vector<float> docs;
        std::vector<int64_t> lens;
        for (int d = 0; d < n_docs; ++d) {
            lens.push_back(5 + d % 30);
            for (int t = 0; t < lens.back(); ++t) {
                const auto& v = distinct[size_t((d + t) % n_distinct)];
                docs.insert(docs.end(), v.begin(), v.end());
            }
        }
        for (const std::string codec : {"pq", "residual"}) {
            for (const bool vectors : {true, false}) {
                IndexBuildOptions bo;
                bo.codec = codec;
                bo.keep_vectors = vectors;
                bo.progress = false;
                bo.device = device;
                const std::string path = ScratchDir("tms_degenerate").string() + "/" + std::to_string(n_distinct) +
                                         codec + (vectors ? "v" : "");
                std::unique_ptr<IndexBuilder> b;
                ASSERT_TRUE(IndexBuilder::Create(bo, path, &b).ok());
                const EmbeddingView v{docs.data(), DType::kF32, int64_t(docs.size() / dim), dim};
                ASSERT_TRUE(b->Build(v, lens, {}).ok());
                IndexInfo info;
                ASSERT_TRUE(ReadIndexInfo(path, &info).ok());
                EXPECT_LE(info.n_centroids, n_distinct) << "centroids no token is nearest to are dropped";
                std::unique_ptr<Searcher> s;
                SearcherOptions so;
                so.device = device;
                ASSERT_TRUE(Searcher::Open(so, path, &s).ok());
                const QueryBatch qb{queries.data(), DType::kF32, nq, qt, dim, nullptr};
                std::vector<std::vector<SearchHit>> res;
                SearchOptions o;
                o.k = k;
                o.target_recall = 0;  // the approximate pipeline (a 200-document index plans exhaustive)
                ASSERT_TRUE(s->Search(qb, o, &res).ok());
                for (int q = 0; q < nq; ++q) {
                    EXPECT_EQ(res[size_t(q)].size(), size_t(k))
                        << n_distinct << " distinct tokens, " << codec << (vectors ? " with" : " without")
                        << " vectors, query " << q;
                }
            }
        }
    }
}

}  // namespace tms::testing

// Copyright TileMaxSim authors. Per-query certification (SearchOptions::certify): a query
// reported certified has the exhaustive top-k, on corpora of many kinds; a hard corpus is searched
// deeper than an easy one. Shared by the CPU and the GPU test.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tests/scratch_dir.h"
#include "tilemaxsim/tilemaxsim.h"

namespace tms::testing {

// A corpus of `n_docs` documents and `nq` queries of its kind.
struct CertifyCorpus {
    std::string name;
    int dim = 32, n_docs = 600, nq = 24, qt = 12;
    std::vector<float> docs, queries;
    std::vector<int64_t> lens;
    std::vector<int32_t> qlens;
};

// kind: 0 topics (documents and queries near a few of 20 topic vectors; easy), 1 noise (every
// token random: the probes barely tell documents apart; hard), 2 unnormalised (norms 0.1-30,
// dim 64), 3 few distinct tokens (5 vectors, duplicate documents), 4 lengths 1-200 and queries of
// 1-12 tokens.
inline CertifyCorpus MakeCertifyCorpus(int kind, uint32_t seed) {
    CertifyCorpus c;
    std::mt19937 rng(seed);
    std::normal_distribution<float> n01;
    std::uniform_real_distribution<float> u01;
    if (kind == 2) c.dim = 64;  // the GPU's exact scorer takes multiples of 32
    const int dim = c.dim;
    auto unit = [&](const std::vector<float>* around, float noise) {
        std::vector<float> v(static_cast<size_t>(dim));
        double s = 0;
        for (int j = 0; j < dim; ++j) {
            v[size_t(j)] = (around ? (*around)[size_t(j)] : 0.f) + noise * n01(rng);
            s += double(v[size_t(j)]) * v[size_t(j)];
        }
        for (auto& x : v) x = float(x / std::sqrt(std::max(s, 1e-30)));
        return v;
    };
    std::vector<std::vector<float>> topics;
    for (int t = 0; t < 20; ++t) topics.push_back(unit(nullptr, 1.f));
    std::vector<std::vector<float>> few;
    for (int t = 0; t < 5; ++t) few.push_back(unit(nullptr, 1.f));
    auto token = [&](int topic) -> std::vector<float> {
        switch (kind) {
            case 1: return unit(nullptr, 1.f);
            case 3: return few[size_t(topic % 5)];
            default: {
                std::vector<float> v = unit(&topics[size_t(topic)], kind == 4 ? 0.35f : 0.25f);
                if (kind == 2) {
                    const float norm = 0.1f + 30.f * u01(rng) * u01(rng);
                    for (auto& x : v) x *= norm;
                }
                return v;
            }
        }
    };
    const char* names[] = {"topics", "noise", "unnormalised", "few distinct tokens", "ragged lengths"};
    c.name = names[kind];
    for (int d = 0; d < c.n_docs; ++d) {
        const int len = kind == 4 ? 1 + int(rng() % 200) : 10 + int(rng() % 40);
        c.lens.push_back(len);
        const int t0 = int(rng() % 20), t1 = int(rng() % 20);
        for (int t = 0; t < len; ++t) {
            const std::vector<float> v = token(t % 3 == 0 ? t1 : t0);
            c.docs.insert(c.docs.end(), v.begin(), v.end());
        }
    }
    for (int q = 0; q < c.nq; ++q) {
        const int len = kind == 4 ? 1 + int(rng() % c.qt) : c.qt;
        c.qlens.push_back(len);
        const int t0 = int(rng() % 20);
        for (int t = 0; t < c.qt; ++t) {
            std::vector<float> v = t < len ? token(t0) : std::vector<float>(size_t(dim), 0.f);
            if (kind == 2 && t < len) {  // queries of unit norm
                double s = 0;
                for (float x : v) s += double(x) * x;
                for (auto& x : v) x = float(x / std::sqrt(s));
            }
            c.queries.insert(c.queries.end(), v.begin(), v.end());
        }
    }
    return c;
}

// An index of `c` with `codec` and the vectors, built at `path` on `device` and opened there.
inline void OpenCorpusIndex(const CertifyCorpus& c, const std::string& codec, Device device, const std::string& path,
                            std::unique_ptr<Searcher>* s) {
    IndexBuildOptions bo;
    bo.codec = codec;
    bo.keep_vectors = true;
    bo.progress = false;
    bo.device = device;
    std::unique_ptr<IndexBuilder> b;
    ASSERT_TRUE(IndexBuilder::Create(bo, path, &b).ok());
    const EmbeddingView v{c.docs.data(), DType::kF32, int64_t(c.docs.size() / size_t(c.dim)), c.dim};
    ASSERT_TRUE(b->Build(v, c.lens, {}).ok()) << c.name;
    SearcherOptions so;
    so.device = device;
    ASSERT_TRUE(Searcher::Open(so, path, s).ok());
}

// Certification on every kind of corpus, both codecs: each query certified has the exhaustive
// top-k (its scores, rank by rank: documents of equal score may trade places); the hard (noise)
// corpus is searched again more often than the easy (topics) one; uncertified (the default) and exhaustive
// search report nothing. The search starts shallow (nprobe 2, 64 candidates, rerank 16 of 600
// documents; then 8 / 256 / 64) so that its cuts leave documents out. `device` builds and
// searches.
inline void ExpectCertifiedQueriesExact(Device device) {
    const int k = 10;
    int certified = 0, total = 0;  // over every search
    double again_easy = 0, again_hard = 0;
    for (int kind = 0; kind < 5; ++kind) {
        for (const std::string codec : {"pq", "residual"}) {
            const CertifyCorpus c = MakeCertifyCorpus(kind, 11u + uint32_t(kind));
            std::unique_ptr<Searcher> s;
            ASSERT_NO_FATAL_FAILURE(OpenCorpusIndex(
                c, codec, device, ScratchDir("tms_certify").string() + "/" + std::to_string(kind) + codec, &s));
            const QueryBatch qb{c.queries.data(), DType::kF32, c.nq, c.qt, c.dim, c.qlens.data()};
            SearchOptions ex;
            ex.k = k;
            ex.exhaustive = true;
            std::vector<std::vector<SearchHit>> truth, res;
            SearchTimings t;
            ASSERT_TRUE(s->Search(qb, ex, &truth, &t).ok());
            EXPECT_TRUE(t.certified.empty()) << "exhaustive search is exact: nothing to certify";
            ex.certify = true;
            ASSERT_TRUE(s->Search(qb, ex, &truth, &t).ok());
            EXPECT_TRUE(t.certified.empty()) << "exhaustive search is exact, even asked to certify";
            for (const int depth : {1, 4}) {  // probes, candidates and rerank of the first search
                SearchOptions o;
                o.k = k;
                o.target_recall = 0;  // these settings, not the plan (a small index plans exhaustive)
                o.nprobe = 2 * depth;
                o.ncandidates = 64 * depth;
                o.rerank = 16 * depth;
                o.certify = true;
                ASSERT_TRUE(s->Search(qb, o, &res, &t).ok());
                ASSERT_EQ(t.certified.size(), size_t(c.nq)) << c.name;
                ASSERT_EQ(t.depth.size(), size_t(c.nq));
                int again = 0;
                for (int q = 0; q < c.nq; ++q) {
                    const auto& want = truth[size_t(q)];
                    const auto& got = res[size_t(q)];
                    EXPECT_TRUE(t.depth[size_t(q)] == 0 || t.depth[size_t(q)] == 3) << "3 steps without an estimate";
                    again += t.depth[size_t(q)] > 0;
                    EXPECT_TRUE(t.certified[size_t(q)] || t.depth[size_t(q)] > 0)
                        << c.name << " " << codec << " query " << q << ": not certified, not searched again";
                    if (!t.certified[size_t(q)]) continue;
                    ++certified;
                    ASSERT_EQ(got.size(), want.size()) << c.name << " " << codec << " query " << q;
                    for (size_t r = 0; r < want.size(); ++r) {
                        EXPECT_NEAR(got[r].score, want[r].score, 1e-4f * std::max(1.f, std::fabs(want[r].score)))
                            << c.name << " " << codec << " query " << q << " rank " << r
                            << ": certified, but not the exhaustive top-k";
                    }
                }
                total += c.nq;  // (per search)
                if (kind == 0) again_easy += double(again) / c.nq;
                if (kind == 1) again_hard += double(again) / c.nq;
                SearchOptions off = o;
                off.certify = false;
                ASSERT_TRUE(s->Search(qb, off, &res, &t).ok());
                EXPECT_TRUE(t.certified.empty() && t.depth.empty());
            }
        }
    }
    EXPECT_GT(certified, total / 8) << "many queries of these corpora are certified";
    EXPECT_LT(certified, total) << "some are not (else the test says nothing of the bounds)";
    EXPECT_GT(again_hard, again_easy) << "the noise corpus is searched again more often than the topics one";
}

}  // namespace tms::testing

// Copyright TileMaxSim authors. The adaptive default search (SearchOptions::adaptive): a query is
// searched again deeper exactly when its top-k was not among the first SettledRanks(k) of its
// compressed ranking, and then keeps the best of both searches; hard corpora go deeper more
// often than easy ones. Shared by the CPU and the GPU test.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/plan.h"
#include "tests/engine/certify.h"
#include "tests/scratch_dir.h"
#include "tilemaxsim/tilemaxsim.h"

namespace tms::testing {

// Rank by rank, the scores of `got` are those of `want` (documents of equal score may trade
// places between searches).
inline void ExpectSameScores(const std::vector<SearchHit>& want, const std::vector<SearchHit>& got,
                             const std::string& where) {
    ASSERT_EQ(got.size(), want.size()) << where;
    for (size_t r = 0; r < want.size(); ++r) {
        EXPECT_NEAR(got[r].score, want[r].score, 1e-4f * std::max(1.f, std::fabs(want[r].score)))
            << where << " rank " << r;
    }
}

// On every kind of certification corpus, both codecs, a search started shallow (nprobe 2, 128
// candidates, rerank 64 of 600 documents) with target_recall: each query's depth is 2 steps where
// a document of the fixed search's top 10 is not among the first 16 of that search's compressed
// ranking (measured by a search without a rerank), else 0; its results are the fixed search's,
// or the best 10 of the fixed and the 2-steps-deeper fixed search's; never a lower recall than
// the fixed search. `device` builds and searches.
inline void ExpectUnsettledQueriesGoDeeper(Device device) {
    const int k = 10;
    double deeper_easy = 0, deeper_hard = 0;
    int deeper = 0, total = 0;
    for (int kind = 0; kind < 5; ++kind) {
        for (const std::string codec : {"pq", "residual"}) {
            const CertifyCorpus c = MakeCertifyCorpus(kind, 31u + uint32_t(kind));
            const std::string where = c.name + " " + codec;
            std::unique_ptr<Searcher> s;
            ASSERT_NO_FATAL_FAILURE(OpenCorpusIndex(
                c, codec, device, ScratchDir("tms_adaptive").string() + "/" + std::to_string(kind) + codec, &s));
            const QueryBatch qb{c.queries.data(), DType::kF32, c.nq, c.qt, c.dim, c.qlens.data()};
            SearchOptions fixed;
            fixed.k = k;
            fixed.target_recall = 0;  // these settings
            fixed.nprobe = 2;
            fixed.ncandidates = 128;
            fixed.rerank = 64;
            SearchOptions ranking = fixed;  // the compressed ranking of the documents reranked
            ranking.rerank = 0;
            ranking.k = fixed.rerank;
            SearchOptions deep = fixed;
            for (int st = 0; st < engine::kAdaptiveSteps; ++st) deep = engine::CertifyDeeper(deep, true);
            SearchOptions adaptive = fixed;
            adaptive.target_recall = 0.99;  // the values set are kept; unsettled queries 2 steps deeper
            SearchOptions ex = fixed;
            ex.exhaustive = true;
            std::vector<std::vector<SearchHit>> truth, base, ranked, deeper_res, got;
            SearchTimings t;
            ASSERT_TRUE(s->Search(qb, ex, &truth, &t).ok());
            ASSERT_TRUE(s->Search(qb, fixed, &base, &t).ok());
            EXPECT_TRUE(t.depth.empty()) << "target_recall 0: the settings as given, for every query";
            ASSERT_TRUE(s->Search(qb, ranking, &ranked, &t).ok());
            ASSERT_TRUE(s->Search(qb, deep, &deeper_res, &t).ok());
            ASSERT_TRUE(s->Search(qb, adaptive, &got, &t).ok());
            ASSERT_EQ(s->Plan(adaptive).nprobe, 2) << "the caller's settings are kept";
            ASSERT_EQ(t.depth.size(), size_t(c.nq)) << where;
            EXPECT_TRUE(t.certified.empty()) << "adaptive does not certify";
            const int settled = engine::SettledRanks(k);
            ASSERT_EQ(settled, 16);
            int n_deeper = 0;
            double recall_base = 0, recall_got = 0;
            for (int q = 0; q < c.nq; ++q) {
                const std::string wq = where + " query " + std::to_string(q);
                bool ok = true;
                for (const SearchHit& h : base[size_t(q)]) {
                    const auto& r = ranked[size_t(q)];
                    const auto at = std::find_if(r.begin(), r.end(),
                                                 [&](const SearchHit& x) { return x.internal_id == h.internal_id; });
                    ok = ok && at != r.end() && at - r.begin() < settled;
                }
                EXPECT_EQ(int(t.depth[size_t(q)]), ok ? 0 : engine::kAdaptiveSteps) << wq;
                n_deeper += !ok;
                std::vector<SearchHit> want = base[size_t(q)];
                if (!ok) {
                    for (const SearchHit& h : deeper_res[size_t(q)]) {
                        if (std::none_of(want.begin(), want.end(),
                                         [&](const SearchHit& x) { return x.internal_id == h.internal_id; }))
                            want.push_back(h);
                    }
                    std::sort(want.begin(), want.end(), [](const SearchHit& x, const SearchHit& y) {
                        return x.score != y.score ? x.score > y.score : x.internal_id < y.internal_id;
                    });
                    if (want.size() > size_t(k)) want.resize(size_t(k));
                }
                ExpectSameScores(want, got[size_t(q)], wq);
                const auto hits = [&](const std::vector<SearchHit>& r) {
                    int n = 0;
                    for (const SearchHit& h : r)
                        for (const SearchHit& w : truth[size_t(q)]) n += h.internal_id == w.internal_id;
                    return double(n) / double(std::max<size_t>(1, truth[size_t(q)].size()));
                };
                recall_base += hits(base[size_t(q)]);
                recall_got += hits(got[size_t(q)]);
            }
            EXPECT_GE(recall_got, recall_base - 1e-9) << where << ": the best of both is never worse";
            deeper += n_deeper;
            total += c.nq;
            if (kind == 0) deeper_easy += double(n_deeper) / c.nq;
            if (kind == 1) deeper_hard += double(n_deeper) / c.nq;
            SearchOptions off = adaptive;
            off.adaptive = false;
            ASSERT_TRUE(s->Search(qb, off, &got, &t).ok());
            EXPECT_TRUE(t.depth.empty()) << "adaptive off: every query at the plan";
            off.adaptive = true;
            off.certify_steps = 0;
            ASSERT_TRUE(s->Search(qb, off, &got, &t).ok());
            for (int q = 0; q < c.nq; ++q) ExpectSameScores(base[size_t(q)], got[size_t(q)], where + " steps 0");
        }
    }
    EXPECT_GT(deeper, 0) << "some queries of these corpora are not settled";
    EXPECT_LT(deeper, total) << "some are";
    EXPECT_GT(deeper_hard, deeper_easy) << "the noise corpus goes deeper more often than the topics one";
}

}  // namespace tms::testing

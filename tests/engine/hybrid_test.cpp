// Copyright TileMaxSim authors. Hybrid search's fusion (engine/hybrid.h) and the FTS5 query a
// search's text becomes (index/metadata/metadata.h), on tables of cases.
#include <gtest/gtest.h>

#include "engine/hybrid.h"
#include "index/metadata/metadata.h"

namespace tms {
namespace {

TEST(HybridCpu, FusionRanksAsDocumented) {
    const engine::Scored maxsim = {{4, 9.f}, {7, 8.f}, {2, 8.f}, {9, 1.f}};  // 2 before 7 (tie: lower id)
    const engine::Scored bm25 = {{7, 3.f}, {5, 2.f}};
    // RRF, equal weights (MaxSim ranks 4, 2, 7, 9): 7 = 0.5/63 + 0.5/61 beats 4 = 0.5/61; 2 and 5
    // tie at 0.5/62 (the lower id first); 9 = 0.5/64.
    engine::Scored f = engine::FuseRankings(maxsim, bm25, Fusion::kRrf, 0.5, 10);
    std::vector<int64_t> ids;
    for (const auto& [d, s] : f) ids.push_back(d);
    EXPECT_EQ(ids, (std::vector<int64_t>{7, 4, 2, 5, 9}));
    EXPECT_NEAR(f[0].second, 0.5 / 63 + 0.5 / 61, 1e-6);
    // Weight 0 on BM25: MaxSim's order, BM25-only documents left out; weight 1: BM25's.
    ids.clear();
    for (const auto& [d, s] : engine::FuseRankings(maxsim, bm25, Fusion::kRrf, 0.0, 10)) ids.push_back(d);
    EXPECT_EQ(ids, (std::vector<int64_t>{4, 2, 7, 9}));
    ids.clear();
    for (const auto& [d, s] : engine::FuseRankings(maxsim, bm25, Fusion::kWeighted, 1.0, 10)) ids.push_back(d);
    EXPECT_EQ(ids, (std::vector<int64_t>{7, 5}));
    // Weighted: min-max scaled, 0.25 / 0.75: 7 = 0.25 * 7/8 + 0.75 * 1, 4 = 0.25, 5 = 0.
    f = engine::FuseRankings(maxsim, bm25, Fusion::kWeighted, 0.75, 2);
    ASSERT_EQ(f.size(), 2u);
    EXPECT_EQ(f[0].first, 7);
    EXPECT_NEAR(f[0].second, 0.25 * 7.0 / 8.0 + 0.75, 1e-6);
    EXPECT_EQ(f[1].first, 4);
    EXPECT_NEAR(f[1].second, 0.25, 1e-6);
    // Equal scores scale to 1; empty rankings fuse to nothing.
    f = engine::FuseRankings({{3, 2.f}, {1, 2.f}}, {}, Fusion::kWeighted, 0.5, 5);
    ASSERT_EQ(f.size(), 2u);
    EXPECT_EQ(f[0].first, 1);
    EXPECT_NEAR(f[0].second, 0.5, 1e-6);
    EXPECT_TRUE(engine::FuseRankings({}, {}, Fusion::kRrf, 0.5, 5).empty());
}

TEST(HybridCpu, TextBecomesAnFts5QueryOfItsWords) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"what is maxsim?", "\"what\" OR \"is\" OR \"maxsim?\""},
        {"  late\tinteraction\n", "\"late\" OR \"interaction\""},
        {"say \"hi\" NEAR(a b)", "\"say\" OR \"\"\"hi\"\"\" OR \"NEAR(a\" OR \"b)\""},
        {"?? !! --", ""},
        {"", ""},
        {"caf\xc3\xa9 *", "\"caf\xc3\xa9\""},
    };
    for (const auto& [text, want] : cases) EXPECT_EQ(index::FtsQuery(text), want) << text;
}

}  // namespace
}  // namespace tms

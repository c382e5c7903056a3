// Copyright TileMaxSim authors. Searcher::Refresh: a searcher refreshed after adds, replaces and
// deletes (its loaded documents shared, the added ones placed as segments of their own)
// searches as a searcher opened at that moment does, round after round; the searcher it came
// from is unchanged; after a compaction the refresh opens the index whole. Shared by the CPU and
// the GPU test.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "index/ingest/npy.h"
#include "tests/engine/synth_index.h"
#include "tests/engine/vector_tiers.h"
#include "tilemaxsim/tilemaxsim.h"
#include "tools/lib/synth.h"

namespace tms::testing {

/// On `device` with the vectors in `tier`, over an index of `shards` shards.
inline void ExpectRefreshSearchesAsOpened(Device device, VectorTier tier, int shards) {
    namespace fs = std::filesystem;
    SynthOptions so;
    so.n_docs = 500;
    so.n_queries = 16;
    so.dim = 64;
    IndexBuildOptions bo;
    bo.keep_vectors = true;
    bo.progress = false;
    bo.shards = shards;
    bo.chunk_docs = 100;
    const std::string name = std::string("tms_refresh_") + DeviceName(device) + "_" + VectorTierName(tier);
    const fs::path dir = BuildSynthIndex(name, so, bo);
    const std::string path = (dir / "index").string();
    // The documents added: another corpus of the same dimension.
    SynthOptions more = so;
    more.n_docs = 150;
    more.seed = 7;
    ASSERT_TRUE(WriteSynthCorpus(more, (dir / "more").string()).ok());
    HostArray qa, ma, ml;
    ASSERT_TRUE(LoadNpy((dir / "queries.npy").string(), &qa).ok());
    ASSERT_TRUE(LoadNpy((dir / "more" / "docs.npy").string(), &ma).ok());
    ASSERT_TRUE(LoadNpy((dir / "more" / "doclens.npy").string(), &ml).ok());
    std::vector<int64_t> lens;
    ASSERT_TRUE(IntegersFromArray(ml, "doclens", &lens).ok());
    std::vector<int64_t> off(1, 0);
    for (int64_t l : lens) off.push_back(off.back() + l);
    const QueryBatch qb{qa.bytes.data(), DType::kF16, int(qa.shape[0]), int(qa.shape[1]), int(qa.shape[2]), nullptr};

    SearcherOptions o;
    o.device = device;
    o.progress = false;
    o.vectors = tier;
    // The default search, deep cuts under both prunings, exhaustive search, a deep k, and an
    // allow set over the documents as they will be (every third of 1,000); the filter (on the
    // added documents' metadata) is added once there is metadata.
    const std::vector<SearchOptions> cuts = CutSettings(40, 20);
    std::vector<SearchOptions> settings = {cuts[0], cuts[2], cuts[4], cuts[8]};
    settings.emplace_back().exhaustive = true;
    settings.emplace_back().k = 60;
    auto allow = std::make_shared<DocSet>(1000);
    for (int64_t d = 0; d < 1000; d += 3) allow->Add(0, d);
    settings.emplace_back().allow = allow;
    SearchOptions filtered;
    filtered.filter = "grp = 1";
    const auto search_all = [&](const Searcher& s, bool with_filter,
                                std::vector<std::vector<std::vector<SearchHit>>>* out) {
        out->clear();
        std::vector<SearchOptions> all = settings;
        if (with_filter) all.push_back(filtered);
        for (const SearchOptions& so2 : all) {
            const Status st = s.Search(qb, so2, &out->emplace_back());
            ASSERT_TRUE(st.ok()) << st.ToString();
        }
    };
    const auto expect_as_opened = [&](const Searcher& refreshed, bool with_filter, const std::string& what) {
        std::unique_ptr<Searcher> fresh;
        ASSERT_TRUE(Searcher::Open(o, path, &fresh).ok());
        EXPECT_EQ(refreshed.info().n_docs, fresh->info().n_docs) << what;
        EXPECT_EQ(refreshed.info().n_tokens, fresh->info().n_tokens) << what;
        EXPECT_EQ(refreshed.info().n_deleted, fresh->info().n_deleted) << what;
        EXPECT_EQ(refreshed.info().metadata_rows, fresh->info().metadata_rows) << what;
        ASSERT_EQ(refreshed.placement().size(), fresh->placement().size()) << what;
        for (size_t i = 0; i < fresh->placement().size(); ++i) {
            EXPECT_EQ(refreshed.placement()[i].n_docs, fresh->placement()[i].n_docs) << what;
            EXPECT_EQ(refreshed.placement()[i].vectors, fresh->placement()[i].vectors) << what;
        }
        std::vector<std::vector<std::vector<SearchHit>>> want, got;
        ASSERT_NO_FATAL_FAILURE(search_all(*fresh, with_filter, &want));
        ASSERT_NO_FATAL_FAILURE(search_all(refreshed, with_filter, &got));
        for (size_t i = 0; i < want.size(); ++i)
            ExpectSameHits(want[i], got[i], what + ", setting " + std::to_string(i), 1e-4f);
        // Ids, exact reranks of every document.
        std::vector<std::string> ids;
        for (int d = 0; d < 500; d += 25) ids.push_back(std::to_string(d));
        for (int d = 0; d < 150; d += 7) ids.push_back("new" + std::to_string(d));
        std::vector<int64_t> a, b;
        fresh->FindDocs(ids, &a);
        refreshed.FindDocs(ids, &b);
        EXPECT_EQ(a, b) << what;
        std::vector<std::vector<int64_t>> cand(size_t(qb.n_queries));
        for (auto& c : cand)
            for (int64_t d = 0; d < fresh->info().n_docs; d += 5) c.push_back(d);
        std::vector<std::vector<SearchHit>> rw, rg;
        ASSERT_TRUE(fresh->Rerank(qb, cand, 10, &rw).ok());
        ASSERT_TRUE(refreshed.Rerank(qb, cand, 10, &rg).ok());
        ExpectSameHits(rw, rg, what + ", rerank", 1e-4f);
    };

    std::unique_ptr<Searcher> first;
    ASSERT_TRUE(Searcher::Open(o, path, &first).ok());
    std::vector<std::vector<std::vector<SearchHit>>> before;
    ASSERT_NO_FATAL_FAILURE(search_all(*first, false, &before));

    std::unique_ptr<IndexUpdater> u;
    ASSERT_TRUE(IndexUpdater::Open(path, false, &u).ok());
    int next = 0;  // the next document of `more` to add
    // Adds n documents of `more` as "new<i>" (with metadata: grp = i % 3), or, with `as`, under
    // those ids (replacing them).
    const auto add = [&](int n, std::vector<std::string> as = {}) {
        const bool replace = !as.empty();
        DocMetadata md;
        std::vector<int64_t> l;
        for (int i = 0; i < n; ++i, ++next) {
            if (!replace) as.push_back("new" + std::to_string(next));
            md.objects.push_back("{\"grp\": " + std::to_string(next % 3) + "}");
            l.push_back(lens[size_t(next)]);
        }
        const int64_t t0 = off[size_t(next - n)], t1 = off[size_t(next)];
        const EmbeddingView v{static_cast<const uint16_t*>(static_cast<const void*>(ma.bytes.data())) + t0 * so.dim,
                              DType::kF16, t1 - t0, so.dim};
        const Status st = u->Add(v, l, as, replace, &md);
        ASSERT_TRUE(st.ok()) << st.ToString();
    };
    // Round 1: 37 documents added (the first metadata), base documents of every shard deleted.
    ASSERT_NO_FATAL_FAILURE(add(37));
    std::vector<std::string> gone;
    for (int d = 1; d < 500; d += 31) gone.push_back(std::to_string(d));
    ASSERT_TRUE(u->Delete(gone).ok());
    ASSERT_TRUE(u->Commit().ok());
    std::unique_ptr<Searcher> cur;
    bool whole = true;
    ASSERT_TRUE(first->Refresh(&cur, &whole).ok());
    EXPECT_FALSE(whole);
    ASSERT_NO_FATAL_FAILURE(expect_as_opened(*cur, true, "round 1"));
    // Rounds 2..6: a few adds, a replace of an added and of a base document, deletes of added
    // ones; the added segments merge as they go (round 3's absorbs round 2's). Round 5 changes
    // nothing.
    for (int round = 2; round <= 6; ++round) {
        if (round != 5) ASSERT_NO_FATAL_FAILURE(add(1 + round % 4));
        if (round % 3 == 0)
            ASSERT_NO_FATAL_FAILURE(add(2, {"new" + std::to_string(round + 20), std::to_string(round * 7)}));
        if (round % 2 == 0) ASSERT_TRUE(u->Delete({"new" + std::to_string(round * 2 + 1)}).ok());
        ASSERT_TRUE(u->Commit().ok());
        std::unique_ptr<Searcher> nxt;
        ASSERT_TRUE(cur->Refresh(&nxt, &whole).ok());
        EXPECT_FALSE(whole);
        ASSERT_NO_FATAL_FAILURE(expect_as_opened(*nxt, true, "round " + std::to_string(round)));
        cur = std::move(nxt);
    }
    // The searcher refreshed from is as it was.
    std::vector<std::vector<std::vector<SearchHit>>> after;
    ASSERT_NO_FATAL_FAILURE(search_all(*first, false, &after));
    for (size_t i = 0; i < before.size(); ++i) ExpectSameHits(before[i], after[i], "the first searcher");
    // A compaction rewrites the stores: the refresh opens the index whole.
    u.reset();
    ASSERT_TRUE(CompactIndex(path, false).ok());
    std::unique_ptr<Searcher> compacted;
    ASSERT_TRUE(cur->Refresh(&compacted, &whole).ok());
    EXPECT_TRUE(whole);
    ASSERT_NO_FATAL_FAILURE(expect_as_opened(*compacted, true, "after compaction"));
}

}  // namespace tms::testing

// Copyright TileMaxSim authors. Vector tiers (SearcherOptions::vectors): a searcher whose vectors
// are in host memory or on disk returns what one holding them where it scores returns, shared
// by the CPU and the GPU test.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/engine/synth_index.h"
#include "index/ingest/npy.h"
#include "tools/lib/synth.h"
#include "tilemaxsim/tilemaxsim.h"

namespace tms::testing {

/// Results equal hit for hit: the same documents in the same order, scores within `tol`.
inline void ExpectSameHits(const std::vector<std::vector<SearchHit>>& want,
                           const std::vector<std::vector<SearchHit>>& got, const std::string& what, float tol = 0.0f) {
    ASSERT_EQ(want.size(), got.size()) << what;
    for (size_t q = 0; q < want.size(); ++q) {
        ASSERT_EQ(want[q].size(), got[q].size()) << what << ": query " << q;
        for (size_t j = 0; j < want[q].size(); ++j) {
            EXPECT_EQ(want[q][j].internal_id, got[q][j].internal_id) << what << ": query " << q << " rank " << j;
            EXPECT_NEAR(want[q][j].score, got[q][j].score, tol) << what << ": query " << q << " rank " << j;
        }
    }
}

/// On `device`, over a 2-shard index with deletions: every tier in `tiers` gives the results of
/// `reference` (the default search, deep reranks, exhaustive search at k 10 and past the GPU's
/// top-k limit, with an allow set), exhaustive search streamed in many small steps; each reports
/// itself in placement(); a damaged vectors file fails a disk-tier search in one line naming it.
inline void ExpectTiersAgree(Device device, VectorTier reference, const std::vector<VectorTier>& tiers) {
    namespace fs = std::filesystem;
    SynthOptions so;
    so.n_docs = 2500;
    so.n_queries = 24;
    so.dim = 64;
    IndexBuildOptions bo;
    bo.keep_vectors = true;
    bo.progress = false;
    bo.shards = 2;
    bo.chunk_docs = 200;  // several chunks (checksums) per vectors file
    const fs::path dir = BuildSynthIndex(std::string("tms_tiers_") + DeviceName(device), so, bo);
    const std::string path = (dir / "index").string();
    {
        std::unique_ptr<IndexUpdater> u;
        ASSERT_TRUE(IndexUpdater::Open(path, false, &u).ok());
        std::vector<std::string> gone;
        for (int d = 3; d < 2500; d += 97) gone.push_back(std::to_string(d));
        ASSERT_TRUE(u->Delete(gone).ok());
        ASSERT_TRUE(u->Commit().ok());
    }
    HostArray qa;
    ASSERT_TRUE(LoadNpy((dir / "queries.npy").string(), &qa).ok());
    const QueryBatch qb{qa.bytes.data(), DType::kF16, int(qa.shape[0]), int(qa.shape[1]), int(qa.shape[2]), nullptr};

    auto open = [&](VectorTier t, const std::string& p, std::unique_ptr<Searcher>* s) {
        SearcherOptions o;
        o.device = device;
        o.progress = false;
        o.vectors = t;
        o.stream_bytes = 64 * 1024;  // ~5 documents of 100 tokens a step
        const Status st = Searcher::Open(o, p, s);
        ASSERT_TRUE(st.ok()) << VectorTierName(t) << ": " << st.ToString();
        for (const ShardPlacement& pl : (*s)->placement()) {
            EXPECT_EQ(pl.vectors, t) << VectorTierName(t);
            EXPECT_GT(pl.vector_bytes, 0) << VectorTierName(t);
        }
    };
    std::vector<SearchOptions> settings(4);
    settings[1].rerank = 1000;
    settings[1].ncandidates = 2000;
    settings[2].exhaustive = true;
    settings[3].exhaustive = true;
    settings[3].k = 1500;  // past the GPU's top-k (1024): scores, then the host's selection
    SearchOptions allowed;
    allowed.exhaustive = true;
    auto set = std::make_shared<DocSet>(2500);
    for (int d = 0; d < 2500; d += 3) set->Add(0, d);
    allowed.allow = set;
    settings.push_back(allowed);
    SearchOptions allowed_approx;
    allowed_approx.allow = set;
    settings.push_back(allowed_approx);

    std::unique_ptr<Searcher> ref;
    open(reference, path, &ref);
    std::vector<std::vector<std::vector<SearchHit>>> want(settings.size());
    for (size_t i = 0; i < settings.size(); ++i) {
        const Status st = ref->Search(qb, settings[i], &want[i]);
        ASSERT_TRUE(st.ok()) << "setting " << i << ": " << st.ToString();
        ASSERT_FALSE(want[i][0].empty()) << "setting " << i;
    }
    ref.reset();
    for (VectorTier t : tiers) {
        std::unique_ptr<Searcher> s;
        open(t, path, &s);
        for (size_t i = 0; i < settings.size(); ++i) {
            std::vector<std::vector<SearchHit>> got;
            const Status st = s->Search(qb, settings[i], &got);
            ASSERT_TRUE(st.ok()) << VectorTierName(t) << " setting " << i << ": " << st.ToString();
            ExpectSameHits(want[i], got, std::string(VectorTierName(t)) + " setting " + std::to_string(i), 1e-5f);
        }
        // Rerank-only scoring reads the same rows.
        std::vector<std::vector<int64_t>> cand(size_t(qb.n_queries), std::vector<int64_t>{1, 7, 1200, 2499});
        std::vector<std::vector<SearchHit>> a, b;
        ASSERT_TRUE(s->Rerank(qb, cand, 0, &a).ok()) << VectorTierName(t);
        open(reference, path, &ref);
        ASSERT_TRUE(ref->Rerank(qb, cand, 0, &b).ok());
        ref.reset();
        ExpectSameHits(b, a, std::string(VectorTierName(t)) + " rerank", 1e-5f);
    }

    // A damaged vectors file: opening on disk reads none of it; the first search that reads the
    // damaged chunk fails naming the file, and so does every later one.
    const fs::path bad = dir / "damaged";
    fs::remove_all(bad);
    fs::copy(path, bad, fs::copy_options::recursive);
    fs::path vf;
    for (const auto& e : fs::recursive_directory_iterator(bad))
        if (e.path().filename() == "vectors.f16") vf = e.path();
    ASSERT_FALSE(vf.empty());
    {
        std::fstream f(vf, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(4096);
        f.put(char(0x5a));
    }
    std::unique_ptr<Searcher> s;
    SearcherOptions o;
    o.device = device;
    o.progress = false;
    o.vectors = VectorTier::kDisk;
    o.warm_up = false;  // a GPU's warm-up search would read the damaged chunk already
    const Status opened = Searcher::Open(o, bad.string(), &s);
    ASSERT_TRUE(opened.ok()) << opened.ToString();
    for (int round = 0; round < 2; ++round) {
        std::vector<std::vector<SearchHit>> got;
        const Status st = s->Search(qb, settings[2], &got);
        ASSERT_FALSE(st.ok()) << "round " << round;
        EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
        EXPECT_NE(st.message().find(vf.string()), std::string::npos) << st.ToString();
        EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.ToString();
    }
    if (device == Device::kGpu) {
        // For the GPU the vectors are read and checked while they upload: the open fails.
        o.vectors = VectorTier::kGpu;
        const Status st = Searcher::Open(o, bad.string(), &s);
        EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
        EXPECT_NE(st.message().find(vf.string()), std::string::npos) << st.ToString();
    }
}

}  // namespace tms::testing

// Copyright TileMaxSim authors. BM25 and hybrid search (SearchOptions::mode) on a device: hybrid at
// BM25 weight 0 (exhaustive MaxSim half) ranks as exhaustive MaxSim, at weight 1 as BM25 alone;
// every mode agrees with the CPU searcher's; deleted documents and filters bind both halves.
// Shared by the CPU and the GPU test.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "index/ingest/npy.h"
#include "tests/engine/synth_index.h"
#include "tilemaxsim/tilemaxsim.h"
#include "tools/lib/synth.h"

namespace tms::testing {

inline std::vector<std::vector<std::string>> HitIds(const std::vector<std::vector<SearchHit>>& r) {
    std::vector<std::vector<std::string>> out;
    for (const auto& hits : r) {
        out.emplace_back();
        for (const SearchHit& h : hits) out.back().push_back(h.doc_id);
    }
    return out;
}

inline void ExpectTextSearchAgrees(Device device) {
    namespace fs = std::filesystem;
    const std::vector<std::string> words = {"maxsim", "token", "vector",  "search", "index",   "query",
                                            "engine", "gpu",   "recall",  "hybrid", "rank",    "shard",
                                            "probe",  "plaid", "colbert", "kernel", "lexical", "fusion"};
    std::mt19937 rng(3);
    const auto text = [&](int n) {
        std::string t;
        for (int i = 0; i < n; ++i) t += (i ? " " : "") + words[rng() % words.size()];
        return t;
    };
    SynthOptions so;
    so.n_docs = 600;
    so.n_queries = 12;
    so.dim = 64;
    const fs::path dir = ScratchDir(std::string("tms_text_") + DeviceName(device));
    ASSERT_TRUE(WriteSynthCorpus(so, dir.string()).ok());
    DocMetadata md;
    for (int d = 0; d < so.n_docs; ++d)
        md.objects.push_back("{\"text\": \"" + text(4 + d % 9) + "\", \"g\": " + std::to_string(d % 2) + "}");
    IndexBuildOptions bo;
    bo.keep_vectors = true;
    bo.progress = false;
    bo.text_field = "text";
    const std::string path = (dir / "index").string();
    {
        std::unique_ptr<IndexBuilder> b;
        ASSERT_TRUE(IndexBuilder::Create(bo, path, &b).ok());
        const Status st =
            b->BuildFromFiles((dir / "docs.npy").string(), (dir / "doclens.npy").string(), "", nullptr, &md);
        ASSERT_TRUE(st.ok()) << st.ToString();
        std::unique_ptr<IndexUpdater> u;
        ASSERT_TRUE(IndexUpdater::Open(path, false, &u).ok());
        ASSERT_TRUE(u->Delete({"3", "10", "77"}).ok());
        ASSERT_TRUE(u->Commit().ok());
    }
    HostArray qa;
    ASSERT_TRUE(LoadNpy((dir / "queries.npy").string(), &qa).ok());
    const QueryBatch qb{qa.bytes.data(), DType::kF16, int(qa.shape[0]), int(qa.shape[1]), int(qa.shape[2]), nullptr};
    auto texts = std::make_shared<std::vector<std::string>>();
    for (int i = 0; i < qb.n_queries; ++i) texts->push_back(text(2 + i % 3));
    std::unique_ptr<Searcher> s, cpu;
    SearcherOptions o;
    o.device = device;
    o.progress = false;
    ASSERT_TRUE(Searcher::Open(o, path, &s).ok());
    o.device = Device::kCpu;
    ASSERT_TRUE(Searcher::Open(o, path, &cpu).ok());
    const auto run = [&](const Searcher& on, SearchOptions opts) {
        opts.query_texts = texts;
        std::vector<std::vector<SearchHit>> r;
        const Status st = on.Search(qb, opts, &r);
        EXPECT_TRUE(st.ok()) << st.ToString();
        return r;
    };
    SearchOptions exh;
    exh.exhaustive = true;
    exh.k = 10;
    SearchOptions bm25 = exh;
    bm25.mode = SearchMode::kBm25;
    SearchOptions only_maxsim = exh;
    only_maxsim.mode = SearchMode::kHybrid;
    only_maxsim.bm25_weight = 0;
    SearchOptions only_bm25 = only_maxsim;
    only_bm25.bm25_weight = 1;
    EXPECT_EQ(HitIds(run(*s, only_maxsim)), HitIds(run(*s, exh)));
    EXPECT_EQ(HitIds(run(*s, only_bm25)), HitIds(run(*s, bm25)));
    SearchOptions mixed;
    mixed.mode = SearchMode::kHybrid;
    SearchOptions weighted = mixed;
    weighted.fusion = Fusion::kWeighted;
    weighted.bm25_weight = 0.3;
    SearchOptions filtered = mixed;
    filtered.filter = "g = 1";
    for (const SearchOptions& opts : {bm25, mixed, weighted, filtered}) {
        const auto got = run(*s, opts);
        EXPECT_EQ(HitIds(got), HitIds(run(*cpu, opts))) << SearchModeName(opts.mode) << " " << FusionName(opts.fusion);
        for (const auto& hits : got) {
            for (const SearchHit& h : hits) {
                EXPECT_TRUE(h.doc_id != "3" && h.doc_id != "10" && h.doc_id != "77") << "a deleted document";
                if (!opts.filter.empty()) EXPECT_EQ(std::stoi(h.doc_id) % 2, 1) << h.doc_id;
            }
        }
    }
    // Errors: texts that do not match the queries; an index without text.
    SearchOptions bad = bm25;
    bad.query_texts = std::make_shared<std::vector<std::string>>(2, "maxsim");
    std::vector<std::vector<SearchHit>> r;
    EXPECT_EQ(s->Search(qb, bad, &r).code(), Status::Code::kInvalidArgument);
}

}  // namespace tms::testing

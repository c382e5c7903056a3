// Copyright TileMaxSim authors. Searcher::Explain: per query token the best document token and its
// similarity, summing to the hit's score (the stored vectors: exhaustive search's score; the codes
// of an index without vectors: the compressed score), every token position valid and every
// similarity the maximum over the document's tokens. Shared by the CPU and the GPU test.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "index/ingest/npy.h"
#include "kernels/maxsim.h"
#include "tests/engine/synth_index.h"
#include "tilemaxsim/tilemaxsim.h"
#include "tools/lib/synth.h"

namespace tms::testing {

/// On `device`, vectors in `tier` (kNone: an index without vectors, explained from its codes).
inline void ExpectExplanationsSumToScores(Device device, VectorTier tier) {
    namespace fs = std::filesystem;
    SynthOptions so;
    so.n_docs = 400;
    so.n_queries = 6;
    so.dim = 64;
    IndexBuildOptions bo;
    bo.keep_vectors = tier != VectorTier::kNone;
    bo.progress = false;
    const fs::path dir =
        BuildSynthIndex(std::string("tms_explain_") + DeviceName(device) + "_" + VectorTierName(tier), so, bo);
    const std::string path = (dir / "index").string();
    HostArray qa;
    ASSERT_TRUE(LoadNpy((dir / "queries.npy").string(), &qa).ok());
    std::vector<int32_t> lens(size_t(qa.shape[0]));
    for (size_t i = 0; i < lens.size(); ++i) lens[i] = int32_t(qa.shape[1]) - int32_t(i % 3);  // ragged
    const QueryBatch qb{qa.bytes.data(),  DType::kF16,      int(qa.shape[0]),
                        int(qa.shape[1]), int(qa.shape[2]), lens.data()};
    SearcherOptions o;
    o.device = device;
    o.progress = false;
    o.vectors = tier == VectorTier::kNone ? VectorTier::kAuto : tier;
    std::unique_ptr<Searcher> s;
    ASSERT_TRUE(Searcher::Open(o, path, &s).ok());
    SearchOptions opts;
    opts.k = 8;
    opts.exhaustive = tier != VectorTier::kNone;
    opts.target_recall = 0;
    opts.rerank = 0;  // without vectors: the compressed scores
    std::vector<std::vector<SearchHit>> hits;
    ASSERT_TRUE(s->Search(qb, opts, &hits).ok());
    std::vector<std::vector<int64_t>> docs(hits.size());
    for (size_t i = 0; i < hits.size(); ++i)
        for (const SearchHit& h : hits[i]) docs[i].push_back(h.internal_id);
    std::vector<std::vector<Explanation>> ex;
    const Status st = s->Explain(qb, docs, &ex);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_EQ(ex.size(), hits.size());
    const bool readable =
        tier == VectorTier::kHost || tier == VectorTier::kDisk || (device == Device::kCpu && tier != VectorTier::kNone);
    std::vector<std::vector<uint16_t>> rows;
    for (size_t i = 0; i < hits.size(); ++i) {
        ASSERT_EQ(ex[i].size(), hits[i].size());
        for (size_t j = 0; j < hits[i].size(); ++j) {
            const Explanation& e = ex[i][j];
            EXPECT_EQ(e.doc, hits[i][j].internal_id);
            EXPECT_EQ(e.from_codes, !readable);
            ASSERT_EQ(e.doc_tokens.size(), size_t(lens[i]));
            ASSERT_EQ(e.similarities.size(), size_t(lens[i]));
            double sum = 0;
            for (float x : e.similarities) sum += x;
            EXPECT_NEAR(e.score, sum, 1e-4);
            // The hit's score: exact MaxSim over fp16 vectors, or the compressed score.
            EXPECT_NEAR(e.score, hits[i][j].score, readable ? 2e-3 : 2e-2) << "query " << i << " rank " << j;
            if (!readable) continue;
            ASSERT_TRUE(s->DocumentVectors({e.doc}, &rows).ok());
            const int dim = qb.dim;
            const int64_t n = int64_t(rows[0].size()) / dim;
            for (int t = 0; t < lens[i]; ++t) {
                ASSERT_GE(e.doc_tokens[size_t(t)], 0);
                ASSERT_LT(e.doc_tokens[size_t(t)], n);
                const auto* q = static_cast<const uint16_t*>(qb.data) + (size_t(i) * qb.q_tokens + t) * dim;
                float best = -INFINITY;
                for (int64_t r = 0; r < n; ++r) {
                    float x = 0;
                    for (int c = 0; c < dim; ++c)
                        x += kernels::half_to_float(q[c]) * kernels::half_to_float(rows[0][size_t(r * dim + c)]);
                    best = std::max(best, x);
                    if (r == e.doc_tokens[size_t(t)]) EXPECT_NEAR(x, e.similarities[size_t(t)], 1e-4);
                }
                EXPECT_NEAR(best, e.similarities[size_t(t)], 1e-4) << "not the maximum";
            }
        }
    }
    // A deleted or unknown document is refused.
    std::vector<std::vector<int64_t>> bad(hits.size());
    bad[0] = {int64_t(so.n_docs)};
    EXPECT_EQ(s->Explain(qb, bad, &ex).code(), Status::Code::kInvalidArgument);
}

}  // namespace tms::testing

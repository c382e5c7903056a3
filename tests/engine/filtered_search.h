// Copyright TileMaxSim authors. Filtered search (SearchOptions::filter and allow) against
// exhaustive search over only the allowed documents, shared by the CPU and the GPU test.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tests/engine/synth_index.h"
#include "index/ingest/npy.h"
#include "tools/lib/synth.h"
#include "tilemaxsim/tilemaxsim.h"

namespace tms::testing {

/// Document d's metadata in the filtered-search corpus: tenant d % 200 (each 0.5% of the
/// documents), year 2000 + d % 25, lang one of three, and a note with quotes and a semicolon on
/// every seventh document (NULL elsewhere).
inline std::string FilterCorpusMetadata(int64_t d) {
    static const char* langs[] = {"en", "de", "fr"};
    return "{\"tenant\": " + std::to_string(d % 200) + ", \"year\": " + std::to_string(2000 + d % 25) +
           ", \"lang\": \"" + langs[d % 3] + "\", \"note\": " +
           (d % 7 == 0 ? std::string("\"it's; a \\\"quote\\\" -- DROP TABLE docs\"") : std::string("null")) + "}";
}

/// recall@k of `got` against `want` (each query's ids), averaged over the queries with any hit
/// in `want`; queries whose `want` is empty must get nothing.
inline double FilteredRecall(const std::vector<std::vector<SearchHit>>& want,
                             const std::vector<std::vector<SearchHit>>& got, const std::string& what) {
    double sum = 0;
    int n = 0;
    for (size_t q = 0; q < want.size(); ++q) {
        if (want[q].empty()) {
            EXPECT_TRUE(got[q].empty()) << what << ": query " << q;
            continue;
        }
        std::set<int64_t> truth;
        for (const auto& h : want[q]) truth.insert(h.internal_id);
        int hit = 0;
        for (const auto& h : got[q]) hit += int(truth.count(h.internal_id));
        sum += double(hit) / double(truth.size());
        ++n;
    }
    return n ? sum / n : 1.0;
}

/// Filtered default search on `device` over an index of `shards` shards: recall@10 >= 0.99
/// against exhaustive search over only the allowed documents, at selectivities 50%, 5%, 0.5%
/// and 10 documents (a filter, one allow set, per-query allow sets, both together), and >= 0.98
/// with a cut to 4k candidates (the second search of poorly pruned queries); every hit
/// allowed; an empty filter result gives empty hits; bad filters are one clear line; values
/// with quotes and semicolons are data.
inline void ExpectFilteredSearchRecall(Device device, int shards) {
    namespace fs = std::filesystem;
    const int64_t n_docs = 4000;
    SynthOptions so;
    so.n_docs = n_docs;
    so.n_queries = 40;
    so.dim = 64;
    IndexBuildOptions bo;
    bo.keep_vectors = true;
    bo.progress = false;
    bo.shards = shards;
    const fs::path dir = ScratchDir("tms_filtered_" + std::string(DeviceName(device)) + "_" + std::to_string(shards));
    ASSERT_TRUE(WriteSynthCorpus(so, dir.string()).ok());
    DocMetadata meta;
    for (int64_t d = 0; d < n_docs; ++d) meta.objects.push_back(FilterCorpusMetadata(d));
    {
        std::unique_ptr<IndexBuilder> b;
        ASSERT_TRUE(IndexBuilder::Create(bo, (dir / "index").string(), &b).ok());
        const Status st =
            b->BuildFromFiles((dir / "docs.npy").string(), (dir / "doclens.npy").string(), "", nullptr, &meta);
        ASSERT_TRUE(st.ok()) << st.ToString();
    }
    SearcherOptions sopt;
    sopt.device = device;
    sopt.progress = false;
    std::unique_ptr<Searcher> s;
    ASSERT_TRUE(Searcher::Open(sopt, (dir / "index").string(), &s).ok());
    HostArray qa;
    ASSERT_TRUE(LoadNpy((dir / "queries.npy").string(), &qa).ok());
    const QueryBatch qb{qa.bytes.data(), DType::kF16, int(qa.shape[0]), int(qa.shape[1]), int(qa.shape[2]), nullptr};
    const int nq = qb.n_queries;

    // The exact top-k over every document: the truth of each filter is its allowed part of it.
    SearchOptions all;
    all.exhaustive = true;
    all.k = int(n_docs);
    std::vector<std::vector<SearchHit>> everything;
    ASSERT_TRUE(s->Search(qb, all, &everything).ok());
    auto truth = [&](const DocSet& set) {
        std::vector<std::vector<SearchHit>> out(static_cast<size_t>(nq));
        for (int q = 0; q < nq; ++q) {
            for (const SearchHit& h : everything[size_t(q)]) {
                if (out[size_t(q)].size() < 10 && set.Has(set.rows == 1 ? 0 : q, h.internal_id)) {
                    out[size_t(q)].push_back(h);
                }
            }
        }
        return out;
    };
    auto expect_allowed = [&](const std::vector<std::vector<SearchHit>>& r, const DocSet& set,
                              const std::string& what) {
        for (int q = 0; q < nq; ++q)
            for (const SearchHit& h : r[size_t(q)])
                ASSERT_TRUE(set.Has(set.rows == 1 ? 0 : q, h.internal_id))
                    << what << ": query " << q << " got " << h.doc_id;
    };
    // Checks one filtered search (exhaustive and default) against the truth; returns the default's recall.
    auto check = [&](const SearchOptions& filtered, const DocSet& set, const std::string& what) {
        SearchOptions exh = filtered;
        exh.exhaustive = true;
        std::vector<std::vector<SearchHit>> e, a;
        Status st = s->Search(qb, exh, &e);
        EXPECT_TRUE(st.ok()) << what << ": " << st.ToString();
        st = s->Search(qb, filtered, &a);
        EXPECT_TRUE(st.ok()) << what << ": " << st.ToString();
        if (!st.ok()) return 0.0;
        const auto want = truth(set);
        for (int q = 0; q < nq; ++q) {  // exhaustive filtered search is the exact filtered top-10
            EXPECT_EQ(e[size_t(q)].size(), want[size_t(q)].size()) << what << ": query " << q;
            for (size_t j = 0; j < std::min(e[size_t(q)].size(), want[size_t(q)].size()); ++j)
                EXPECT_EQ(e[size_t(q)][j].internal_id, want[size_t(q)][j].internal_id) << what << ": query " << q;
        }
        expect_allowed(a, set, what);
        const double r = FilteredRecall(want, a, what);
        EXPECT_GE(r, 0.99) << what;
        // The same with every query that may probe doing so (direct_max 0: only queries allowed
        // no more than the search keeps score their documents directly).
        SearchOptions probing = filtered;
        probing.direct_max = 0;
        st = s->Search(qb, probing, &a);
        EXPECT_TRUE(st.ok()) << what << " (probing): " << st.ToString();
        if (!st.ok()) return r;
        expect_allowed(a, set, what + " (probing)");
        EXPECT_GE(FilteredRecall(want, a, what + " (probing)"), 0.99) << what << " (probing)";
        // A cut to 4k candidates drops some of the best documents of a filtered query left few
        // of its topic (on this corpus, without a second search: 0.965 for the 50% filter,
        // 0.70 for "allow and filter"; unfiltered, 1.0). A query whose top k holds a document
        // its pruning ranked past its best 2k (here half of the candidates) is searched again
        // without the cut.
        SearchOptions tight = probing;
        tight.ncandidates = 4 * tight.k;
        st = s->Search(qb, tight, &a);
        EXPECT_TRUE(st.ok()) << what << " (4k candidates): " << st.ToString();
        if (!st.ok()) return r;
        expect_allowed(a, set, what + " (4k candidates)");
        EXPECT_GE(FilteredRecall(want, a, what + " (4k candidates)"), 0.98) << what << " (4k candidates)";
        return r;
    };

    // Filters of 50%, 5% and 0.5% of the documents, and one of 10 documents through `allow`.
    int64_t tenant_seven = 0, quoted = 0;
    for (int64_t d = 0; d < n_docs; ++d) {
        tenant_seven += d % 200 == 7;
        quoted += d % 7 == 0;
    }
    for (const auto& [expr, share] : {std::pair<std::string, double>{"tenant < 100", 0.5},
                                      {"tenant >= 190 AND lang IN ('en', 'de', 'fr')", 0.05},
                                      {"tenant = 7", 0.005}}) {
        DocSet set;
        const Status st = s->Filter(expr, &set);
        ASSERT_TRUE(st.ok()) << expr << ": " << st.ToString();
        ASSERT_EQ(set.n_docs, n_docs);
        EXPECT_EQ(set.Count(0), int64_t(share * double(n_docs))) << expr;
        for (int64_t d = 0; d < n_docs; d += 37) {
            const int64_t t = d % 200;
            const bool in = share == 0.5 ? t < 100 : share == 0.05 ? t >= 190 : t == 7;
            EXPECT_EQ(set.Has(0, d), in) << expr << ": document " << d;
        }
        SearchOptions f;
        f.filter = expr;
        check(f, set, "filter " + expr);
    }
    std::mt19937 rng(3);
    auto random_set = [&](int rows, int64_t per_row) {
        auto set = std::make_shared<DocSet>(n_docs, rows);
        for (int r = 0; r < rows; ++r)
            for (int64_t i = 0; i < per_row; ++i) set->Add(r, int64_t(rng() % uint64_t(n_docs)));
        return set;
    };
    {
        SearchOptions f;
        f.allow = random_set(1, 10);
        check(f, *f.allow, "10 allowed documents");
        f.allow = random_set(nq, 200);  // per query: about 5% each, different sets
        check(f, *f.allow, "per-query allow sets");
        f.allow = random_set(1, 2000);
        f.filter = "year < 2010";  // both: about 30% of 60%
        DocSet year, both(n_docs);
        ASSERT_TRUE(s->Filter("year < 2010", &year).ok());
        for (int64_t d = 0; d < n_docs; ++d)
            if (f.allow->Has(0, d) && year.Has(0, d)) both.Add(0, d);
        check(f, both, "allow and filter");
    }
    // Values with quotes, semicolons and comment markers are data.
    {
        DocSet set;
        const Status st = s->Filter("note = 'it''s; a \"quote\" -- DROP TABLE docs'", &set);
        ASSERT_TRUE(st.ok()) << st.ToString();
        EXPECT_EQ(set.Count(0), quoted);
        ASSERT_TRUE(s->Filter("tenant = 7", &set).ok());  // the table is still there
        EXPECT_EQ(set.Count(0), tenant_seven);
    }
    // Nothing allowed: empty hits, not an error (exhaustive and default).
    for (const bool exhaustive : {false, true}) {
        SearchOptions f;
        f.filter = "tenant = -1";
        f.exhaustive = exhaustive;
        std::vector<std::vector<SearchHit>> r;
        const Status st = s->Search(qb, f, &r);
        ASSERT_TRUE(st.ok()) << st.ToString();
        ASSERT_EQ(r.size(), size_t(nq));
        for (const auto& hits : r) EXPECT_TRUE(hits.empty());
    }
    // Bad filters: one line naming the problem; the search fails, nothing crashes.
    for (const auto& [expr, says] : {std::pair<std::string, std::string>{"yeer = 2001", "yeer"},
                                     {"tenant = 7; DROP TABLE docs", ";"},
                                     {"tenant = ", "filter"},
                                     {"(SELECT 1)", "SELECT"}}) {
        SearchOptions f;
        f.filter = expr;
        std::vector<std::vector<SearchHit>> r;
        const Status st = s->Search(qb, f, &r);
        EXPECT_FALSE(st.ok()) << expr;
        EXPECT_NE(st.message().find(says), std::string::npos) << expr << ": " << st.message();
        EXPECT_EQ(st.message().find('\n'), std::string::npos) << expr << ": " << st.message();
    }
    {
        DocSet set;
        const Status st = s->Filter("", &set);
        EXPECT_FALSE(st.ok());
        EXPECT_NE(st.message().find("empty"), std::string::npos) << st.message();
    }
    // An allow set of the wrong shape is refused.
    {
        SearchOptions f;
        f.allow = std::make_shared<DocSet>(n_docs, 3);
        std::vector<std::vector<SearchHit>> r;
        EXPECT_EQ(s->Search(qb, f, &r).code(), Status::Code::kInvalidArgument);
    }
}

}  // namespace tms::testing

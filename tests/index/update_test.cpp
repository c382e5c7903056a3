// Copyright TileMaxSim authors. Updates: add 10%, delete 10%, and the index searches like a
// fresh build of the final set (exhaustive exactly; default within 0.99 of its recall).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>

#include "tests/scratch_dir.h"
#include "index/ingest/files.h"
#include "index/ingest/npy.h"
#include "tools/lib/synth.h"
#include "tilemaxsim/tilemaxsim.h"

namespace tms {
namespace {

namespace fs = std::filesystem;

struct Docs {
    HostArray tokens;  // fp16 [n_tokens, dim]
    std::vector<int64_t> lens, offsets;
    std::vector<std::string> ids;
    int dim = 0;
};

// Rows of the documents in `pick`, concatenated.
void select(const Docs& all, const std::vector<int>& pick, std::vector<uint16_t>* tok, std::vector<int64_t>* lens,
            std::vector<std::string>* ids) {
    const auto* src = reinterpret_cast<const uint16_t*>(all.tokens.bytes.data());
    for (int d : pick) {
        tok->insert(tok->end(), src + all.offsets[d] * all.dim, src + all.offsets[d + 1] * all.dim);
        lens->push_back(all.lens[d]);
        ids->push_back(all.ids[d]);
    }
}

std::vector<std::vector<SearchHit>> search(const std::string& path, const HostArray& q, const SearchOptions& o) {
    std::unique_ptr<Searcher> s;
    SearcherOptions so;
    so.device = Device::kCpu;
    so.progress = false;
    EXPECT_TRUE(Searcher::Open(so, path, &s).ok());
    QueryBatch qb{q.bytes.data(), DType::kF16, int(q.shape[0]), int(q.shape[1]), int(q.shape[2]), nullptr};
    std::vector<std::vector<SearchHit>> r;
    Status st = s->Search(qb, o, &r);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return r;
}

double recall(const std::vector<std::vector<SearchHit>>& got, const std::vector<std::vector<SearchHit>>& truth) {
    double sum = 0;
    for (size_t q = 0; q < truth.size(); ++q) {
        std::set<std::string> t;
        for (const auto& h : truth[q]) t.insert(h.doc_id);
        int hit = 0;
        for (const auto& h : got[q]) hit += t.count(h.doc_id);
        sum += double(hit) / std::max<size_t>(1, t.size());
    }
    return sum / truth.size();
}

TEST(UpdateCpu, AddDeleteEqualsFreshBuild) {
    const std::string dir = testing::ScratchDir("tms_upd").string();
    SynthOptions so;
    so.n_docs = 600;
    so.n_queries = 30;
    so.dim = 64;
    ASSERT_TRUE(WriteSynthCorpus(so, dir).ok());
    Docs all;
    all.dim = 64;
    ASSERT_TRUE(LoadNpy(dir + "/docs.npy", &all.tokens).ok());
    HostArray lens_arr;
    ASSERT_TRUE(LoadNpy(dir + "/doclens.npy", &lens_arr).ok());
    ASSERT_TRUE(IntegersFromArray(lens_arr, "doclens", &all.lens).ok());
    ASSERT_TRUE(ReadLines(dir + "/doc_ids.txt", &all.ids).ok());
    all.offsets.assign(1, 0);
    for (auto l : all.lens) all.offsets.push_back(all.offsets.back() + l);
    HostArray queries;
    ASSERT_TRUE(LoadNpy(dir + "/queries.npy", &queries).ok());

    std::vector<int> base, added, removed, final_set;
    for (int d = 0; d < 540; ++d) base.push_back(d);
    for (int d = 540; d < 600; ++d) added.push_back(d);
    for (int d = 0; d < 540; d += 10) removed.push_back(d);
    for (int d = 0; d < 600; ++d)
        if (d >= 540 || d % 10 != 0) final_set.push_back(d);

    IndexBuildOptions bo;
    bo.keep_vectors = true;
    bo.n_centroids = 64;
    bo.progress = false;
    bo.chunk_docs = 100;
    auto build = [&](const std::vector<int>& pick, const std::string& path) {
        std::vector<uint16_t> tok;
        std::vector<int64_t> lens;
        std::vector<std::string> ids;
        select(all, pick, &tok, &lens, &ids);
        std::unique_ptr<IndexBuilder> b;
        ASSERT_TRUE(IndexBuilder::Create(bo, path, &b).ok());
        EmbeddingView v{tok.data(), DType::kF16, int64_t(tok.size() / 64), 64};
        Status st = b->Build(v, lens, ids);
        ASSERT_TRUE(st.ok()) << st.ToString();
    };
    const std::string upd = dir + "/updated", fresh = dir + "/fresh";
    build(base, upd);
    build(final_set, fresh);

    {
        std::unique_ptr<IndexUpdater> u;
        ASSERT_TRUE(IndexUpdater::Open(upd, false, &u).ok());
        // A second writer is refused while this one holds the index.
        std::unique_ptr<IndexUpdater> second;
        Status st2 = IndexUpdater::Open(upd, false, &second);
        EXPECT_EQ(st2.code(), Status::Code::kIOError) << st2.ToString();
        std::vector<uint16_t> tok;
        std::vector<int64_t> lens;
        std::vector<std::string> ids;
        select(all, added, &tok, &lens, &ids);
        EmbeddingView v{tok.data(), DType::kF16, int64_t(tok.size() / 64), 64};
        ASSERT_TRUE(u->Add(v, lens, ids, false).ok());
        // Existing id without replace: refused, nothing changes.
        std::vector<uint16_t> t1;
        std::vector<int64_t> l1;
        std::vector<std::string> i1;
        select(all, {5}, &t1, &l1, &i1);
        EmbeddingView v1{t1.data(), DType::kF16, int64_t(t1.size() / 64), 64};
        EXPECT_EQ(u->Add(v1, l1, i1, false).code(), Status::Code::kAlreadyExists);
        std::vector<std::string> del;
        for (int d : removed) del.push_back(all.ids[d]);
        EXPECT_EQ(u->Delete({"no-such-doc"}).code(), Status::Code::kNotFound);
        ASSERT_TRUE(u->Delete(del).ok());
        // Before Commit a searcher sees the old index.
        IndexInfo before;
        ASSERT_TRUE(ReadIndexInfo(upd, &before).ok());
        EXPECT_EQ(before.n_docs, 540);
        EXPECT_EQ(before.n_deleted, 0);
        ASSERT_TRUE(u->Commit().ok());
        // Deleted ids again: skipped and counted, in the same session and the next.
        int64_t already = -1;
        ASSERT_TRUE(u->Delete(del, &already).ok());
        EXPECT_EQ(already, int64_t(del.size()));
    }
    {
        std::unique_ptr<IndexUpdater> u2;
        ASSERT_TRUE(IndexUpdater::Open(upd, false, &u2).ok());
        int64_t already = -1;
        ASSERT_TRUE(u2->Delete({all.ids[removed[0]]}, &already).ok());
        EXPECT_EQ(already, 1);
        EXPECT_EQ(u2->Delete({all.ids[removed[0]], "no-such-doc"}).code(), Status::Code::kNotFound);
    }
    IndexInfo after;
    ASSERT_TRUE(ReadIndexInfo(upd, &after).ok());
    EXPECT_EQ(after.n_docs, 600);
    EXPECT_EQ(after.n_deleted, 54);

    SearchOptions exh;
    exh.exhaustive = true;
    exh.k = 20;
    const auto ue = search(upd, queries, exh), fe = search(fresh, queries, exh);
    const std::set<std::string> gone = [&] {
        std::set<std::string> g;
        for (int d : removed) g.insert(all.ids[d]);
        return g;
    }();
    for (size_t q = 0; q < fe.size(); ++q) {
        ASSERT_EQ(ue[q].size(), fe[q].size());
        for (size_t j = 0; j < fe[q].size(); ++j) {
            EXPECT_EQ(ue[q][j].score, fe[q][j].score) << "query " << q << " rank " << j;
            if (j + 1 < fe[q].size() && fe[q][j].score != fe[q][j + 1].score &&
                (j == 0 || fe[q][j - 1].score != fe[q][j].score)) {
                EXPECT_EQ(ue[q][j].doc_id, fe[q][j].doc_id);
            }
            EXPECT_EQ(gone.count(ue[q][j].doc_id), 0u) << "deleted document returned";
        }
    }
    SearchOptions def;
    const auto ud = search(upd, queries, def), fd = search(fresh, queries, def);
    SearchOptions exh10 = exh;
    exh10.k = 10;
    const auto ue10 = search(upd, queries, exh10), fe10 = search(fresh, queries, exh10);
    const double ru = recall(ud, ue10), rf = recall(fd, fe10);
    std::printf("[ updates ] recall@10 vs exhaustive: updated %.4f, fresh %.4f\n", ru, rf);
    EXPECT_GE(ru, 0.99 * rf);
    for (const auto& r : ud)
        for (const auto& h : r) EXPECT_EQ(gone.count(h.doc_id), 0u);

    // Compaction reclaims the tombstones and keeps the results.
    ASSERT_TRUE(CompactIndex(upd, false).ok());
    ASSERT_TRUE(ReadIndexInfo(upd, &after).ok());
    EXPECT_EQ(after.n_docs, 546);
    EXPECT_EQ(after.n_deleted, 0);
    const auto ce = search(upd, queries, exh);
    for (size_t q = 0; q < fe.size(); ++q)
        for (size_t j = 0; j < fe[q].size(); ++j) EXPECT_EQ(ce[q][j].score, fe[q][j].score);
    // Replace: re-adding an existing id with replace keeps one live copy.
    {
        std::unique_ptr<IndexUpdater> u;
        ASSERT_TRUE(IndexUpdater::Open(upd, false, &u).ok());
        std::vector<uint16_t> t1;
        std::vector<int64_t> l1;
        std::vector<std::string> i1;
        select(all, {1}, &t1, &l1, &i1);
        EmbeddingView v1{t1.data(), DType::kF16, int64_t(t1.size() / 64), 64};
        ASSERT_TRUE(u->Add(v1, l1, i1, true).ok());
        ASSERT_TRUE(u->Commit().ok());
        EXPECT_EQ(u->info().n_docs - u->info().n_deleted, 546);
    }
    const auto re = search(upd, queries, exh);
    for (size_t q = 0; q < fe.size(); ++q)
        for (size_t j = 0; j < fe[q].size(); ++j) EXPECT_EQ(re[q][j].score, fe[q][j].score);
}

}  // namespace
}  // namespace tms

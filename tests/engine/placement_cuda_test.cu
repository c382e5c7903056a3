// Copyright TileMaxSim authors. Shards on GPUs: where they are placed does not change results,
// an explicit GPU list is honoured (nothing lands on another GPU), a missing GPU is an error.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <thread>
#include <vector>

#include "engine/cuts.h"
#include "tests/engine/synth_index.h"
#include "tests/kernels/cuda_test_util.h"
#include "index/ingest/npy.h"
#include "tools/lib/synth.h"
#include "tilemaxsim/tilemaxsim.h"

namespace tms {
namespace {

namespace fs = std::filesystem;

struct Fixture {
    fs::path dir;
    HostArray qa;
    SynthOptions so;
    void Build(int shards) {
        so.n_docs = 3000;
        so.n_queries = 40;
        so.dim = 128;
        IndexBuildOptions bo;
        bo.keep_vectors = true;
        bo.progress = false;
        bo.n_centroids = 256;
        bo.shards = shards;
        dir = testing::BuildSynthIndex("tms_placement", so, bo);
        ASSERT_TRUE(LoadNpy((dir / "queries.npy").string(), &qa).ok());
    }
    Status Open(Device d, std::vector<int> gpus, std::unique_ptr<Searcher>* s, bool join_shards = true) {
        SearcherOptions o;
        o.device = d;
        o.gpus = std::move(gpus);
        o.progress = false;
        o.join_shards = join_shards;
        return Searcher::Open(o, (dir / "index").string(), s);
    }
    std::vector<std::vector<SearchHit>> Search(const Searcher& s, bool exhaustive) {
        SearchOptions opts;
        opts.exhaustive = exhaustive;
        return Search(s, opts);
    }
    QueryBatch Queries() const {
        QueryBatch q;
        q.data = qa.bytes.data();
        q.dtype = DType::kF16;
        q.n_queries = int(qa.shape[0]);
        q.q_tokens = int(qa.shape[1]);
        q.dim = so.dim;
        return q;
    }
    std::vector<std::vector<SearchHit>> Search(const Searcher& s, const SearchOptions& opts) {
        std::vector<std::vector<SearchHit>> r;
        Status st = s.Search(Queries(), opts, &r);
        EXPECT_TRUE(st.ok()) << st.ToString();
        return r;
    }
};

void ExpectSameHits(const std::vector<std::vector<SearchHit>>& a, const std::vector<std::vector<SearchHit>>& b,
                    float tol) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t q = 0; q < a.size(); ++q) {
        ASSERT_EQ(a[q].size(), b[q].size()) << q;
        for (size_t j = 0; j < a[q].size(); ++j) {
            EXPECT_EQ(a[q][j].doc_id, b[q][j].doc_id) << q << " " << j;
            EXPECT_NEAR(a[q][j].score, b[q][j].score, tol * std::max(1.f, std::abs(a[q][j].score)));
        }
    }
}

TEST(PlacementCuda, ThreeShardsOnOneGpuEqualCpuAndOneShard) {
    SKIP_WITHOUT_GPU();
    Fixture f;
    f.Build(3);
    std::unique_ptr<Searcher> cpu, gpu;
    ASSERT_TRUE(f.Open(Device::kCpu, {}, &cpu).ok());
    ASSERT_TRUE(f.Open(Device::kGpu, {0}, &gpu).ok());
    ASSERT_EQ(gpu->placement().size(), 3u);
    for (const ShardPlacement& p : gpu->placement()) EXPECT_EQ(p.gpu, 0);
    for (bool ex : {true, false}) ExpectSameHits(f.Search(*cpu, ex), f.Search(*gpu, ex), 1e-3f);
}

// Three shards as three segments on one GPU (join_shards = false: their candidates generated,
// downloaded with their pruning scores, cut on the host, then rescored from the cut lists) give
// exactly what the three as one segment give: the GPU's scores of a document do not depend on
// the lists it is scored in.
TEST(PlacementCuda, SeparateSegmentsOnOneGpuEqualOne) {
    SKIP_WITHOUT_GPU();
    Fixture f;
    f.Build(3);
    std::unique_ptr<Searcher> one, three;
    ASSERT_TRUE(f.Open(Device::kGpu, {0}, &one).ok());
    ASSERT_TRUE(f.Open(Device::kGpu, {0}, &three, /*join_shards=*/false).ok());
    for (const SearchOptions& so : testing::CutSettings(64, 16)) {
        SCOPED_TRACE("ncandidates " + std::to_string(so.ncandidates) + " rerank " + std::to_string(so.rerank) +
                     " pruning " + PruningName(so.pruning));
        ExpectSameHits(f.Search(*one, so), f.Search(*three, so), 0);
    }
}

// A participant alone: its cut keeps the best `keep` of its own keys.
struct AloneCuts final : SearchCuts {
    int64_t docs = 0;
    int centroids = 0;
    int64_t n_docs() const override { return docs; }
    int n_centroids() const override { return centroids; }
    Status Cut(int keep, const Status& mine, const std::vector<std::vector<CutKey>>& best,
               std::vector<CutKey>* cut) override {
        TMS_RETURN_IF_ERROR(mine);
        cut->assign(best.size(), CutKey{-INFINITY, std::numeric_limits<int64_t>::max()});
        for (size_t q = 0; q < best.size(); ++q) {
            if (best[q].size() < size_t(keep)) continue;
            (*cut)[q] = *std::max_element(best[q].begin(), best[q].end(), CutKeyBetter);
        }
        return Status::OK();
    }
};

// One segment searched through the cuts (as an MPI rank with one GPU searches): the lists it
// scores after the cut reuse its candidate generation's device state (GpuCodeScorer::ScoreLists'
// ticket), and give its plain search's results exactly.
TEST(PlacementCuda, CutsOfOneSegmentEqualItsSearch) {
    SKIP_WITHOUT_GPU();
    Fixture f;
    f.Build(3);
    std::unique_ptr<Searcher> one;
    ASSERT_TRUE(f.Open(Device::kGpu, {0}, &one).ok());
    AloneCuts cuts;
    cuts.docs = one->info().n_docs;
    cuts.centroids = one->info().n_centroids;
    const QueryBatch q = f.Queries();
    for (const SearchOptions& so : testing::CutSettings(64, 16)) {
        SCOPED_TRACE("ncandidates " + std::to_string(so.ncandidates) + " rerank " + std::to_string(so.rerank) +
                     " pruning " + PruningName(so.pruning));
        std::vector<std::vector<SearchHit>> got;
        const Status st = SearchWithCuts(one.get(), q, so, &cuts, &got);
        ASSERT_TRUE(st.ok()) << st.ToString();
        ExpectSameHits(f.Search(*one, so), got, 0);
    }
}

// Searches through the cuts (each stage holds the GPU for its own step, so other searches run
// between its stages and replace the device state its candidate generation left: ScoreLists
// then scores the lists it is given) and plain searches (one segment alone: the GPU held from
// the first stage to the last) on one GPU at once, from several threads: each gets the results
// it gets alone.
TEST(PlacementCuda, ConcurrentCutAndPlainSearchesKeepTheirResults) {
    SKIP_WITHOUT_GPU();
    Fixture f;
    f.Build(3);
    std::unique_ptr<Searcher> one;
    ASSERT_TRUE(f.Open(Device::kGpu, {0}, &one).ok());
    AloneCuts cuts;
    cuts.docs = one->info().n_docs;
    cuts.centroids = one->info().n_centroids;
    const QueryBatch q = f.Queries();
    const std::vector<SearchOptions> settings = testing::CutSettings(64, 16);
    std::vector<std::vector<std::vector<SearchHit>>> want;
    for (const SearchOptions& so : settings) want.push_back(f.Search(*one, so));
    constexpr int kThreads = 4, kRounds = 12;
    std::vector<int> mismatches(kThreads, 0), failures(kThreads, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            AloneCuts mine = cuts;  // a participant's cuts are its own
            for (int r = 0; r < kRounds; ++r) {
                const size_t i = size_t(t + r) % settings.size();
                std::vector<std::vector<SearchHit>> got;
                const Status st =
                    t % 2 ? SearchWithCuts(one.get(), q, settings[i], &mine, &got) : one->Search(q, settings[i], &got);
                if (!st.ok()) {
                    ++failures[size_t(t)];
                    continue;
                }
                for (size_t qi = 0; qi < got.size(); ++qi) {
                    bool same = got[qi].size() == want[i][qi].size();
                    for (size_t j = 0; same && j < got[qi].size(); ++j)
                        same = got[qi][j].doc_id == want[i][qi][j].doc_id && got[qi][j].score == want[i][qi][j].score;
                    mismatches[size_t(t)] += !same;
                }
            }
        });
    }
    for (auto& th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) {
        EXPECT_EQ(failures[size_t(t)], 0) << "thread " << t;
        EXPECT_EQ(mismatches[size_t(t)], 0) << "thread " << t;
    }
}

TEST(PlacementCuda, MissingGpuIsAnError) {
    SKIP_WITHOUT_GPU();
    int n = 0;
    ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
    Fixture f;
    f.Build(2);
    std::unique_ptr<Searcher> s;
    Status st = f.Open(Device::kGpu, {n}, &s);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
    EXPECT_NE(st.message().find("GPU " + std::to_string(n) + " is not present"), std::string::npos) << st.message();
}

// With two GPUs: shards put on GPU 1 allocate nothing on GPU 0, and give GPU 0's results;
// spread over both they give its results too.
TEST(PlacementCuda, SecondGpuHonouredAndSpreadEqualsOne) {
    SKIP_WITHOUT_GPU();
    int n = 0;
    ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
    if (n < 2) GTEST_SKIP() << "needs 2 GPUs";
    Fixture f;
    f.Build(3);
    std::unique_ptr<Searcher> on0, on1, both;
    ASSERT_TRUE(f.Open(Device::kGpu, {0}, &on0).ok());
    const auto r0 = f.Search(*on0, true);
    const auto a0 = f.Search(*on0, false);
    on0.reset();
    size_t free0 = 0, free0_after = 0, free1 = 0, free1_after = 0, total = 0;
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaMemGetInfo(&free0, &total));
    CUDA_OK(cudaSetDevice(1));
    CUDA_OK(cudaMemGetInfo(&free1, &total));
    ASSERT_TRUE(f.Open(Device::kGpu, {1}, &on1).ok());
    for (const ShardPlacement& p : on1->placement()) EXPECT_EQ(p.gpu, 1);
    ExpectSameHits(r0, f.Search(*on1, true), 0);
    ExpectSameHits(a0, f.Search(*on1, false), 0);
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaMemGetInfo(&free0_after, &total));
    CUDA_OK(cudaSetDevice(1));
    CUDA_OK(cudaMemGetInfo(&free1_after, &total));
    EXPECT_LT(free0 - std::min(free0, free0_after), size_t(4) << 20) << "memory allocated on GPU 0";
    EXPECT_GT(free1 - std::min(free1, free1_after), size_t(16) << 20) << "the shards are not on GPU 1";
    on1.reset();
    ASSERT_TRUE(f.Open(Device::kGpu, {0, 1}, &both).ok());
    ExpectSameHits(r0, f.Search(*both, true), 0);
    // The GPUs cut their candidates together: default search over both is GPU 0's.
    ExpectSameHits(a0, f.Search(*both, false), 0);
}

}  // namespace
}  // namespace tms

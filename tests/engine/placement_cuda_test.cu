// Copyright TileMaxSim authors. Shards on GPUs: where they are placed does not change results,
// an explicit GPU list is honoured (nothing lands on another GPU), a missing GPU is an error.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "tests/engine/synth_index.h"
#include "tests/kernels/cuda_test_util.h"
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
    ~Fixture() { fs::remove_all(dir); }
    Status Open(Device d, std::vector<int> gpus, std::unique_ptr<Searcher>* s) {
        SearcherOptions o;
        o.device = d;
        o.gpus = std::move(gpus);
        o.progress = false;
        return Searcher::Open(o, (dir / "index").string(), s);
    }
    std::vector<std::vector<SearchHit>> Search(const Searcher& s, bool exhaustive) {
        QueryBatch q;
        q.data = qa.bytes.data();
        q.dtype = DType::kF16;
        q.n_queries = int(qa.shape[0]);
        q.q_tokens = int(qa.shape[1]);
        q.dim = so.dim;
        SearchOptions opts;
        opts.exhaustive = exhaustive;
        std::vector<std::vector<SearchHit>> r;
        Status st = s.Search(q, opts, &r);
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
// spread over both they give its exhaustive results, and default ones as exact.
TEST(PlacementCuda, SecondGpuHonouredAndSpreadEqualsOne) {
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
    // Each GPU prunes its own documents: default search over both is as exact as over one.
    auto recall = [&](const std::vector<std::vector<SearchHit>>& r) {
        int64_t hit = 0, n = 0;
        for (size_t q = 0; q < r0.size(); ++q) {
            for (const SearchHit& t : r0[q]) {
                n += 1;
                for (const SearchHit& h : r[q]) hit += h.doc_id == t.doc_id;
            }
        }
        return n ? double(hit) / double(n) : 1.0;
    };
    EXPECT_GE(recall(f.Search(*both, false)), recall(a0) - 0.005);
}

}  // namespace
}  // namespace tms

// Copyright TileMaxSim authors. A GPU error in the middle of a batch fails that call with a
// clear Status, and the Searcher serves the next call as if nothing had happened.
#include <gtest/gtest.h>

#include <filesystem>

#include "base/fault.h"
#include "tests/engine/synth_index.h"
#include "tests/kernels/cuda_test_util.h"
#include "index/ingest/npy.h"
#include "tools/lib/synth.h"
#include "tilemaxsim/tilemaxsim.h"

namespace tms {
namespace {

namespace fs = std::filesystem;

TEST(FaultCuda, FailedAllocationMidBatchFailsOnlyThatCall) {
    SKIP_WITHOUT_GPU();
    SynthOptions so;
    so.n_docs = 2000;
    so.n_queries = 64;
    so.dim = 128;
    IndexBuildOptions bo;
    bo.keep_vectors = true;
    bo.progress = false;
    bo.n_centroids = 128;
    bo.shards = 2;
    const fs::path dir = testing::BuildSynthIndex("tms_fault", so, bo);
    HostArray qa;
    ASSERT_TRUE(LoadNpy((dir / "queries.npy").string(), &qa).ok());
    SearcherOptions sopt;
    sopt.device = Device::kGpu;
    sopt.progress = false;
    std::unique_ptr<Searcher> s;
    Status st = Searcher::Open(sopt, (dir / "index").string(), &s);
    ASSERT_TRUE(st.ok()) << st.ToString();
    QueryBatch q;
    q.data = qa.bytes.data();
    q.dtype = DType::kF16;
    q.n_queries = int(qa.shape[0]);
    q.q_tokens = int(qa.shape[1]);
    q.dim = so.dim;
    SearchOptions opts;
    opts.target_recall = 0;  // the approximate pipeline as given: this index would plan exhaustive search
    std::vector<std::vector<SearchHit>> want, got;
    st = s->Search(q, opts, &want);
    ASSERT_TRUE(st.ok()) << st.ToString();
    // The first shard's candidate stage fails after its centroid GEMM (work already queued).
    fault::Arm("gpu.candidates", 1);
    st = s->Search(q, opts, &got);
    fault::Arm("gpu.candidates", 0);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), Status::Code::kResourceExhausted) << st.ToString();
    EXPECT_NE(st.ToString().find("cudaMalloc"), std::string::npos) << st.ToString();
    EXPECT_NE(st.ToString().find("device 0"), std::string::npos) << st.ToString();
    // The next calls: the same results, approximate and exhaustive, one query and the batch.
    for (int rep = 0; rep < 2; ++rep) {
        got.clear();
        st = s->Search(q, opts, &got);
        ASSERT_TRUE(st.ok()) << st.ToString();
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) {
            ASSERT_EQ(got[i].size(), want[i].size()) << i;
            for (size_t j = 0; j < want[i].size(); ++j) {
                EXPECT_EQ(got[i][j].internal_id, want[i][j].internal_id) << i << " " << j;
                EXPECT_EQ(got[i][j].score, want[i][j].score) << i << " " << j;
            }
        }
    }
    SearchOptions ex;
    ex.exhaustive = true;
    st = s->Search(q.Slice(0, 1), ex, &got);
    EXPECT_TRUE(st.ok()) << st.ToString();
}

}  // namespace
}  // namespace tms

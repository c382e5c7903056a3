// Copyright TileMaxSim authors. Concurrent callers of one Searcher get exactly what the same
// calls get one after another (shared by the CPU and the GPU test: Search is thread-safe).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include "tests/engine/synth_index.h"
#include "index/ingest/npy.h"
#include "tools/lib/synth.h"
#include "tilemaxsim/tilemaxsim.h"

namespace tms::testing {

/// `shards`: of the index searched (several shards on one device share its scratch);
/// `gather`, `gather_us`: SearcherOptions' (concurrent calls gathered into shared batches).
inline void ExpectConcurrentSearchesMatchSerial(Device device, int n_threads, int shards = 1, bool gather = false,
                                                int gather_us = 0) {
    namespace fs = std::filesystem;
    SynthOptions so;
    so.n_docs = 800;
    so.n_queries = 96;
    so.dim = 64;
    IndexBuildOptions bo;
    bo.keep_vectors = true;
    bo.progress = false;
    bo.n_centroids = 64;
    bo.shards = shards;
    const fs::path dir =
        BuildSynthIndex("tms_concurrent_" + std::string(DeviceName(device)) + "_" + std::to_string(shards), so, bo);
    if (::testing::Test::HasFailure()) return;
    Status st;
    SearcherOptions sopt;
    sopt.device = device;
    sopt.progress = false;
    sopt.gather = gather;
    sopt.gather_us = gather_us;
    std::unique_ptr<Searcher> s;
    st = Searcher::Open(sopt, (dir / "index").string(), &s);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_EQ(s->placement().size(), size_t(shards));
    HostArray qa;
    ASSERT_TRUE(LoadNpy((dir / "queries.npy").string(), &qa).ok());
    const int nq = static_cast<int>(qa.shape[0]), qt = static_cast<int>(qa.shape[1]);
    const size_t row = size_t(qt) * so.dim * 2;  // fp16

    // Calls of random batch sizes and modes (approximate, exhaustive, a larger k), each run
    // once serially for the expected result, then all together from n_threads threads.
    struct Call {
        int q0, n;
        SearchOptions opts;
        std::vector<std::vector<SearchHit>> want, got;
        Status st;
    };
    std::mt19937 rng(11);
    std::vector<Call> calls(48);
    for (auto& c : calls) {
        c.n = 1 + int(rng() % 33);
        c.q0 = int(rng() % uint32_t(nq - c.n + 1));
        c.opts.exhaustive = rng() % 4 == 0;
        c.opts.target_recall = 0;  // approximate as given (800 documents would plan exhaustive on a GPU)
        c.opts.k = rng() % 3 == 0 ? 100 : 10;
    }
    auto batch = [&](const Call& c) {
        QueryBatch q;
        q.data = qa.bytes.data() + size_t(c.q0) * row;
        q.dtype = DType::kF16;
        q.n_queries = c.n;
        q.q_tokens = qt;
        q.dim = so.dim;
        return q;
    };
    for (auto& c : calls) {
        st = s->Search(batch(c), c.opts, &c.want);
        ASSERT_TRUE(st.ok()) << st.ToString();
    }
    std::atomic<size_t> next{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < n_threads; ++t) {
        threads.emplace_back([&] {
            for (size_t i = next++; i < calls.size(); i = next++)
                calls[i].st = s->Search(batch(calls[i]), calls[i].opts, &calls[i].got);
        });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < calls.size(); ++i) {
        const Call& c = calls[i];
        ASSERT_TRUE(c.st.ok()) << "call " << i << ": " << c.st.ToString();
        ASSERT_EQ(c.got.size(), c.want.size());
        for (size_t q = 0; q < c.got.size(); ++q) {
            ASSERT_EQ(c.got[q].size(), c.want[q].size()) << "call " << i << " query " << q;
            for (size_t j = 0; j < c.got[q].size(); ++j) {
                EXPECT_EQ(c.got[q][j].internal_id, c.want[q][j].internal_id) << "call " << i << " query " << q;
                EXPECT_EQ(c.got[q][j].score, c.want[q][j].score) << "call " << i << " query " << q;
            }
        }
    }
}

}  // namespace tms::testing

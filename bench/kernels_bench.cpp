// Copyright TileMaxSim authors. Micro-benchmarks of the kernels' CPU paths beside their scalar
// references (Google Benchmark), for work on a kernel:
//   build/bench/tms_kernel_bench --benchmark_filter=MaxSim
// The figures of record (BENCHMARKS.md) come from `tms bench kernels|index|search`.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <vector>

#include "bench/bench_corpus.h"
#include "kernels/candidates.h"
#include "kernels/maxsim.h"

namespace tms::bench {
namespace {

void Check(benchmark::State& state, const Status& st) {
    if (!st.ok()) state.SkipWithError(st.message().c_str());
}

// Exact MaxSim of every query against every document: args (queries, dim, documents).
void MaxSimDense(benchmark::State& state, bool ref) {
    const BenchCorpus c(int(state.range(0)), 32, int(state.range(1)), state.range(2), 32);
    std::vector<float> scores(size_t(c.n_queries) * size_t(c.n_docs));
    std::vector<double> exact(scores.size());
    const kernels::MaxSimParams p = c.Params(scores.data());
    for (auto _ : state) {
        Check(state, ref ? kernels::maxsim_ref(p, exact.data()) : kernels::maxsim_cpu(p));
        benchmark::DoNotOptimize(scores.data());
        benchmark::DoNotOptimize(exact.data());
    }
    state.SetItemsProcessed(state.iterations() * c.n_queries * c.n_docs);  // (query, document) pairs
    state.SetBytesProcessed(state.iterations() * c.doc_bytes());
}
BENCHMARK_CAPTURE(MaxSimDense, cpu, false)
    ->Args({8, 128, 2000})
    ->Args({32, 128, 2000})
    ->Args({8, 64, 4000})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(MaxSimDense, ref, true)->Args({8, 128, 100})->Unit(benchmark::kMillisecond);

// Exact MaxSim of candidate lists (the rerank's shape): args (queries, candidates per query).
void MaxSimCandidates(benchmark::State& state) {
    const int nq = int(state.range(0)), per = int(state.range(1));
    const BenchCorpus c(nq, 32, 128, 20000, 32);
    std::mt19937 rng(2);
    std::uniform_int_distribution<int32_t> doc(0, int32_t(c.n_docs) - 1);
    std::vector<int64_t> off(size_t(nq) + 1);
    std::vector<int32_t> docs(size_t(nq) * size_t(per));
    for (int q = 0; q <= nq; ++q) off[size_t(q)] = int64_t(q) * per;
    for (int32_t& d : docs) d = doc(rng);
    std::vector<float> scores(docs.size());
    kernels::MaxSimParams p = c.Params(scores.data());
    p.cand_offsets = off.data();
    p.cand_docs = docs.data();
    for (auto _ : state) {
        Check(state, kernels::maxsim_cpu(p));
        benchmark::DoNotOptimize(scores.data());
    }
    state.SetItemsProcessed(state.iterations() * int64_t(docs.size()));
}
BENCHMARK(MaxSimCandidates)->Args({32, 256})->Args({32, 1024})->Unit(benchmark::kMillisecond);

// Top-k of dense score rows: args (rows, row length, k).
void TopK(benchmark::State& state, bool ref) {
    const int64_t rows = state.range(0), len = state.range(1);
    const int k = int(state.range(2));
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<float> scores(size_t(rows * len));
    for (float& x : scores) x = u(rng);
    std::vector<int32_t> ids(size_t(rows) * size_t(k));
    std::vector<float> top(ids.size());
    kernels::TopKParams p;
    p.scores = scores.data();
    p.row_len = len;
    p.n_segments = rows;
    p.k = k;
    p.out_ids = ids.data();
    p.out_scores = top.data();
    for (auto _ : state) {
        Check(state, ref ? kernels::topk_ref(p) : kernels::topk_cpu(p));
        benchmark::DoNotOptimize(ids.data());
    }
    state.SetItemsProcessed(state.iterations() * rows * len);
}
BENCHMARK_CAPTURE(TopK, cpu, false)->Args({256, 4096, 10})->Args({256, 4096, 1024})->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(TopK, ref, true)->Args({256, 4096, 10})->Unit(benchmark::kMicrosecond);

// The IVF union of the probed lists: args (queries, nprobe); 32 tokens, 4,096 lists over
// 100,000 documents of 32 tokens.
void IvfUnion(benchmark::State& state, bool ref) {
    const int nq = int(state.range(0)), nprobe = int(state.range(1)), qt = 32, K = 4096;
    const int64_t n_docs = 100000;
    std::mt19937 rng(4);
    std::uniform_int_distribution<int32_t> cent(0, K - 1);
    std::vector<std::vector<int32_t>> lists(K);
    for (int64_t d = 0; d < n_docs; ++d)
        for (int t = 0; t < 32; ++t) lists[size_t(cent(rng))].push_back(int32_t(d));
    std::vector<int64_t> ivf_off(size_t(K) + 1, 0);
    std::vector<int32_t> ivf_docs;
    for (int c = 0; c < K; ++c) {
        auto& l = lists[size_t(c)];
        l.erase(std::unique(l.begin(), l.end()), l.end());  // ascending already
        ivf_docs.insert(ivf_docs.end(), l.begin(), l.end());
        ivf_off[size_t(c) + 1] = int64_t(ivf_docs.size());
    }
    std::vector<int32_t> probe(size_t(nq) * qt * size_t(nprobe));
    for (int32_t& c : probe) c = cent(rng);
    kernels::IvfUnionParams p;
    p.probe = probe.data();
    p.n_queries = nq;
    p.q_stride = qt;
    p.nprobe = nprobe;
    p.ivf_offsets = ivf_off.data();
    p.ivf_docs = ivf_docs.data();
    p.n_centroids = K;
    p.n_docs = n_docs;
    std::vector<int64_t> off;
    std::vector<int32_t> docs;
    for (auto _ : state) {
        Check(state, ref ? kernels::ivf_union_ref(p, &off, &docs) : kernels::ivf_union_cpu(p, &off, &docs));
        benchmark::DoNotOptimize(docs.data());
    }
    state.SetItemsProcessed(state.iterations() * nq);  // queries
}
BENCHMARK_CAPTURE(IvfUnion, cpu, false)->Args({64, 4})->Args({64, 16})->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(IvfUnion, ref, true)->Args({64, 4})->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tms::bench

BENCHMARK_MAIN();

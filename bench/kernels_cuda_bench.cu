// Copyright TileMaxSim authors. Micro-benchmarks of the CUDA kernels (Google Benchmark, times from
// CUDA events), beside kernels_bench.cpp's CPU paths:
//   build/bench/tms_kernel_cuda_bench --benchmark_filter=MaxSim
// The figures of record (BENCHMARKS.md: against the read ceiling) come from `tms bench kernels`.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <vector>

#include "bench/bench_corpus.h"
#include "kernels/cuda/maxsim_cuda.h"

namespace tms::bench {
namespace {

template <typename T>
T* Upload(const std::vector<T>& v) {
    T* d = nullptr;
    if (cudaMalloc(&d, std::max<size_t>(1, v.size()) * sizeof(T)) != cudaSuccess) return nullptr;
    cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
    return d;
}

bool HaveGpu(benchmark::State& state) {
    int n = 0;
    if (kernels::cuda_device_count(&n).ok() && n > 0) return true;
    state.SkipWithError("no CUDA device");
    return false;
}

// Exact MaxSim of every query against every document on the GPU: args (queries, dim,
// documents); items are (query, document) pairs, bytes the documents' (read once per call).
void MaxSimDenseCuda(benchmark::State& state) {
    if (!HaveGpu(state)) return;
    const BenchCorpus c(int(state.range(0)), 32, int(state.range(1)), state.range(2), 32);
    kernels::MaxSimParams p = c.Params(nullptr);
    float* scores = nullptr;
    cudaMalloc(&scores, size_t(c.n_queries) * size_t(c.n_docs) * sizeof(float));
    float* q = Upload(c.queries);
    uint16_t* docs = Upload(c.docs);
    int64_t* off = Upload(c.offsets);
    if (!scores || !q || !docs || !off) {
        state.SkipWithError("out of GPU memory");
        return;
    }
    p.queries = q;
    p.doc_tokens = docs;
    p.doc_offsets = off;
    p.scores = scores;
    p.docs_static = true;
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    const Status warm = kernels::maxsim_cuda(p, stream);  // the launch's first-call setup
    if (!warm.ok()) state.SkipWithError(warm.message().c_str());
    for (auto _ : state) {
        cudaEventRecord(start, stream);
        const Status st = kernels::maxsim_cuda(p, stream);
        cudaEventRecord(stop, stream);
        cudaEventSynchronize(stop);
        if (!st.ok()) {
            state.SkipWithError(st.message().c_str());
            break;
        }
        float ms = 0;
        cudaEventElapsedTime(&ms, start, stop);
        state.SetIterationTime(double(ms) / 1e3);
    }
    state.SetItemsProcessed(state.iterations() * c.n_queries * c.n_docs);
    state.SetBytesProcessed(state.iterations() * c.doc_bytes());
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaStreamDestroy(stream);
    cudaFree(scores);
    cudaFree(q);
    cudaFree(docs);
    cudaFree(off);
}
BENCHMARK(MaxSimDenseCuda)
    ->Args({32, 128, 100000})
    ->Args({256, 128, 100000})
    ->Args({32, 64, 200000})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tms::bench

BENCHMARK_MAIN();

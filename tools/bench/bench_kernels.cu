// Copyright TileMaxSim authors. `tms bench kernels`: in one run, the machine's read ceiling
// (a streaming-read kernel), the TileMaxSim exact kernel and a naive cuBLAS GEMM + max-reduce
// baseline, over the cases of the exact-scoring issue. Data is generated on the device and
// rotated over enough copies to exceed 4x the L2; each timing is the median of 15 samples
// (CUDA events) after warm-up, a sample being enough launches to move >= 1 GB.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tools/bench/bench_common.cuh"
#include "tools/bench/bench_kernels.h"
#include "base/json_escape.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/maxsim_cuda.h"

namespace tms::bench {
namespace {

using bench::Dev;
using bench::fmt;
using bench::kSamples;
using bench::read_ceiling_kernel;
using bench::row;
using bench::Timer;

constexpr int kQTokens = 32;

__global__ void fill_random(void* data, int64_t n, int dtype, uint32_t seed) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const uint32_t h = bench::mix(uint64_t(i), seed);
        const float v = (float(h & 0xffffff) / float(1 << 24) - 0.5f) * 0.25f + 1e-3f;
        if (dtype == int(DType::kF32))
            static_cast<float*>(data)[i] = v;
        else if (dtype == int(DType::kF16))
            static_cast<__half*>(data)[i] = __float2half(v);
        else
            static_cast<__nv_bfloat16*>(data)[i] = __float2bfloat16(v);
    }
}

/// Baseline reduce: C col-major [32, n_tok] fp32; one warp per document, lane = query row.
__global__ void naive_reduce(const float* c, const int64_t* offs, int64_t doc0, int64_t n_docs, int64_t tok0,
                             float* scores) {
    const int64_t doc = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (doc >= n_docs) return;
    const int64_t b = offs[doc0 + doc] - tok0, e = offs[doc0 + doc + 1] - tok0;
    float m = -INFINITY;
    for (int64_t t = b; t < e; ++t) m = fmaxf(m, c[t * 32 + lane]);
    if (e == b) m = 0.f;
    for (int o = 16; o; o >>= 1) m += __shfl_xor_sync(0xffffffffu, m, o);
    if (lane == 0) scores[doc0 + doc] = m;
}

struct BenchCase {
    std::string name;
    int dim = 128;
    int nd = 128;        // tokens per doc (0: variable 32..256)
    int64_t n_docs = 0;  // documents in the corpus
    DType dtype = DType::kF16;
    int n_queries = 1;   // ragged: queries, each with n_cand candidates
    int64_t n_cand = 0;  // 0: dense (one query x all docs)
};

std::vector<BenchCase> bench_cases() {
    std::vector<BenchCase> v;
    for (int nd : {32, 128, 256})
        for (int64_t b : {1000, 10000, 100000, 500000})
            v.push_back({"exact_d128_nq32_nd" + std::to_string(nd) + "_b" + std::to_string(b) + "_fp16", 128, nd, b});
    v.push_back({"exact_d768_nq32_nd128_b20000_fp16", 768, 128, 20000});
    v.push_back({"exact_d128_nq32_ndvar32-256_b100000_fp16", 128, 0, 100000});
    v.push_back({"ragged_d128_nq32_nd128_q256_c4096_n1000000_fp16", 128, 128, 1000000, DType::kF16, 256, 4096});
    v.push_back({"exact_d128_nq32_nd128_b100000_bf16", 128, 128, 100000, DType::kBF16});
    v.push_back({"exact_d128_nq32_nd128_b100000_fp32", 128, 128, 100000, DType::kF32});
    return v;
}

Status run_case(const BenchCase& bc, const KernelBenchOptions& o, const cudaDeviceProp& prop, double ceiling_gbps,
                cublasHandle_t blas, std::vector<std::string>* rows) {
    const size_t l2_bytes = size_t(prop.l2CacheSize);
    const int esz = DTypeSize(bc.dtype);
    const size_t row_bytes = size_t(bc.dim) * esz;
    std::mt19937 rng(1234);
    std::uniform_int_distribution<int> ulen(32, 256);
    std::vector<int64_t> offs{0};
    for (int64_t d = 0; d < bc.n_docs; ++d) offs.push_back(offs.back() + (bc.nd ? bc.nd : ulen(rng)));
    const int64_t n_tok = offs.back();
    const size_t corpus_bytes = size_t(n_tok) * row_bytes;
    // Copies to rotate over: together >= 4x L2 (only small corpora get more than one).
    const int copies =
        int(std::min<size_t>(256, std::max<size_t>(1, (4 * l2_bytes + corpus_bytes - 1) / corpus_bytes)));
    Dev<unsigned char> docs;
    TMS_RETURN_IF_ERROR(docs.alloc(corpus_bytes * copies));
    fill_random<<<4096, 256>>>(docs.p, int64_t(n_tok) * bc.dim * copies, int(bc.dtype), 7);
    TMS_CUDA_CHECK_LAUNCH();
    Dev<int64_t> d_offs;
    TMS_RETURN_IF_ERROR(d_offs.alloc(offs.size()));
    TMS_CUDA_RETURN_IF_ERROR(cudaMemcpy(d_offs.p, offs.data(), offs.size() * 8, cudaMemcpyHostToDevice));
    const int nq = bc.n_queries;
    Dev<unsigned char> q;
    TMS_RETURN_IF_ERROR(q.alloc(size_t(nq) * kQTokens * row_bytes));
    fill_random<<<256, 256>>>(q.p, int64_t(nq) * kQTokens * bc.dim, int(bc.dtype), 99);
    TMS_CUDA_CHECK_LAUNCH();

    kernels::MaxSimParams p;
    p.queries = q.p;
    p.q_dtype = bc.dtype;
    p.n_queries = nq;
    p.q_stride = kQTokens;
    p.dim = bc.dim;
    p.d_dtype = bc.dtype;
    p.doc_tokens = docs.p;
    p.doc_offsets = d_offs.p;
    p.n_docs = bc.n_docs;
    p.n_tokens = o.tma ? n_tok : -1;
    p.docs_static = true;  // the documents are uploaded once, as GpuExactScorer's are
    int64_t n_pairs = bc.n_docs;
    double bytes_read = double(corpus_bytes);
    std::vector<int64_t> coffs;
    std::vector<int32_t> cdocs;
    Dev<int64_t> d_coffs;
    Dev<int32_t> d_cdocs;
    if (bc.n_cand > 0) {
        std::uniform_int_distribution<int32_t> pick(0, int32_t(bc.n_docs - 1));
        coffs.push_back(0);
        bytes_read = 0;
        for (int qq = 0; qq < nq; ++qq) {
            for (int64_t i = 0; i < bc.n_cand; ++i) {
                const int32_t d = pick(rng);
                cdocs.push_back(d);
                bytes_read += double(offs[d + 1] - offs[d]) * row_bytes;
            }
            coffs.push_back(int64_t(cdocs.size()));
        }
        n_pairs = int64_t(cdocs.size());
        TMS_RETURN_IF_ERROR(bench::upload_candidates(coffs, cdocs, &d_coffs, &d_cdocs));
        p.cand_offsets = d_coffs.p;
        p.cand_docs = d_cdocs.p;
    }
    Dev<float> scores;
    TMS_RETURN_IF_ERROR(scores.alloc(size_t(n_pairs)));
    p.scores = scores.p;
    const int per_sample = int(std::clamp<double>(std::ceil(1e9 / bytes_read), 1, 200));
    Timer timer;
    // Times fn as one row: median seconds per call, docs/s, GB/s of the case's bytes.
    const auto timed_row = [&](const char* impl, const std::function<Status(int)>& fn) -> Status {
        double t = 0;
        TMS_RETURN_IF_ERROR(timer.median(per_sample, fn, &t));
        rows->push_back(row(bc.name, impl, n_pairs / t, bytes_read / t * 1e-9, ceiling_gbps));
        std::fprintf(stderr, "%-50s %-18s %8.3f ms  %7.1f GB/s  %.3f of ceiling\n", bc.name.c_str(), impl, t * 1e3,
                     bytes_read / t * 1e-9, bytes_read / t * 1e-9 / ceiling_gbps);
        return Status::OK();
    };
    TMS_RETURN_IF_ERROR(timed_row("tilemaxsim", [&](int i) {
        kernels::MaxSimParams pi = p;
        pi.doc_tokens = docs.p + size_t(i % copies) * corpus_bytes;
        return kernels::maxsim_cuda(pi, nullptr);
    }));
    if (o.diagnose) {
        TMS_RETURN_IF_ERROR(timed_row("copy-only", [&](int i) {
            kernels::MaxSimParams pi = p;
            pi.doc_tokens = docs.p + size_t(i % copies) * corpus_bytes;
            return kernels::maxsim_cuda_copy_only(pi, nullptr);
        }));
        if (bc.n_cand == 0) {
            Dev<uint32_t> sink;
            TMS_RETURN_IF_ERROR(sink.alloc(1));
            TMS_RETURN_IF_ERROR(timed_row("read-same-bytes", [&](int i) {
                return bench::launch_read(prop, docs.p + size_t(i % copies) * corpus_bytes, corpus_bytes, sink.p);
            }));
        }
    }
    if (bc.n_cand > 0) {
        const int k = 10;
        bench::TopKBuffers tk;
        TMS_RETURN_IF_ERROR(tk.alloc(kernels::maxsim_topk_cuda_workspace_bytes(p, k), nq, k));
        TMS_RETURN_IF_ERROR(timed_row("tilemaxsim-topk10", [&](int) {
            return kernels::maxsim_topk_cuda(p, k, tk.ids.p, tk.scores.p, tk.ws.p, tk.ws_bytes, nullptr);
        }));
        return Status::OK();  // no dense GEMM baseline for gathered candidate lists
    }
    if (!o.baseline) return Status::OK();
    // Naive baseline: C = Q D^T into HBM (fp32), then a per-document max/sum reduce; in chunks
    // of whole documents of at most 16M tokens.
    const int64_t chunk_tok = int64_t(1) << 24;
    Dev<float> cbuf;
    TMS_RETURN_IF_ERROR(cbuf.alloc(size_t(std::min<int64_t>(chunk_tok + 256, n_tok)) * kQTokens));
    std::vector<std::pair<int64_t, int64_t>> chunks;  // doc ranges
    for (int64_t d0 = 0; d0 < bc.n_docs;) {
        int64_t d1 = d0;
        while (d1 < bc.n_docs && offs[d1 + 1] - offs[d0] <= chunk_tok) ++d1;
        chunks.push_back({d0, d1});
        d0 = d1;
    }
    const cudaDataType_t ct = bc.dtype == DType::kF32 ? CUDA_R_32F : bc.dtype == DType::kF16 ? CUDA_R_16F : CUDA_R_16BF;
    return timed_row("cublas-gemm-reduce", [&](int i) -> Status {
        const unsigned char* base = docs.p + size_t(i % copies) * corpus_bytes;
        for (auto [d0, d1] : chunks) {
            const int64_t t0 = offs[d0], nt = offs[d1] - t0;
            const float one = 1.f, zero = 0.f;
            TMS_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, kQTokens, int(nt), bc.dim, &one,
                                                    q.p, ct, bc.dim, base + size_t(t0) * row_bytes, ct, bc.dim, &zero,
                                                    cbuf.p, CUDA_R_32F, kQTokens, CUBLAS_COMPUTE_32F,
                                                    CUBLAS_GEMM_DEFAULT));
            const int64_t nd = d1 - d0;
            naive_reduce<<<unsigned((nd * 32 + 255) / 256), 256>>>(cbuf.p, d_offs.p, d0, nd, t0, scores.p);
            TMS_CUDA_CHECK_LAUNCH();
        }
        return Status::OK();
    });
}

}  // namespace

Status RunKernelBench(const KernelBenchOptions& o, std::string* json) {
    bench::cooldown_seconds() = std::max(0.0, o.cooldown);
    cudaDeviceProp prop{};
    double ceiling = 0;
    TMS_RETURN_IF_ERROR(bench::device_and_ceiling(&prop, &ceiling));
    cublasHandle_t blas = nullptr;
    TMS_CUBLAS_RETURN_IF_ERROR(cublasCreate(&blas));
    std::vector<std::string> rows;
    std::vector<BenchCase> cases = bench_cases();
    if (o.docs > 0 || o.dim > 0) {  // the dense exact cases at B = o.docs, dim = o.dim (one per shape), named for them
        const auto set_field = [](std::string& name, const std::string& key, int64_t v) {
            const size_t b = name.find(key), e = name.find('_', b + key.size());
            if (b != std::string::npos && e != std::string::npos)
                name = name.substr(0, b + key.size()) + std::to_string(v) + name.substr(e);
        };
        std::vector<BenchCase> at;
        for (BenchCase bc : cases) {
            if (bc.n_cand != 0) continue;
            if (o.docs > 0) set_field(bc.name, "_b", bc.n_docs = o.docs);
            if (o.dim > 0) set_field(bc.name, "_d", bc.dim = o.dim);
            if (std::none_of(at.begin(), at.end(), [&](const BenchCase& x) { return x.name == bc.name; }))
                at.push_back(bc);
        }
        cases = at;
    }
    for (const BenchCase& bc : cases) {
        if (!o.cases.empty() && bc.name.find(o.cases) == std::string::npos) continue;
        const Status case_st = run_case(bc, o, prop, ceiling, blas, &rows);
        if (!case_st.ok()) {
            cublasDestroy(blas);
            return case_st.WithContext(bc.name);
        }
    }
    cublasDestroy(blas);
    char date[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
    std::string j = "{\"gpu\":\"" + std::string(prop.name) + "\",\"date\":\"" + date + "\",\"command\":\"" +
                    json_escape(o.command) + "\",\"read_ceiling_gbps\":" + fmt(ceiling) + ",\"cases\":[\n";
    j += row("read_ceiling", "read-ceiling", 0, ceiling, ceiling);
    for (const std::string& r : rows) j += ",\n" + r;
    j += "\n]}\n";
    *json = std::move(j);
    return Status::OK();
}

Status HostToDeviceBandwidth(int device, double* gb_s) {
    int prev = 0;
    cudaGetDevice(&prev);
    if (cudaSetDevice(device) != cudaSuccess) {
        cudaGetLastError();
        return Status::NotSupported("no GPU " + std::to_string(device));
    }
    const size_t bytes = size_t(1) << 30;
    void *h = nullptr, *d = nullptr;
    cudaEvent_t a = nullptr, b = nullptr;
    const bool ok = cudaMallocHost(&h, bytes) == cudaSuccess && cudaMalloc(&d, bytes) == cudaSuccess &&
                    cudaEventCreate(&a) == cudaSuccess && cudaEventCreate(&b) == cudaSuccess;
    if (ok) {
        std::memset(h, 1, bytes);
        float best = 1e30f;
        for (int i = 0; i < 4; ++i) {  // the best of 4 copies of 1 GiB from pinned memory
            cudaEventRecord(a);
            cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice);
            cudaEventRecord(b);
            cudaEventSynchronize(b);
            float ms = 0;
            cudaEventElapsedTime(&ms, a, b);
            best = std::min(best, ms);
        }
        *gb_s = double(bytes) / (double(best) * 1e6);
    }
    cudaGetLastError();
    if (a) cudaEventDestroy(a);
    if (b) cudaEventDestroy(b);
    cudaFree(d);
    cudaFreeHost(h);
    cudaSetDevice(prev);
    return ok ? Status::OK() : Status::ResourceExhausted("HostToDeviceBandwidth: cannot allocate 1 GiB");
}

Status GpuState(int device, std::string* name, int64_t* used_bytes) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || device < 0 || device >= n) {
        cudaGetLastError();
        return Status::NotSupported("no GPU " + std::to_string(device));
    }
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess)
        return Status::Internal("cudaGetDeviceProperties failed");
    *name = prop.name;
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(device);
    size_t free_b = 0, total_b = 0;
    const cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
    cudaSetDevice(prev);
    if (e != cudaSuccess) return Status::Internal("cudaMemGetInfo failed");
    *used_bytes = int64_t(total_b - free_b);
    return Status::OK();
}

}  // namespace tms::bench

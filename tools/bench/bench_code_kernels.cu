// Copyright TileMaxSim authors. Compressed MaxSim kernel benchmark (rows for `tms bench
// kernels`): in one run, the machine's read ceiling, the fused PQ / PLAID-residual kernels
// (kernels/cuda/code_maxsim_cuda.h) and the exact fp16 kernel on the same document shapes.
// Data is generated on the device (random codes, centroid ids in [0, 65536), codebook and
// centroid scores) and rotated over enough copies to exceed 4x the L2; each timing is the
// median of 15 samples (CUDA events) after warm-up. GB/s counts the bytes that must be read:
// code bytes + 4-byte centroid id per scored token (fp16 vectors for the exact rows).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tools/bench/bench_kernels.h"
#include "tools/bench/bench_common.cuh"
#include "index/encode/encoder.h"
#include "index/index_data.h"
#include "kernels/cuda/code_maxsim_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/maxsim_cuda.h"

namespace tms::bench {
namespace {

using bench::Dev;
using bench::kSamples;
using bench::row;
using bench::Timer;

constexpr int kQTokens = 32;
constexpr int kDim = 128;
constexpr int kCentroids = 65536;

/// kind 0: fp32 in [-scale/2, scale/2); 1: fp16 likewise; 2: bytes; 3: uint32 mod `mod`.
__global__ void fill(void* data, int64_t n, int kind, float scale, uint32_t mod, uint32_t seed) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const uint32_t h = bench::mix(uint64_t(i), seed);
        const float v = (float(h & 0xffffff) / float(1 << 24) - 0.5f) * scale;
        switch (kind) {
            case 0: static_cast<float*>(data)[i] = v; break;
            case 1: static_cast<__half*>(data)[i] = __float2half(v); break;
            case 2: static_cast<uint8_t*>(data)[i] = uint8_t(h >> 7); break;
            default: static_cast<uint32_t*>(data)[i] = h % mod; break;
        }
    }
}

Status fill_dev(void* p, int64_t n, int kind, float scale, uint32_t mod, uint32_t seed) {
    fill<<<4096, 256>>>(p, n, kind, scale, mod, seed);
    TMS_CUDA_CHECK_LAUNCH();
    return Status::OK();
}

struct CodeBenchCase {
    std::string name;
    int n_code_bytes;  // 0: centroid-only; -1: exact fp16 vectors
    int64_t n_docs;
    int n_queries = 1;
    int64_t n_cand = 0;  // 0: dense
};

std::vector<CodeBenchCase> cases() {
    const std::vector<std::pair<std::string, int>> codecs = {{"pq16", 16}, {"pq32", 32},     {"pq64", 64},
                                                             {"res1", 16}, {"res2", 32},     {"res4", 64},
                                                             {"cent", 0},  {"exactfp16", -1}};
    std::vector<CodeBenchCase> v;
    for (int64_t b : {100000, 10000})
        for (const auto& [n, nb] : codecs) v.push_back({n + "_d128_nq32_nd128_b" + std::to_string(b), nb, b});
    for (const auto& [n, nb] : codecs)
        v.push_back({"ragged_" + n + "_d128_nq32_nd128_q256_c4096_n1000000", nb, 1000000, 256, 4096});
    return v;
}

Status run_case(const CodeBenchCase& bc, double ceiling, size_t l2, std::vector<std::string>* rows) {
    const int nd = 128;
    const bool exact = bc.n_code_bytes < 0;
    const int nb = std::max(0, bc.n_code_bytes);
    const int64_t n_tok = bc.n_docs * nd;
    const size_t tok_bytes = exact ? size_t(kDim) * 2 : size_t(4 + nb);
    const size_t corpus = size_t(n_tok) * tok_bytes;
    const int copies = int(std::min<size_t>(64, std::max<size_t>(1, (4 * l2 + corpus - 1) / corpus)));
    std::vector<int64_t> offs(size_t(bc.n_docs) + 1);
    for (int64_t d = 0; d <= bc.n_docs; ++d) offs[d] = d * nd;
    Dev<int64_t> d_offs;
    TMS_RETURN_IF_ERROR(d_offs.alloc(offs.size()));
    TMS_CUDA_RETURN_IF_ERROR(cudaMemcpy(d_offs.p, offs.data(), offs.size() * 8, cudaMemcpyHostToDevice));
    const int nq = bc.n_queries;
    // Candidates.
    std::mt19937 rng(1234);
    std::vector<int64_t> coffs;
    std::vector<int32_t> cdocs;
    Dev<int64_t> d_coffs;
    Dev<int32_t> d_cdocs;
    int64_t n_pairs = bc.n_docs;
    if (bc.n_cand > 0) {
        std::uniform_int_distribution<int32_t> pick(0, int32_t(bc.n_docs - 1));
        coffs.push_back(0);
        for (int q = 0; q < nq; ++q) {
            for (int64_t i = 0; i < bc.n_cand; ++i) cdocs.push_back(pick(rng));
            coffs.push_back(int64_t(cdocs.size()));
        }
        n_pairs = int64_t(cdocs.size());
        TMS_RETURN_IF_ERROR(bench::upload_candidates(coffs, cdocs, &d_coffs, &d_cdocs));
    }
    const double bytes_read = double(n_pairs) * nd * tok_bytes;
    Dev<float> scores;
    TMS_RETURN_IF_ERROR(scores.alloc(size_t(n_pairs)));
    const int per_sample = int(std::clamp<int64_t>((2000000 + n_pairs - 1) / n_pairs, 1, 200));
    Timer timer;
    double sec = 0;
    auto report = [&](const std::string& impl) {
        rows->push_back(row(bc.name, impl, n_pairs / sec, bytes_read / sec * 1e-9, ceiling));
        std::fprintf(stderr, "%-58s %-22s %8.3f ms %9.1fM docs/s %7.1f GB/s %.3f\n", bc.name.c_str(), impl.c_str(),
                     sec * 1e3, n_pairs / sec * 1e-6, bytes_read / sec * 1e-9, bytes_read / sec * 1e-9 / ceiling);
    };
    if (exact) {
        Dev<__half> docs, q;
        TMS_RETURN_IF_ERROR(docs.alloc(size_t(n_tok) * kDim * copies));
        TMS_RETURN_IF_ERROR(fill_dev(docs.p, n_tok * kDim * copies, 1, 0.25f, 0, 7));
        TMS_RETURN_IF_ERROR(q.alloc(size_t(nq) * kQTokens * kDim));
        TMS_RETURN_IF_ERROR(fill_dev(q.p, int64_t(nq) * kQTokens * kDim, 1, 0.25f, 0, 9));
        kernels::MaxSimParams p;
        p.queries = q.p;
        p.q_dtype = DType::kF16;
        p.n_queries = nq;
        p.q_stride = kQTokens;
        p.dim = kDim;
        p.d_dtype = DType::kF16;
        p.doc_offsets = d_offs.p;
        p.n_docs = bc.n_docs;
        p.n_tokens = n_tok;
        p.cand_offsets = bc.n_cand ? d_coffs.p : nullptr;
        p.cand_docs = bc.n_cand ? d_cdocs.p : nullptr;
        p.scores = scores.p;
        TMS_RETURN_IF_ERROR(timer.median(
            per_sample,
            [&](int i) {
                kernels::MaxSimParams pi = p;
                pi.doc_tokens = docs.p + size_t(i % copies) * n_tok * kDim;
                return kernels::maxsim_cuda(pi, nullptr);
            },
            &sec));
        report("tilemaxsim-exact");
        return Status::OK();
    }
    Dev<uint32_t> cids;
    Dev<uint8_t> codes;
    Dev<float> book, q, cs;
    TMS_RETURN_IF_ERROR(cids.alloc(size_t(n_tok) * copies));
    TMS_RETURN_IF_ERROR(fill_dev(cids.p, n_tok * copies, 3, 0, kCentroids, 11));
    TMS_RETURN_IF_ERROR(codes.alloc(size_t(n_tok) * nb * copies));
    if (nb) TMS_RETURN_IF_ERROR(fill_dev(codes.p, n_tok * nb * copies, 2, 0, 0, 13));
    TMS_RETURN_IF_ERROR(book.alloc(size_t(kDim) * 256));
    bool shared = false;
    if (nb > 0 && bc.name.find("res") != std::string::npos) {
        // Residual codecs: the bucket codebook the index writes (one block for every code byte).
        const int nbits = 8 / (kDim / nb), levels = 1 << nbits;
        std::vector<float> w(levels);
        for (int i = 0; i < levels; ++i) w[i] = 0.02f * (float(i) + 0.5f - levels / 2.0f);
        const std::vector<float> h = index::ResidualCodebook(w, nbits, nb);
        shared = kernels::codebook_blocks_equal(h.data(), kDim, nb);
        TMS_CUDA_RETURN_IF_ERROR(cudaMemcpy(book.p, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
    } else {
        TMS_RETURN_IF_ERROR(fill_dev(book.p, int64_t(kDim) * 256, 0, 0.1f, 0, 15));
    }
    TMS_RETURN_IF_ERROR(q.alloc(size_t(nq) * kQTokens * kDim));
    TMS_RETURN_IF_ERROR(fill_dev(q.p, int64_t(nq) * kQTokens * kDim, 0, 0.25f, 0, 17));
    TMS_RETURN_IF_ERROR(cs.alloc(size_t(nq) * kQTokens * kCentroids));
    TMS_RETURN_IF_ERROR(fill_dev(cs.p, int64_t(nq) * kQTokens * kCentroids, 0, 1.f, 0, 19));
    kernels::CodeMaxSimParams p;
    p.queries = q.p;
    p.n_queries = nq;
    p.q_stride = kQTokens;
    p.dim = kDim;
    p.centroid_scores = cs.p;
    p.n_centroids = kCentroids;
    p.n_code_bytes = nb;
    p.codebook = nb ? book.p : nullptr;
    p.codebook_shared = shared;
    p.doc_offsets = d_offs.p;
    p.n_docs = bc.n_docs;
    p.cand_offsets = bc.n_cand ? d_coffs.p : nullptr;
    p.cand_docs = bc.n_cand ? d_cdocs.p : nullptr;
    p.n_candidates = bc.n_cand ? n_pairs : 0;  // as GpuCodeScorer passes it
    p.scores = scores.p;
    // The codebook prepared once in the kernel's fp16 layout, as GpuCodeScorer does at open.
    Dev<unsigned char> book_image;
    if (const size_t image_bytes = kernels::code_codebook_image_bytes(p); image_bytes > 0) {
        TMS_RETURN_IF_ERROR(book_image.alloc(image_bytes));
        TMS_RETURN_IF_ERROR(kernels::code_codebook_image_cuda(p, book_image.p, nullptr));
        p.codebook_image = book_image.p;
    }
    const size_t ws_bytes = kernels::code_maxsim_cuda_workspace_bytes(p);
    Dev<unsigned char> ws;
    TMS_RETURN_IF_ERROR(ws.alloc(ws_bytes));
    auto at = [&](int i) {
        kernels::CodeMaxSimParams pi = p;
        pi.token_centroids = cids.p + size_t(i % copies) * n_tok;
        pi.codes = nb ? codes.p + size_t(i % copies) * n_tok * nb : nullptr;
        return pi;
    };
    TMS_RETURN_IF_ERROR(timer.median(
        per_sample, [&](int i) { return kernels::code_maxsim_cuda(at(i), ws.p, ws_bytes, nullptr); }, &sec));
    report("tilemaxsim-code");
    if (kernels::code_maxsim_cuda_uses_wgmma(p)) {
        // The same call through the mma.sync kernel (what GPUs other than Hopper run).
        TMS_RETURN_IF_ERROR(timer.median(
            per_sample,
            [&](int i) {
                kernels::CodeMaxSimParams pi = at(i);
                pi.allow_wgmma = false;
                return kernels::code_maxsim_cuda(pi, ws.p, ws_bytes, nullptr);
            },
            &sec));
        report("tilemaxsim-code-mma");
    }
    // Scoring alone, the centroid-score table already built (the difference to the first row is
    // the table's build from the fp32 centroid scores, each call).
    TMS_RETURN_IF_ERROR(kernels::code_centroid_table_cuda(p, ws.p, nullptr));
    TMS_RETURN_IF_ERROR(timer.median(
        per_sample, [&](int i) { return kernels::code_maxsim_table_cuda(at(i), ws.p, nullptr); }, &sec));
    report("tilemaxsim-code-pretable");
    if (bc.n_cand > 0) {
        // Scoring with each query's top 10 kept on the device (table built each call).
        const int k = 10;
        bench::TopKBuffers tk;
        TMS_RETURN_IF_ERROR(tk.alloc(kernels::code_maxsim_topk_cuda_workspace_bytes(at(0), k), nq, k));
        TMS_RETURN_IF_ERROR(timer.median(
            per_sample,
            [&](int i) {
                return kernels::code_maxsim_topk_cuda(at(i), k, tk.ids.p, tk.scores.p, tk.ws.p, tk.ws_bytes, nullptr);
            },
            &sec));
        report("tilemaxsim-code-topk10");
    }
    return Status::OK();
}

}  // namespace

Status RunCodeKernelBench(const std::string& filter, std::string* json_rows, double cooldown_s) {
    bench::cooldown_seconds() = std::max(0.0, cooldown_s);
    cudaDeviceProp prop{};
    double ceiling = 0;
    TMS_RETURN_IF_ERROR(bench::device_and_ceiling(&prop, &ceiling));
    std::vector<std::string> rows{row("code_read_ceiling", "read-ceiling", 0, ceiling, ceiling)};
    for (const CodeBenchCase& bc : cases()) {
        if (!filter.empty() && bc.name.find(filter) == std::string::npos) continue;
        const Status st = run_case(bc, ceiling, size_t(prop.l2CacheSize), &rows);
        if (!st.ok()) return st.WithContext(bc.name);
    }
    for (size_t i = 0; i < rows.size(); ++i) {
        if (!json_rows->empty() || i > 0) *json_rows += ",\n";
        *json_rows += rows[i];
    }
    return Status::OK();
}

}  // namespace tms::bench

// Copyright TileMaxSim authors. CUDA MaxSim and top-k vs the fp64 reference, over the shared
// case table (maxsim_cases.h), plus the engine's GpuExactScorer vs the CPU path.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/gpu_scorer.h"
#include "kernels/cuda/maxsim_cuda.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/maxsim.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/maxsim_cases.h"

namespace tms {
namespace {

using kernels::MaxSimParams;
using test::DevBuf;
using test::late_copy;
using testing::MaxSimCase;
using testing::MaxSimData;

struct DeviceCase {
    DevBuf<uint8_t> q, docs;
    DevBuf<int64_t> offs, cand_offs;
    DevBuf<int32_t> qlens, cand_docs;
    DeviceCase(const MaxSimCase& c, const MaxSimData& d)
        : q(d.q_bytes),
          docs(d.d_bytes),
          offs(d.doc_offsets),
          cand_offs(d.cand_offsets),
          qlens(d.query_lens),
          cand_docs(d.cand_docs) {}
    /// tma: tell the kernel where the tokens end (it then reads 16-bit documents with bulk
    /// tensor copies; without it, per-thread async copies).
    MaxSimParams params(const MaxSimCase& c, const MaxSimData& d, float* d_scores, bool tma = true) const {
        MaxSimParams p = d.params(c, d_scores);
        p.n_tokens = tma ? d.doc_offsets.back() : -1;
        p.queries = q.d;
        p.doc_tokens = docs.d;
        p.doc_offsets = offs.d;
        p.query_lens = d.query_lens.empty() ? nullptr : qlens.d;
        p.cand_offsets = c.ragged ? cand_offs.d : nullptr;
        p.cand_docs = c.ragged ? cand_docs.d : nullptr;
        return p;
    }
};

std::string describe(const MaxSimCase& c) {
    return "case " + c.name + " seed " + std::to_string(c.seed) + " nq " + std::to_string(c.n_queries) + " q_stride " +
           std::to_string(c.q_stride) + " dim " + std::to_string(c.dim) + " docs " + std::to_string(c.doc_lens.size()) +
           " dtypes " + DTypeName(c.q_dtype) + "/" + DTypeName(c.d_dtype);
}

/// Segment [begin, end) of the score layout for query q.
std::pair<int64_t, int64_t> segment(const MaxSimCase& c, const MaxSimData& d, int q) {
    if (c.ragged) return {d.cand_offsets[q], d.cand_offsets[q + 1]};
    const int64_t n = static_cast<int64_t>(c.doc_lens.size());
    return {q * n, (q + 1) * n};
}

int32_t doc_at(const MaxSimCase& c, const MaxSimData& d, int64_t pos, int64_t seg_begin) {
    return c.ragged ? d.cand_docs[pos] : static_cast<int32_t>(pos - seg_begin);
}

TEST(MaxSimCuda, MatchesRefOnEveryCase) {
    SKIP_WITHOUT_GPU();
    for (const MaxSimCase& c : testing::maxsim_cases()) {
        SCOPED_TRACE(describe(c));
        const MaxSimData d = testing::make_data(c);
        std::vector<float> host_scores(1);
        const MaxSimParams hp = d.params(c, host_scores.data());
        const int64_t n_out = kernels::maxsim_num_scores(hp);
        std::vector<double> ref(std::max<int64_t>(1, n_out));
        ASSERT_TRUE(kernels::maxsim_ref(hp, ref.data()).ok());
        const std::vector<float> naive = testing::naive_f32(c, d);

        DeviceCase dc(c, d);
        // The queries again 4 bytes into a buffer: not 16-byte aligned, so the kernel fills the
        // query rows one value a load instead of 16 bytes a load.
        std::vector<uint8_t> shifted(4, 0);
        shifted.insert(shifted.end(), d.q_bytes.begin(), d.q_bytes.end());
        const DevBuf<uint8_t> q_shifted(shifted);
        // Per-thread async copies, bulk tensor copies, bulk tensor copies with unaligned queries;
        // each copy path also with static documents (first document loads before the wait).
        static const char* const kVariants[] = {"cp.async", "tma", "tma, queries not 16-byte aligned",
                                                "tma, static documents", "cp.async, static documents"};
        for (int variant = 0; variant < 5; ++variant) {
            SCOPED_TRACE(kVariants[variant]);
            std::vector<float> poison(std::max<int64_t>(1, n_out), std::nanf(""));
            DevBuf<float> out(poison);
            MaxSimParams p = dc.params(c, d, out.d, variant != 0 && variant != 4);
            if (variant == 2) p.queries = q_shifted.d + 4;
            p.docs_static = variant >= 3;
            const Status st = kernels::maxsim_cuda(p, nullptr);
            ASSERT_TRUE(st.ok()) << st.ToString();
            CUDA_OK(cudaDeviceSynchronize());
            const std::vector<float> got = out.get();
            for (int64_t i = 0; i < n_out; ++i) {
                const double allowed = testing::allowed_error(std::fabs(double(naive[i]) - ref[i]), ref[i]);
                ASSERT_LE(std::fabs(double(got[i]) - ref[i]), allowed)
                    << "score " << i << " got " << got[i] << " ref " << ref[i] << " naive " << naive[i];
            }
        }
    }
}

TEST(MaxSimCuda, TopKMatchesRefTieAware) {
    SKIP_WITHOUT_GPU();
    for (const MaxSimCase& c : testing::maxsim_cases()) {
        const MaxSimData d = testing::make_data(c);
        std::vector<float> host_scores(1);
        const MaxSimParams hp = d.params(c, host_scores.data());
        const int64_t n_out = kernels::maxsim_num_scores(hp);
        std::vector<double> ref(std::max<int64_t>(1, n_out));
        ASSERT_TRUE(kernels::maxsim_ref(hp, ref.data()).ok());
        const std::vector<float> naive = testing::naive_f32(c, d);
        DeviceCase dc(c, d);
        for (int k : {1, 5, 1000}) {
            SCOPED_TRACE(describe(c) + " k " + std::to_string(k));
            MaxSimParams p = dc.params(c, d, nullptr, /*tma=*/k != 5);
            p.docs_static = k == 1000;
            const size_t ws_bytes = kernels::maxsim_topk_cuda_workspace_bytes(p, k);
            DevBuf<uint8_t> ws(ws_bytes + 256);
            DevBuf<int32_t> ids(size_t(c.n_queries) * k);
            DevBuf<float> sc(size_t(c.n_queries) * k);
            const Status st = kernels::maxsim_topk_cuda(p, k, ids.d, sc.d, ws.d, ws_bytes, nullptr);
            ASSERT_TRUE(st.ok()) << st.ToString();
            CUDA_OK(cudaDeviceSynchronize());
            const std::vector<int32_t> got_ids = ids.get();
            const std::vector<float> got_sc = sc.get();
            for (int q = 0; q < c.n_queries; ++q) {
                const auto [b, e] = segment(c, d, q);
                // Reference: top-k of the fp64 scores (as float), ids = document indices.
                std::vector<float> seg_scores;
                std::vector<int32_t> seg_ids;
                std::map<int32_t, double> ref_of;
                std::map<int32_t, int> copies;
                double tol = 0;
                for (int64_t i = b; i < e; ++i) {
                    const int32_t doc = doc_at(c, d, i, b);
                    seg_scores.push_back(static_cast<float>(ref[i]));
                    seg_ids.push_back(doc);
                    ref_of[doc] = ref[i];
                    copies[doc]++;
                    tol = std::max(tol, testing::allowed_error(std::fabs(double(naive[i]) - ref[i]), ref[i]));
                }
                std::vector<int32_t> want_ids(k);
                std::vector<float> want_sc(k);
                kernels::TopKParams tp;
                tp.scores = seg_scores.data();
                tp.row_len = static_cast<int64_t>(seg_scores.size());
                tp.n_segments = 1;
                tp.ids = seg_ids.data();
                tp.k = k;
                tp.out_ids = want_ids.data();
                tp.out_scores = want_sc.data();
                ASSERT_TRUE(kernels::topk_ref(tp).ok());
                std::map<int32_t, int> seen;
                for (int j = 0; j < k; ++j) {
                    const int32_t id = got_ids[size_t(q) * k + j];
                    const float s = got_sc[size_t(q) * k + j];
                    if (want_ids[j] < 0) {
                        ASSERT_EQ(id, -1) << "q " << q << " slot " << j;
                        ASSERT_TRUE(std::isinf(s) && s < 0) << "q " << q << " slot " << j;
                        continue;
                    }
                    ASSERT_GE(id, 0) << "q " << q << " slot " << j;
                    ASSERT_TRUE(ref_of.count(id)) << "q " << q << " id " << id << " not a candidate";
                    ASSERT_LE(++seen[id], copies[id]) << "q " << q << " duplicate id " << id;
                    ASSERT_LE(std::fabs(ref_of[id] - double(want_sc[j])), 2 * tol) << "q " << q << " slot " << j;
                    ASSERT_LE(std::fabs(double(s) - ref_of[id]), tol) << "q " << q << " slot " << j;
                    if (j > 0) {
                        const float prev = got_sc[size_t(q) * k + j - 1];
                        ASSERT_TRUE(prev > s || (prev == s && got_ids[size_t(q) * k + j - 1] <= id))
                            << "q " << q << " slot " << j << " not sorted";
                    }
                }
            }
        }
    }
}

/// maxsim_cuda is a programmatic dependent launch: its CTAs may start while the stream's previous
/// kernel still runs. Queries and documents written by that kernel (two sets in turn, each
/// copied in late by a kernel that released its dependents at its start) must give the scores
/// of a plain, synchronised launch on the same inputs, bit for bit.
TEST(MaxSimCuda, ReadsInputsThePreviousKernelWrites) {
    SKIP_WITHOUT_GPU();
    MaxSimCase c1{"pdl_a",     3,           32,    128, testing::ragged_lens(4000, 1, 200, 5), {}, false,
                  DType::kF16, DType::kF16, false, 21};
    MaxSimCase c2 = c1;
    c2.name = "pdl_b";
    c2.seed = 22;
    const MaxSimData d1 = testing::make_data(c1), d2 = testing::make_data(c2);
    ASSERT_EQ(d1.q_bytes.size(), d2.q_bytes.size());
    ASSERT_EQ(d1.d_bytes.size(), d2.d_bytes.size());
    ASSERT_EQ(d1.q_bytes.size() % 4, 0u);
    ASSERT_EQ(d1.d_bytes.size() % 4, 0u);
    DeviceCase src1(c1, d1), src2(c2, d2), dst(c1, d1);  // the sets have the same lengths
    const int64_t n_out = int64_t(c1.n_queries) * int64_t(c1.doc_lens.size());
    test::expect_reads_late_inputs(
        size_t(n_out), 4,
        [&](int r, cudaStream_t st) {
            const DeviceCase& src = r % 2 ? src2 : src1;
            late_copy<<<4, 256, 0, st>>>(
                reinterpret_cast<uint32_t*>(dst.q.d), reinterpret_cast<const uint32_t*>(src.q.d),
                int64_t(d1.q_bytes.size() / 4), reinterpret_cast<uint32_t*>(dst.docs.d),
                reinterpret_cast<const uint32_t*>(src.docs.d), int64_t(d1.d_bytes.size() / 4), 100000);
        },
        [&](int, float* out, cudaStream_t st) { return kernels::maxsim_cuda(dst.params(c1, d1, out), st); });
}

/// With docs_static, a dense call loads its first document offsets and copies before waiting for
/// the previous kernel: queries that kernel writes (two sets in turn, copied in late) must still
/// give the scores of a plain, synchronised launch, bit for bit. Documents of equal lengths (the
/// kernel's guessed first copies) and of unequal ones (its balanced walk).
TEST(MaxSimCuda, StaticDocumentsStillWaitForTheQueries) {
    SKIP_WITHOUT_GPU();
    for (const bool equal : {true, false}) {
        SCOPED_TRACE(equal ? "equal lengths" : "unequal lengths");
        // 36,000 documents: enough for the balanced walk on an H200 (16 a warp of the grid).
        const std::vector<int> lens = equal ? std::vector<int>(36000, 8) : testing::ragged_lens(36000, 1, 16, 5);
        MaxSimCase c1{"pdl_static_a", 2, 32, 128, lens, {}, false, DType::kF16, DType::kF16, false, 23};
        MaxSimCase c2 = c1;
        c2.name = "pdl_static_b";
        c2.seed = 24;
        const MaxSimData d1 = testing::make_data(c1), d2 = testing::make_data(c2);
        ASSERT_EQ(d1.q_bytes.size(), d2.q_bytes.size());
        ASSERT_EQ(d1.q_bytes.size() % 4, 0u);
        DeviceCase src1(c1, d1), src2(c2, d2), dst(c1, d1);  // dst keeps d1's documents throughout
        const int64_t n_out = int64_t(c1.n_queries) * int64_t(c1.doc_lens.size());
        test::expect_reads_late_inputs(
            size_t(n_out), 4,
            [&](int r, cudaStream_t st) {
                const DeviceCase& src = r % 2 ? src2 : src1;
                late_copy<<<4, 256, 0, st>>>(reinterpret_cast<uint32_t*>(dst.q.d),
                                             reinterpret_cast<const uint32_t*>(src.q.d), int64_t(d1.q_bytes.size() / 4),
                                             nullptr, nullptr, 0, 100000);
            },
            [&](int, float* out, cudaStream_t st) {
                MaxSimParams p = dst.params(c1, d1, out);
                p.docs_static = true;
                return kernels::maxsim_cuda(p, st);
            });
    }
}

/// The kernels take a stream and never allocate or synchronise: a batch (scores, then the top-k
/// with its merge rounds) captured into a CUDA graph and replayed twice gives, bit for bit, what
/// the same calls give directly.
TEST(MaxSimCuda, CapturesIntoACudaGraph) {
    SKIP_WITHOUT_GPU();
    for (const bool ragged : {false, true}) {
        SCOPED_TRACE(ragged ? "ragged" : "dense");
        const MaxSimCase c{"graph",     5,           32,    128, testing::ragged_lens(3000, 1, 200, 9), {}, ragged,
                           DType::kF32, DType::kF16, false, 41};
        const MaxSimData d = testing::make_data(c);
        std::vector<float> host_scores(1);
        const int64_t n_out = kernels::maxsim_num_scores(d.params(c, host_scores.data()));
        const DeviceCase dc(c, d);
        const int k = 10;
        const size_t ws_bytes = kernels::maxsim_topk_cuda_workspace_bytes(dc.params(c, d, nullptr), k);
        struct Out {
            DevBuf<float> scores, top;
            DevBuf<int32_t> ids;
            DevBuf<uint8_t> ws;
            Out(int64_t n, int nk, size_t w) : scores(size_t(n)), top(size_t(nk)), ids(size_t(nk)), ws(w) {}
        };
        const auto enqueue = [&](Out& o, cudaStream_t st) -> Status {
            const MaxSimParams p = dc.params(c, d, o.scores.d);
            TMS_RETURN_IF_ERROR(kernels::maxsim_cuda(p, st));
            return kernels::maxsim_topk_cuda(p, k, o.ids.d, o.top.d, o.ws.d, ws_bytes, st);
        };
        cudaStream_t st = nullptr;
        CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        Out direct(n_out, c.n_queries * k, ws_bytes), replay(n_out, c.n_queries * k, ws_bytes);
        ASSERT_TRUE(enqueue(direct, st).ok());
        CUDA_OK(cudaStreamSynchronize(st));
        cudaGraph_t graph = nullptr;
        CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        const Status captured = enqueue(replay, st);
        CUDA_OK(cudaStreamEndCapture(st, &graph));
        ASSERT_TRUE(captured.ok()) << captured.ToString();
        cudaGraphExec_t exec = nullptr;
        CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
        for (int rep = 0; rep < 2; ++rep) {
            SCOPED_TRACE("replay " + std::to_string(rep));
            CUDA_OK(cudaMemsetAsync(replay.scores.d, 0xff, size_t(n_out) * sizeof(float), st));
            CUDA_OK(cudaMemsetAsync(replay.ids.d, 0x7f, size_t(c.n_queries) * k * sizeof(int32_t), st));
            CUDA_OK(cudaMemsetAsync(replay.top.d, 0x7f, size_t(c.n_queries) * k * sizeof(float), st));
            CUDA_OK(cudaGraphLaunch(exec, st));
            CUDA_OK(cudaStreamSynchronize(st));
            EXPECT_EQ(replay.scores.get(), direct.scores.get());
            EXPECT_EQ(replay.ids.get(), direct.ids.get());
            EXPECT_EQ(replay.top.get(), direct.top.get());
        }
        CUDA_OK(cudaGraphExecDestroy(exec));
        CUDA_OK(cudaGraphDestroy(graph));
        CUDA_OK(cudaStreamDestroy(st));
    }
}

TEST(MaxSimCuda, UnsupportedDimIsNotSupported) {
    MaxSimParams p;
    p.n_queries = 1;
    p.q_stride = 4;
    p.dim = 48;  // a multiple of 8 (fine on CPU) but not of 32
    float dummy = 0;
    p.queries = &dummy;
    p.scores = &dummy;
    EXPECT_EQ(kernels::maxsim_cuda(p, nullptr).code(), Status::Code::kNotSupported);
    p.dim = 1056;
    EXPECT_EQ(kernels::maxsim_cuda(p, nullptr).code(), Status::Code::kNotSupported);
    p.dim = 128;
    p.q_stride = 257;
    EXPECT_EQ(kernels::maxsim_cuda(p, nullptr).code(), Status::Code::kNotSupported);
}

TEST(MaxSimCuda, DeviceCountNeverFails) {
    int n = -1;
    EXPECT_TRUE(kernels::cuda_device_count(&n).ok());
    EXPECT_GE(n, 0);
}

/// fp16 documents of the given lengths (random rows) on a GpuExactScorer, and nq random
/// candidate lists of n_cand(q) documents each.
struct ExactShard {
    std::vector<int64_t> offs, cand_offs;
    std::vector<int32_t> cand;
    std::vector<uint8_t> dbytes;
    std::unique_ptr<engine::GpuExactScorer> scorer;
    /// The host parameters of fp32 queries qf [nq, q_stride, dim] against these documents (the
    /// CPU reference's input), over the candidate lists or (ragged false) all documents.
    kernels::MaxSimParams params(const std::vector<float>& qf, int nq, int q_stride, int dim, const int32_t* qlens,
                                 bool ragged) const {
        kernels::MaxSimParams p;
        p.queries = qf.data();
        p.q_dtype = DType::kF32;
        p.n_queries = nq;
        p.q_stride = q_stride;
        p.dim = dim;
        p.query_lens = qlens;
        p.doc_tokens = dbytes.data();
        p.d_dtype = DType::kF16;
        p.doc_offsets = offs.data();
        p.n_docs = int64_t(offs.size()) - 1;
        p.cand_offsets = ragged ? cand_offs.data() : nullptr;
        p.cand_docs = ragged ? cand.data() : nullptr;
        return p;
    }
};

Status make_exact_shard(const std::vector<int>& lens, int dim, int nq, const std::function<int(int)>& n_cand,
                        std::mt19937* rng, ExactShard* s) {
    s->offs.assign(1, 0);
    for (int l : lens) s->offs.push_back(s->offs.back() + l);
    std::vector<float> df;
    testing::fill_rows(&df, s->offs.back(), dim, rng);
    testing::encode(&df, DType::kF16, &s->dbytes);
    s->cand_offs.assign(1, 0);
    s->cand.clear();
    std::uniform_int_distribution<int> pick(0, int(lens.size()) - 1);
    for (int q = 0; q < nq; ++q) {
        for (int i = 0, n = n_cand(q); i < n; ++i) s->cand.push_back(pick(*rng));
        s->cand_offs.push_back(static_cast<int64_t>(s->cand.size()));
    }
    return engine::GpuExactScorer::Create(test::TestGpuContext(), reinterpret_cast<const uint16_t*>(s->dbytes.data()),
                                          s->offs.back(), dim, s->offs.data(), int64_t(lens.size()), &s->scorer);
}

TEST(GpuExactScorerCuda, MatchesCpuScoresAndTopK) {
    SKIP_WITHOUT_GPU();
    const uint32_t seed = 77;
    std::mt19937 rng(seed);
    const int dim = 128, n_docs = 3000, nq = 5, q_stride = 32, k = 10;
    std::vector<int> lens = testing::ragged_lens(n_docs, 1, 200, seed);
    lens[7] = 0;
    ExactShard sh;
    const Status st = make_exact_shard(
        lens, dim, nq, [](int q) { return q == 2 ? 0 : 500 + 300 * q; }, &rng, &sh);
    ASSERT_TRUE(st.ok()) << st.ToString();
    const std::vector<int64_t>& cand_offs = sh.cand_offs;
    const std::vector<int32_t>& cand = sh.cand;
    engine::GpuExactScorer* scorer = sh.scorer.get();
    std::vector<float> qf;
    testing::fill_rows(&qf, int64_t(nq) * q_stride, dim, &rng);
    std::vector<int32_t> qlens{32, 1, 0, 17, 32};
    for (bool ragged : {true, false}) {
        SCOPED_TRACE(std::string("seed 77 ragged ") + (ragged ? "yes" : "no"));
        const int64_t* co = ragged ? cand_offs.data() : nullptr;
        const int32_t* cd = ragged ? cand.data() : nullptr;
        kernels::MaxSimParams p = sh.params(qf, nq, q_stride, dim, qlens.data(), ragged);
        std::vector<float> cpu(kernels::maxsim_num_scores(p));
        p.scores = cpu.data();
        ASSERT_TRUE(kernels::maxsim_cpu(p).ok());
        std::vector<float> gpu;
        const Status st_score = scorer->Score(qf.data(), nq, q_stride, qlens.data(), co, cd, &gpu);
        ASSERT_TRUE(st_score.ok()) << st_score.ToString();
        ASSERT_EQ(gpu.size(), cpu.size());
        for (size_t i = 0; i < cpu.size(); ++i) ASSERT_NEAR(gpu[i], cpu[i], 2e-4 * (1 + std::fabs(cpu[i]))) << i;
        std::vector<int32_t> want_ids(size_t(nq) * k), got_ids;
        std::vector<float> want_sc(size_t(nq) * k), got_sc;
        kernels::TopKParams tp;
        tp.scores = cpu.data();
        tp.offsets = co;
        tp.row_len = ragged ? 0 : n_docs;
        tp.n_segments = nq;
        tp.ids = cd;
        tp.k = k;
        tp.out_ids = want_ids.data();
        tp.out_scores = want_sc.data();
        ASSERT_TRUE(kernels::topk_cpu(tp).ok());
        const Status st_topk = scorer->ScoreTopK(qf.data(), nq, q_stride, qlens.data(), co, cd, k, &got_ids, &got_sc);
        ASSERT_TRUE(st_topk.ok()) << st_topk.ToString();
        ASSERT_EQ(got_ids.size(), want_ids.size());
        for (size_t j = 0; j < want_ids.size(); ++j) {
            if (want_ids[j] < 0) {
                EXPECT_EQ(got_ids[j], -1) << j;
                continue;
            }
            EXPECT_NEAR(got_sc[j], want_sc[j], 2e-4 * (1 + std::fabs(want_sc[j]))) << j;
        }
    }
    // fp16 and bf16 queries, uploaded as they are, against the same values given as fp32: the
    // same scores (fp16 queries take the one-MMA path, the fp32 ones the split path, whose low
    // terms are then 0) and the same top-k.
    for (const DType t : {DType::kF16, DType::kBF16}) {
        SCOPED_TRACE(t == DType::kF16 ? "fp16 queries" : "bf16 queries");
        std::vector<float> qr = qf;
        std::vector<uint8_t> raw;
        testing::encode(&qr, t, &raw);
        std::vector<float> s32, s16;
        ASSERT_TRUE(scorer->Score(qr.data(), nq, q_stride, qlens.data(), cand_offs.data(), cand.data(), &s32).ok());
        ASSERT_TRUE(scorer->Score(raw.data(), t, nq, q_stride, qlens.data(), cand_offs.data(), cand.data(), &s16).ok());
        ASSERT_EQ(s16.size(), s32.size());
        for (size_t i = 0; i < s32.size(); ++i) ASSERT_NEAR(s16[i], s32[i], 1e-6 * (1 + std::fabs(s32[i]))) << i;
        std::vector<int32_t> i32, i16;
        std::vector<float> t32, t16;
        ASSERT_TRUE(scorer->ScoreTopK(qr.data(), nq, q_stride, qlens.data(), nullptr, nullptr, k, &i32, &t32).ok());
        ASSERT_TRUE(scorer->ScoreTopK(raw.data(), t, nq, q_stride, qlens.data(), nullptr, nullptr, k, &i16, &t16).ok());
        EXPECT_EQ(i16, i32);
    }
}

// Batches large enough to go through the scorer's pinned stages (kernels::MakeQueryUploader:
// copies of 1 MB or more, in 1 MB pieces): 700 queries of 32 x 128 fp32 rows (11.5 MB, twelve
// pieces, both stages reused) and 140,000 candidates (0.56 MB, straight). Two batches in a row
// with different queries: the second must not score the first's rows.
TEST(GpuExactScorerCuda, LargeBatchesThroughPinnedStages) {
    SKIP_WITHOUT_GPU();
    const uint32_t seed = 78;
    std::mt19937 rng(seed);
    const int dim = 128, n_docs = 800, nq = 700, q_stride = 32, per_query = 200;
    ExactShard sh;
    const Status st = make_exact_shard(
        testing::ragged_lens(n_docs, 1, 20, seed), dim, nq, [](int) { return per_query; }, &rng, &sh);
    ASSERT_TRUE(st.ok()) << st.ToString();
    const std::vector<int64_t>& cand_offs = sh.cand_offs;
    const std::vector<int32_t>& cand = sh.cand;
    for (int batch = 0; batch < 2; ++batch) {
        SCOPED_TRACE("batch " + std::to_string(batch));
        std::vector<float> qf;
        testing::fill_rows(&qf, int64_t(nq) * q_stride, dim, &rng);
        kernels::MaxSimParams p = sh.params(qf, nq, q_stride, dim, nullptr, /*ragged=*/true);
        std::vector<float> cpu(kernels::maxsim_num_scores(p));
        p.scores = cpu.data();
        ASSERT_TRUE(kernels::maxsim_cpu(p).ok());
        std::vector<float> gpu;
        const Status st_score = sh.scorer->Score(qf.data(), nq, q_stride, nullptr, cand_offs.data(), cand.data(), &gpu);
        ASSERT_TRUE(st_score.ok()) << st_score.ToString();
        ASSERT_EQ(gpu.size(), cpu.size());
        for (size_t i = 0; i < cpu.size(); ++i) ASSERT_NEAR(gpu[i], cpu[i], 2e-4 * (1 + std::fabs(cpu[i]))) << i;
    }
}

}  // namespace
}  // namespace tms

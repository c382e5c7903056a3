// Copyright TileMaxSim authors. Candidate-generation ops on the GPU equal the spec (the table of
// tests/kernels/candidates_cases.h).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "kernels/cuda/candidates_cuda.h"
#include "tests/kernels/candidates_cases.h"
#include "tests/kernels/cuda_test_util.h"

namespace tms {
namespace {

TEST(IvfUnionCuda, EqualsReferenceOnEveryCase) {
    SKIP_WITHOUT_GPU();
    for (const test::UnionCase& c : test::UnionCases()) {
        const test::UnionData d = test::MakeUnionData(c);
        std::vector<int64_t> ro;
        std::vector<int32_t> rd;
        ASSERT_TRUE(kernels::ivf_union_ref(d.p, &ro, &rd).ok()) << c.name;
        test::DevBuf<int32_t> probe(d.probe), lens(d.lens), ivf_docs(d.ivf_docs);
        test::DevBuf<int64_t> ivf_off(d.ivf_off);
        test::DevBuf<uint32_t> allow(d.allow.empty() ? std::vector<uint32_t>(1, 0u) : d.allow);
        kernels::IvfUnionParams p = d.p;
        if (p.allow) p.allow = allow.d;
        p.probe = probe.d;
        p.query_lens = d.p.query_lens ? lens.d : nullptr;
        p.ivf_offsets = ivf_off.d;
        p.ivf_docs = ivf_docs.d;
        const int64_t words = kernels::bitmap_words(c.n_docs);
        test::DevBuf<uint32_t> bits(std::vector<uint32_t>(size_t(std::max<int64_t>(1, c.n_queries * words)), 0u));
        test::DevBuf<int64_t> counts(std::vector<int64_t>(size_t(c.n_queries) + 1, 0));
        ASSERT_TRUE(kernels::ivf_mark_cuda(p, bits.d, nullptr).ok()) << c.name;
        ASSERT_TRUE(kernels::bit_count_cuda(bits.d, words, c.n_queries, counts.d, nullptr).ok()) << c.name;
        std::vector<int64_t> h(size_t(c.n_queries) + 1, 0), off(1, 0);
        CUDA_OK(cudaMemcpy(h.data(), counts.d, h.size() * sizeof(int64_t), cudaMemcpyDeviceToHost));
        for (int q = 0; q < c.n_queries; ++q) off.push_back(off.back() + h[q]);
        EXPECT_EQ(off, ro) << c.name;
        test::DevBuf<int64_t> doff(off);
        test::DevBuf<int32_t> docs(std::vector<int32_t>(size_t(std::max<int64_t>(1, off.back())), -1));
        ASSERT_TRUE(kernels::bit_emit_cuda(bits.d, words, c.n_queries, doff.d, docs.d, nullptr).ok()) << c.name;
        std::vector<int32_t> got(size_t(off.back()));
        CUDA_OK(cudaMemcpy(got.data(), docs.d, got.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
        EXPECT_EQ(got, rd) << c.name;
    }
}

// The three device steps, then the host's cut of each emitted list to its `keep` best, against
// the spec: the same documents with the same fixed-point scores, in the same order.
TEST(ProbeScoresCuda, EqualsReferenceOnEveryCase) {
    SKIP_WITHOUT_GPU();
    for (const test::UnionCase& c : test::UnionCases()) {
        for (const int keep : {0, 1, 7, 1000}) {
            SCOPED_TRACE(c.name + ", keep " + std::to_string(keep));
            const test::ProbeData d = test::MakeProbeData(c, keep);
            std::vector<int64_t> ro;
            std::vector<int32_t> rd;
            std::vector<uint32_t> rs;
            ASSERT_TRUE(kernels::probe_scores_ref(d.p, &ro, &rd, &rs).ok());
            test::DevBuf<int32_t> probe(d.u.probe), lens(d.u.lens), ivf_docs(d.u.ivf_docs);
            test::DevBuf<int64_t> ivf_off(d.u.ivf_off);
            test::DevBuf<float> scores(d.scores), floors(d.floors);
            test::DevBuf<uint32_t> allow(d.u.allow.empty() ? std::vector<uint32_t>(1, 0u) : d.u.allow);
            kernels::ProbeScoreParams p = d.p;
            if (p.lists.allow) p.lists.allow = allow.d;
            p.lists.probe = probe.d;
            p.lists.query_lens = d.p.lists.query_lens ? lens.d : nullptr;
            p.lists.ivf_offsets = ivf_off.d;
            p.lists.ivf_docs = ivf_docs.d;
            p.probe_scores = scores.d;
            p.floor_scores = floors.d;
            const int nq = c.n_queries;
            test::DevBuf<int32_t> rix(
                std::vector<int32_t>(size_t(c.n_centroids) * (kernels::probe_ranges(c.n_docs) + 1) + 1));
            test::DevBuf<uint32_t> dense(std::vector<uint32_t>(size_t(std::max<int64_t>(1, nq * c.n_docs)), 7u));
            test::DevBuf<uint32_t> hist(std::vector<uint32_t>(size_t(std::max(1, nq * kernels::kProbeBins)), 0u));
            test::DevBuf<uint32_t> thr(std::vector<uint32_t>(size_t(nq) + 1, 0u)),
                cursor(std::vector<uint32_t>(size_t(nq) + 1, 0u));
            test::DevBuf<int64_t> counts(std::vector<int64_t>(size_t(nq) + 1, 0));
            ASSERT_TRUE(
                kernels::ivf_range_index_cuda(ivf_off.d, ivf_docs.d, c.n_centroids, c.n_docs, rix.d, nullptr).ok());
            ASSERT_TRUE(kernels::probe_accumulate_cuda(p, rix.d, dense.d, hist.d, nullptr).ok());
            ASSERT_TRUE(kernels::probe_threshold_cuda(hist.d, nq, keep, thr.d, counts.d, nullptr).ok());
            std::vector<int64_t> h(size_t(nq) + 1, 0), off(1, 0);
            CUDA_OK(cudaMemcpy(h.data(), counts.d, h.size() * sizeof(int64_t), cudaMemcpyDeviceToHost));
            for (int q = 0; q < nq; ++q) off.push_back(off.back() + h[q]);
            test::DevBuf<int64_t> doff(off);
            test::DevBuf<int32_t> docs(std::vector<int32_t>(size_t(std::max<int64_t>(1, off.back())), -1));
            test::DevBuf<float> out(std::vector<float>(size_t(std::max<int64_t>(1, off.back())), -1.f));
            ASSERT_TRUE(
                kernels::probe_emit_cuda(dense.d, nq, c.n_docs, thr.d, doff.d, cursor.d, docs.d, out.d, nullptr).ok());
            std::vector<int32_t> gd(size_t(off.back()));
            std::vector<float> gs(gd.size());
            CUDA_OK(cudaMemcpy(gd.data(), docs.d, gd.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(gs.data(), out.d, gs.size() * sizeof(float), cudaMemcpyDeviceToHost));
            for (int q = 0; q < nq; ++q) {
                const int64_t want = ro[q + 1] - ro[q];
                ASSERT_GE(off[q + 1] - off[q], want) << "query " << q << ": the threshold keeps too few";
                std::vector<std::pair<uint32_t, int32_t>> v;
                for (int64_t i = off[q]; i < off[q + 1]; ++i) v.push_back({uint32_t(gs[size_t(i)]), gd[size_t(i)]});
                std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
                    return a.first > b.first || (a.first == b.first && a.second < b.second);
                });
                for (int64_t j = 0; j < want; ++j) {
                    ASSERT_EQ(v[size_t(j)].second, rd[size_t(ro[q] + j)]) << "query " << q << " rank " << j;
                    ASSERT_EQ(v[size_t(j)].first, rs[size_t(ro[q] + j)]) << "query " << q << " rank " << j;
                }
            }
        }
    }
}

TEST(SplitTf32x3Cuda, EqualsReferenceBitForBit) {
    SKIP_WITHOUT_GPU();
    std::mt19937 rng(5);
    std::normal_distribution<float> g(0, 2);
    for (unsigned lo_parts : {0b010u, 0b100u}) {
        const int rows = 33, dim = 128;
        std::vector<float> x(size_t(rows) * dim), want(size_t(rows) * dim * 3), got(want.size());
        for (float& v : x) v = g(rng);
        kernels::split_tf32x3_ref(x.data(), rows, dim, lo_parts, want.data());
        test::DevBuf<float> dx(x), dout(std::vector<float>(want.size(), 0.f));
        ASSERT_TRUE(kernels::split_tf32x3_cuda(dx.d, rows, dim, lo_parts, dout.d, nullptr).ok());
        CUDA_OK(cudaMemcpy(got.data(), dout.d, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << lo_parts;
    }
}

}  // namespace
}  // namespace tms

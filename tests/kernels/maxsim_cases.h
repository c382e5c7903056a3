// Copyright TileMaxSim authors.
// The one case table for MaxSim and top-k: the CPU tests (maxsim_test.cpp) and the CUDA tests
// (maxsim_cuda_test.cu) both run every case here against the fp64 reference.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/maxsim.h"

namespace tms::testing {

struct MaxSimCase {
    std::string name;
    int n_queries;
    int q_stride;
    int dim;
    std::vector<int> doc_lens;    // one entry per document
    std::vector<int> query_lens;  // empty: every query uses q_stride tokens
    bool ragged;                  // candidate lists (true) or dense all-docs (false)
    DType q_dtype;
    DType d_dtype;
    bool duplicate_docs;  // every second document copies the previous one (exact ties)
    uint32_t seed;
};

inline std::vector<int> ragged_lens(int n, int lo, int hi, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> u(lo, hi);
    std::vector<int> v(n);
    for (int& x : v) x = u(rng);
    return v;
}

// One case a line reads as a table.
// clang-format off
/// Every case the kernels must pass. Dims: every specialised dim of the CUDA path.
inline std::vector<MaxSimCase> maxsim_cases() {
    std::vector<MaxSimCase> c;
    c.push_back({"no_queries", 0, 32, 128, {3, 4}, {}, false, DType::kF32, DType::kF16, false, 1});
    c.push_back({"no_docs", 2, 32, 128, {}, {}, false, DType::kF32, DType::kF16, false, 2});
    c.push_back({"empty_candidate_lists", 3, 32, 128, {5, 6, 7}, {}, true, DType::kF32, DType::kF16, false, 3});
    c.push_back({"one_token_docs", 2, 32, 128, std::vector<int>(40, 1), {}, true, DType::kF32, DType::kF16, false, 4});
    c.push_back({"zero_token_doc", 2, 8, 64, {0, 3, 0, 1}, {}, false, DType::kF32, DType::kF16, false, 5});
    c.push_back({"ragged_lengths", 4, 32, 128, {1, 2, 5, 17, 31, 32, 33, 64, 127, 128, 129, 300},
                 {}, true, DType::kF32, DType::kF16, false, 6});
    c.push_back({"ties_duplicate_docs", 2, 32, 128, std::vector<int>(16, 9), {}, false, DType::kF32,
                 DType::kF16, true, 7});
    c.push_back({"nq1", 3, 1, 128, ragged_lens(30, 1, 60, 8), {}, true, DType::kF32, DType::kF16, false, 8});
    c.push_back({"query_lens_mixed", 4, 40, 128, ragged_lens(25, 1, 90, 9), {40, 1, 0, 17}, true,
                 DType::kF32, DType::kF16, false, 9});
    c.push_back({"nq256", 1, 256, 64, ragged_lens(6, 1, 50, 10), {}, false, DType::kF32, DType::kF16, false, 10});
    // Dense, many documents per GPU slice (hundreds per CTA, so every warp walks several
    // batches), lengths 0..12 including empty documents.
    c.push_back({"many_docs_dense", 2, 32, 32, ragged_lens(70000, 0, 12, 15), {}, false, DType::kF32,
                 DType::kF16, false, 15});
    // Dense documents of equal lengths (the CUDA path's first copies start on the guess that
    // document d owns rows [d*L, (d+1)*L) before the offsets arrive), including a query of
    // length 0 (no walk: the guessed copies must land unused) ...
    c.push_back({"equal_docs_dense", 3, 32, 128, std::vector<int>(3000, 32), {32, 0, 7}, false, DType::kF16,
                 DType::kF16, false, 16});
    c.push_back({"equal_docs_balanced", 2, 32, 32, std::vector<int>(40000, 2), {}, false, DType::kF16, DType::kF16,
                 false, 17});
    // ... and lengths whose total divides evenly although they differ (a wrong guess): a few,
    // and many that alternate 1, 3 (the balance probes then see equal lengths too).
    c.push_back({"equal_total_unequal_docs", 2, 32, 64, {3, 5, 4, 4, 2, 6}, {}, false, DType::kF16, DType::kF16,
                 false, 18});
    std::vector<int> alternating(40000);
    for (size_t i = 0; i < alternating.size(); ++i) alternating[i] = i % 2 ? 3 : 1;
    c.push_back({"alternating_docs_balanced", 2, 32, 32, alternating, {}, false, DType::kF16, DType::kF16, false, 19});
    // dim 128 in 16-bit reads whole rows on the CUDA path (MaxSimTraits::kPair): queries of
    // two row groups (64 + 36 rows: 8-token steps), and bf16 queries and documents.
    c.push_back({"groups_d128", 2, 100, 128, ragged_lens(30, 1, 90, 25), {100, 37}, false, DType::kF16, DType::kF16,
                 false, 25});
    c.push_back({"bf16_both_d128", 2, 32, 128, ragged_lens(40, 1, 70, 26), {}, false, DType::kBF16, DType::kBF16,
                 false, 26});
    for (int dim : {32, 64, 96, 128, 160, 256, 384, 512, 768, 1024}) {
        c.push_back({"dim" + std::to_string(dim), 2, 32, dim, ragged_lens(8, 1, 70, 11 + dim), {}, true,
                     DType::kF32, DType::kF16, false, uint32_t(11 + dim)});
    }
    c.push_back({"f32_docs", 2, 32, 128, ragged_lens(10, 1, 80, 12), {}, true, DType::kF32, DType::kF32, false, 12});
    // fp32 documents: rows of a multiple of 256 bytes (dim % 64 == 0) read in 256-byte units on
    // the CUDA path, with their own query layout (MaxSimTraits::QIndex): every dim class, two
    // row groups, fp16 queries, and equal dense documents (the guessed first copies).
    for (int dim : {64, 96, 256, 768}) {
        c.push_back({"f32_docs_dim" + std::to_string(dim), 2, 32, dim, ragged_lens(9, 1, 70, 40 + dim), {}, true,
                     DType::kF32, DType::kF32, false, uint32_t(40 + dim)});
    }
    c.push_back({"f32_docs_groups", 2, 100, 128, ragged_lens(20, 1, 90, 41), {100, 37}, false, DType::kF32,
                 DType::kF32, false, 41});
    c.push_back({"f32_docs_f16_queries", 2, 32, 192, ragged_lens(12, 1, 80, 42), {}, true, DType::kF16,
                 DType::kF32, false, 42});
    c.push_back({"f32_docs_equal_dense", 2, 32, 128, std::vector<int>(600, 32), {32, 5}, false, DType::kF32,
                 DType::kF32, false, 43});
    c.push_back({"bf16_docs", 2, 32, 128, ragged_lens(10, 1, 80, 13), {}, true, DType::kBF16, DType::kBF16, false,
                 13});
    c.push_back({"f16_queries", 2, 32, 96, ragged_lens(10, 1, 80, 14), {}, false, DType::kF16, DType::kF16, false,
                 14});
    return c;
}
// clang-format on

/// Host data of one case. Values are L2-normalised rows (like ColBERT output), rounded to
/// the case's dtypes; `qf`/`df` hold the exact float values the kernels see.
struct MaxSimData {
    std::vector<uint8_t> q_bytes, d_bytes;
    std::vector<float> qf, df;
    std::vector<int64_t> doc_offsets;
    std::vector<int32_t> query_lens;
    std::vector<int64_t> cand_offsets;
    std::vector<int32_t> cand_docs;

    kernels::MaxSimParams params(const MaxSimCase& c, float* scores) const {
        kernels::MaxSimParams p;
        p.queries = q_bytes.data();
        p.q_dtype = c.q_dtype;
        p.n_queries = c.n_queries;
        p.q_stride = c.q_stride;
        p.dim = c.dim;
        p.query_lens = query_lens.empty() ? nullptr : query_lens.data();
        p.doc_tokens = d_bytes.data();
        p.d_dtype = c.d_dtype;
        p.doc_offsets = doc_offsets.data();
        p.n_docs = static_cast<int64_t>(c.doc_lens.size());
        p.cand_offsets = c.ragged ? cand_offsets.data() : nullptr;
        p.cand_docs = c.ragged ? cand_docs.data() : nullptr;
        p.scores = scores;
        return p;
    }
};

inline void fill_rows(std::vector<float>* v, int64_t rows, int dim, std::mt19937* rng) {
    std::normal_distribution<float> n01(0.f, 1.f);
    v->resize(size_t(rows) * dim);
    for (int64_t r = 0; r < rows; ++r) {
        double norm = 0;
        for (int c = 0; c < dim; ++c) {
            float x = n01(*rng);
            (*v)[r * dim + c] = x;
            norm += double(x) * x;
        }
        const float inv = static_cast<float>(1.0 / std::sqrt(norm));
        for (int c = 0; c < dim; ++c) (*v)[r * dim + c] *= inv;
    }
}

inline void encode(std::vector<float>* f, DType t, std::vector<uint8_t>* bytes) {
    bytes->resize(f->size() * DTypeSize(t));
    for (size_t i = 0; i < f->size(); ++i) {
        if (t == DType::kF32) {
            reinterpret_cast<float*>(bytes->data())[i] = (*f)[i];
        } else {
            uint16_t h = t == DType::kF16 ? kernels::float_to_half((*f)[i]) : kernels::float_to_bf16((*f)[i]);
            reinterpret_cast<uint16_t*>(bytes->data())[i] = h;
            (*f)[i] = t == DType::kF16 ? kernels::half_to_float(h) : kernels::bf16_to_float(h);
        }
    }
}

inline MaxSimData make_data(const MaxSimCase& c) {
    std::mt19937 rng(c.seed);
    MaxSimData d;
    const int n_docs = static_cast<int>(c.doc_lens.size());
    d.doc_offsets.assign(1, 0);
    for (int len : c.doc_lens) d.doc_offsets.push_back(d.doc_offsets.back() + len);
    fill_rows(&d.qf, int64_t(c.n_queries) * c.q_stride, c.dim, &rng);
    fill_rows(&d.df, d.doc_offsets.back(), c.dim, &rng);
    if (c.duplicate_docs) {
        for (int doc = 1; doc < n_docs; doc += 2) {
            if (c.doc_lens[doc] != c.doc_lens[doc - 1]) continue;
            std::copy_n(d.df.begin() + d.doc_offsets[doc - 1] * c.dim, int64_t(c.doc_lens[doc]) * c.dim,
                        d.df.begin() + d.doc_offsets[doc] * c.dim);
        }
    }
    encode(&d.qf, c.q_dtype, &d.q_bytes);
    encode(&d.df, c.d_dtype, &d.d_bytes);
    d.query_lens.assign(c.query_lens.begin(), c.query_lens.end());
    d.cand_offsets.assign(1, 0);
    if (c.ragged) {
        std::uniform_int_distribution<int> pick(0, std::max(0, n_docs - 1));
        for (int q = 0; q < c.n_queries; ++q) {
            // Query 0 of a ragged case gets an empty list when the case name asks for it;
            // otherwise a mix of every document, repeats and a random subset.
            int n = c.name == "empty_candidate_lists" && q != 1 ? 0 : (n_docs ? n_docs + q * 3 : 0);
            for (int i = 0; i < n; ++i) d.cand_docs.push_back(i < n_docs ? (n_docs - 1 - i) : pick(rng));
            d.cand_offsets.push_back(static_cast<int64_t>(d.cand_docs.size()));
        }
    }
    return d;
}

/// Naive fp32 MaxSim (sequential dot products) on the rounded values: the "same precision"
/// baseline of the FlashAttention error rule.
inline std::vector<float> naive_f32(const MaxSimCase& c, const MaxSimData& d) {
    std::vector<float> out;
    auto score = [&](int q, int doc) {
        const int ql = d.query_lens.empty() ? c.q_stride : d.query_lens[q];
        const int64_t b = d.doc_offsets[doc], e = d.doc_offsets[doc + 1];
        if (b == e) return 0.0f;
        float total = 0;
        for (int i = 0; i < ql; ++i) {
            float best = -INFINITY;
            for (int64_t t = b; t < e; ++t) {
                float s = 0;
                for (int k = 0; k < c.dim; ++k)
                    s += d.qf[(int64_t(q) * c.q_stride + i) * c.dim + k] * d.df[t * c.dim + k];
                best = std::max(best, s);
            }
            total += best;
        }
        return total;
    };
    for (int q = 0; q < c.n_queries; ++q) {
        if (c.ragged) {
            for (int64_t k = d.cand_offsets[q]; k < d.cand_offsets[q + 1]; ++k) out.push_back(score(q, d.cand_docs[k]));
        } else {
            for (size_t doc = 0; doc < c.doc_lens.size(); ++doc) out.push_back(score(q, static_cast<int>(doc)));
        }
    }
    return out;
}

/// FlashAttention's rule with a floor for cases where the naive result is exact.
inline double allowed_error(double naive_err, double ref) { return 2.0 * naive_err + 1e-5 * (1.0 + std::fabs(ref)); }

}  // namespace tms::testing

// Copyright TileMaxSim authors. The random corpus the kernel micro-benchmarks score: n_docs
// documents of `len` fp16 tokens and n_queries fp32 queries of q_tokens, all of one dimension.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/maxsim.h"

namespace tms::bench {

struct BenchCorpus {
    int n_queries, q_tokens, dim;
    int64_t n_docs;
    std::vector<uint16_t> docs;    // [n_docs * len, dim] fp16 bits
    std::vector<int64_t> offsets;  // [n_docs + 1]
    std::vector<float> queries;    // [n_queries, q_tokens, dim]

    BenchCorpus(int nq, int qt, int d, int64_t nd, int len, uint32_t seed = 1)
        : n_queries(nq), q_tokens(qt), dim(d), n_docs(nd) {
        std::mt19937 rng(seed);
        std::normal_distribution<float> g(0.f, 1.f);
        docs.resize(size_t(nd) * size_t(len) * size_t(d));
        for (uint16_t& x : docs) x = kernels::float_to_half(0.1f * g(rng));
        offsets.resize(size_t(nd) + 1);
        for (int64_t i = 0; i <= nd; ++i) offsets[size_t(i)] = i * len;
        queries.resize(size_t(nq) * size_t(qt) * size_t(d));
        for (float& x : queries) x = 0.1f * g(rng);
    }
    /// Dense exact MaxSim of every query against every document (host pointers).
    kernels::MaxSimParams Params(float* scores) const {
        kernels::MaxSimParams p;
        p.queries = queries.data();
        p.n_queries = n_queries;
        p.q_stride = q_tokens;
        p.dim = dim;
        p.doc_tokens = docs.data();
        p.doc_offsets = offsets.data();
        p.n_docs = n_docs;
        p.n_tokens = offsets.back();
        p.scores = scores;
        return p;
    }
    int64_t doc_bytes() const { return int64_t(docs.size()) * 2; }
};

}  // namespace tms::bench

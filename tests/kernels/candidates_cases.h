// Copyright TileMaxSim authors. One table of cases for the candidate-generation ops, run by the
// CPU test (ref vs cpu) and the CUDA test (ref vs cuda).
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/candidates.h"

namespace tms::test {

struct UnionCase {
    std::string name;
    int64_t n_docs;
    int n_centroids, n_queries, q_stride, nprobe;
    bool lens;        // ragged query lengths (some 0)
    double no_probe;  // share of probe slots that are -1
    int max_list;     // longest IVF list
    int allow = 0;    // documents allowed (a filter): 0 every one, 1 one bitmap for every query, 2 one per query
};

// One case a line reads as a table.
// clang-format off
inline std::vector<UnionCase> UnionCases() {
    return {
        {"tiny", 5, 3, 2, 2, 2, false, 0.0, 4},
        {"docs_not_multiple_of_32", 1000, 64, 7, 8, 4, false, 0.1, 80},
        {"ragged_lengths_and_gaps", 4097, 256, 16, 32, 8, true, 0.3, 200},
        {"one_query_many_tokens", 70000, 1024, 1, 64, 8, false, 0.0, 600},
        {"lists_hold_everything", 200, 4, 5, 3, 4, false, 0.0, 200},
        {"no_queries", 100, 8, 0, 4, 2, false, 0.0, 10},
        {"nothing_probed", 300, 16, 4, 4, 2, false, 1.0, 30},
        {"lists_across_ranges", 30000, 128, 9, 16, 8, true, 0.1, 3000},
        {"filtered_shared", 4097, 256, 16, 32, 8, true, 0.3, 200, 1},
        {"filtered_per_query", 30000, 128, 9, 16, 8, true, 0.1, 3000, 2},
        {"filtered_one_query_many_tokens", 70000, 1024, 1, 64, 8, false, 0.0, 600, 1},
    };
}
// clang-format on

/// Random IVF lists (sorted, unique) and probes of a case, with its parameters pointing at them.
struct UnionData {
    std::vector<int64_t> ivf_off;
    std::vector<int32_t> ivf_docs, probe, lens;
    std::vector<uint32_t> allow;
    kernels::IvfUnionParams p;
};

inline UnionData MakeUnionData(const UnionCase& c, uint32_t seed = 7) {
    UnionData d;
    std::mt19937 rng(seed);
    d.ivf_off.assign(1, 0);
    for (int k = 0; k < c.n_centroids; ++k) {
        const int len = int(rng() % uint32_t(c.max_list + 1));
        std::vector<int32_t> l;
        for (int i = 0; i < len; ++i) l.push_back(int32_t(rng() % uint64_t(c.n_docs)));
        std::sort(l.begin(), l.end());
        l.erase(std::unique(l.begin(), l.end()), l.end());
        d.ivf_docs.insert(d.ivf_docs.end(), l.begin(), l.end());
        d.ivf_off.push_back(int64_t(d.ivf_docs.size()));
    }
    std::uniform_real_distribution<double> u(0, 1);
    for (int64_t i = 0; i < int64_t(c.n_queries) * c.q_stride * c.nprobe; ++i) {
        d.probe.push_back(u(rng) < c.no_probe ? -1 : int32_t(rng() % uint32_t(c.n_centroids)));
    }
    for (int q = 0; q < c.n_queries; ++q) d.lens.push_back(q % 5 == 4 ? 0 : int32_t(rng() % uint32_t(c.q_stride + 1)));
    d.p.probe = d.probe.data();
    d.p.n_queries = c.n_queries;
    d.p.q_stride = c.q_stride;
    d.p.nprobe = c.nprobe;
    d.p.query_lens = c.lens ? d.lens.data() : nullptr;
    d.p.ivf_offsets = d.ivf_off.data();
    d.p.ivf_docs = d.ivf_docs.data();
    d.p.n_centroids = c.n_centroids;
    d.p.n_docs = c.n_docs;
    if (c.allow) {  // rows of different densities, from nearly none to nearly all
        const int rows = c.allow == 1 ? 1 : c.n_queries;
        const int64_t words = kernels::bitmap_words(c.n_docs);
        d.allow.assign(size_t(rows * words), 0);
        for (int r = 0; r < rows; ++r) {
            const double density = rows == 1 ? 0.3 : double(r % 4) / 3.0 * 0.9 + 0.01;
            for (int64_t doc = 0; doc < c.n_docs; ++doc)
                if (u(rng) < density) d.allow[size_t(r * words + doc / 32)] |= 1u << (doc % 32);
        }
        d.p.allow = d.allow.data();
        d.p.allow_stride = c.allow == 1 ? 0 : words;
    }
    return d;
}

/// A union case with probe scores: each row's probes in descending score order (some tied), its
/// floor at or below the last; probe_scores' parameters point at them.
struct ProbeData {
    UnionData u;
    std::vector<float> scores, floors;
    kernels::ProbeScoreParams p;
};

inline ProbeData MakeProbeData(const UnionCase& c, int keep, uint32_t seed = 11) {
    ProbeData d;
    d.u = MakeUnionData(c, seed);
    std::mt19937 rng(seed + 1);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    const int64_t rows = int64_t(c.n_queries) * c.q_stride;
    d.scores.resize(size_t(rows) * c.nprobe);
    d.floors.resize(size_t(rows));
    for (int64_t r = 0; r < rows; ++r) {
        float s = 0.5f + u(rng);
        for (int j = 0; j < c.nprobe; ++j) {
            if (u(rng) > 0.2f) s -= 0.1f * u(rng);  // else a tie with the previous probe
            d.scores[size_t(r * c.nprobe + j)] = s;
        }
        d.floors[size_t(r)] = r % 7 == 3 ? s : s - 0.05f * u(rng);
    }
    d.p.lists = d.u.p;
    d.p.probe_scores = d.scores.data();
    d.p.floor_scores = d.floors.data();
    d.p.keep = keep;
    return d;
}

}  // namespace tms::test

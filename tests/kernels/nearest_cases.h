// Copyright TileMaxSim authors. One table of cases for the nearest-centroid op, run by the CPU
// test (ref vs cpu) and the CUDA test (ref vs cuda), and the check both apply.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/nearest.h"

namespace tms::test {

struct NearestCase {
    std::string name;
    int64_t n;
    int n_centroids, dim;
    enum Kind { kGauss, kUnit, kDuplicates, kHuge, kTiny } kind;
};

// One case a line reads as a table.
// clang-format off
inline std::vector<NearestCase> NearestCases() {
    using C = NearestCase;
    return {
        {"one_centroid", 5, 1, 128, C::kGauss},
        {"few_centroids_odd_dim", 1000, 7, 33, C::kGauss},
        {"unit_rows_d128", 3001, 1024, 128, C::kUnit},
        {"unit_rows_d96_partial_stage", 700, 1000, 96, C::kUnit},
        {"d16", 513, 300, 16, C::kGauss},
        {"d64_many_rows", 20000, 256, 64, C::kGauss},
        {"duplicate_centroids_lower_id_wins", 2000, 512, 128, C::kDuplicates},
        {"rows_beyond_fp16_range", 600, 200, 128, C::kHuge},
        {"tiny_rows", 600, 200, 128, C::kTiny},
        {"no_rows", 0, 64, 128, C::kGauss},
        {"wide_rows", 300, 50, 200, C::kGauss},  // past the fused CUDA kernel: NotSupported there
    };
}
// clang-format on

struct NearestData {
    std::vector<float> x, c;
};

inline NearestData MakeNearestData(const NearestCase& nc, uint32_t seed = 5) {
    std::mt19937 rng(seed + uint32_t(nc.n_centroids) * 7 + uint32_t(nc.dim));
    std::normal_distribution<float> n01;
    NearestData d;
    d.x.resize(size_t(nc.n) * nc.dim);
    d.c.resize(size_t(nc.n_centroids) * nc.dim);
    for (auto& v : d.x) v = n01(rng);
    for (auto& v : d.c) v = n01(rng);
    auto normalise = [&](std::vector<float>& a) {
        for (size_t r = 0; r < a.size() / nc.dim; ++r) {
            double s = 0;
            for (int j = 0; j < nc.dim; ++j) s += double(a[r * nc.dim + j]) * a[r * nc.dim + j];
            for (int j = 0; j < nc.dim; ++j) a[r * nc.dim + j] = float(a[r * nc.dim + j] / std::sqrt(s));
        }
    };
    if (nc.kind == NearestCase::kUnit || nc.kind == NearestCase::kDuplicates) {
        normalise(d.x);
        normalise(d.c);
    }
    if (nc.kind == NearestCase::kDuplicates) {
        // Centroid k + 256 repeats centroid k, and rows sit on centroids: exact ties everywhere.
        for (int k = 256; k < nc.n_centroids; ++k) {
            std::copy_n(d.c.begin() + size_t(k - 256) * nc.dim, nc.dim, d.c.begin() + size_t(k) * nc.dim);
        }
        for (int64_t i = 0; i < nc.n; ++i) {
            const size_t k = size_t(rng() % uint32_t(nc.n_centroids));
            std::copy_n(d.c.begin() + k * nc.dim, nc.dim, d.x.begin() + size_t(i) * nc.dim);
        }
    }
    if (nc.kind == NearestCase::kHuge) {
        for (auto& v : d.x) v *= 3e5f;
        for (auto& v : d.c) v *= 1e5f;
    }
    if (nc.kind == NearestCase::kTiny) {
        for (auto& v : d.x) v *= 1e-7f;
        for (auto& v : d.c) v *= 1e-3f;
    }
    return d;
}

/// The case's parameters over host or device copies of its rows and centroids.
inline kernels::NearestParams NearestParamsOf(const NearestCase& nc, const float* x, const float* c, uint32_t* labels,
                                              float* best) {
    kernels::NearestParams p;
    p.x = x;
    p.n = nc.n;
    p.dim = nc.dim;
    p.centroids = c;
    p.n_centroids = nc.n_centroids;
    p.labels = labels;
    p.best = best;
    return p;
}

/// got (labels and best scores of a path) against the spec's want: every label in range, its
/// exact score within nearest_tolerance of the best, its best score that score, at most 1% of
/// labels different (near ties), and none where the case has exact ties only.
inline void ExpectNearestAgrees(const NearestCase& nc, const NearestData& d, const std::vector<uint32_t>& want,
                                const std::vector<uint32_t>& got, const std::vector<float>& got_best) {
    double c_norm = 0;
    for (int k = 0; k < nc.n_centroids; ++k) {
        double s = 0;
        for (int j = 0; j < nc.dim; ++j) s += double(d.c[size_t(k) * nc.dim + j]) * d.c[size_t(k) * nc.dim + j];
        c_norm = std::max(c_norm, std::sqrt(s));
    }
    int64_t moved = 0;
    for (int64_t i = 0; i < nc.n; ++i) {
        ASSERT_LT(got[i], uint32_t(nc.n_centroids)) << nc.name << " row " << i;
        const float* x = d.x.data() + size_t(i) * nc.dim;
        auto score = [&](uint32_t k) {
            double s = 0;
            for (int j = 0; j < nc.dim; ++j) s += double(x[j]) * d.c[size_t(k) * nc.dim + j];
            return s;
        };
        double xn = 0;
        for (int j = 0; j < nc.dim; ++j) xn += double(x[j]) * x[j];
        const double tol = kernels::nearest_tolerance(std::sqrt(xn), c_norm);
        const double chosen = score(got[i]), bestv = score(want[i]);
        EXPECT_GE(chosen, bestv - tol) << nc.name << " row " << i;
        EXPECT_NEAR(got_best[i], chosen, tol) << nc.name << " row " << i;
        moved += got[i] != want[i];
    }
    if (nc.kind == NearestCase::kDuplicates) {
        EXPECT_EQ(moved, 0) << nc.name << ": exact ties go to the lower id";
    } else {
        EXPECT_LE(moved, std::max<int64_t>(1, nc.n / 100)) << nc.name << ": more than 1% of rows moved";
    }
}

}  // namespace tms::test

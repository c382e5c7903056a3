// Copyright TileMaxSim authors. GPU nearest-centroid assignment vs the CPU argmax.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "index/gpu_assign.h"
#include "kernels/cuda/maxsim_cuda.h"

namespace tms {
namespace {

TEST(GpuAssignCuda, MatchesCpuArgmaxUpToTf32Ties) {
    int n_dev = 0;
    ASSERT_TRUE(kernels::cuda_device_count(&n_dev).ok());
    if (n_dev == 0) GTEST_SKIP() << "no CUDA device";
    for (const auto [K, dim, n] : {std::tuple{7, 32, 1000}, std::tuple{1024, 128, 70000}, std::tuple{4096, 96, 3000}}) {
        SCOPED_TRACE("K=" + std::to_string(K) + " dim=" + std::to_string(dim) + " n=" + std::to_string(n));
        std::mt19937 rng(K + dim);
        std::normal_distribution<float> n01;
        std::vector<float> c(size_t(K) * dim), x(size_t(n) * dim);
        for (auto& v : c) v = n01(rng);
        for (auto& v : x) v = n01(rng);
        std::unique_ptr<index::GpuAssigner> a;
        ASSERT_TRUE(index::GpuAssigner::Create(0, &a).ok());
        ASSERT_TRUE(a->SetCentroids(c.data(), K, dim).ok());
        std::vector<uint32_t> lab(n);
        std::vector<float> best(n);
        ASSERT_TRUE(a->Assign(x.data(), n, lab.data(), best.data()).ok());
        int mismatches = 0;
        for (int i = 0; i < n; ++i) {
            double bv = -1e30, chosen = 0;
            int bi = 0;
            for (int k = 0; k < K; ++k) {
                double s = 0;
                for (int j = 0; j < dim; ++j) s += double(x[size_t(i) * dim + j]) * c[size_t(k) * dim + j];
                if (s > bv) {
                    bv = s;
                    bi = k;
                }
                if (k == int(lab[i])) chosen = s;
            }
            ASSERT_LT(lab[i], uint32_t(K));
            // TF32 inputs: the chosen centroid must be within TF32 rounding of the best one.
            const double tol = 2e-3 * std::sqrt(double(dim)) * 4.0;
            EXPECT_GE(chosen, bv - tol) << "row " << i;
            EXPECT_NEAR(best[i], chosen, tol);
            mismatches += int(lab[i]) != bi;
        }
        EXPECT_LE(mismatches, n / 100) << "more than 1% of rows moved by TF32 rounding";
    }
}

}  // namespace
}  // namespace tms

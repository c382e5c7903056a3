// Copyright TileMaxSim authors. warp_row_top_n (one-pass register lists for n <= 16, n passes
// above) against the spec on the host: the n best of a row by (score descending, index
// ascending), NaN never picked, index >= K with score -inf once the row runs out. Rows: random,
// heavy ties, NaN and -inf sprinkled, all NaN, all equal; K from 1 to 4097, n from 1 to 64.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/row_select.cuh"
#include "tests/kernels/cuda_test_util.h"

namespace tms {
namespace {

using test::DevBuf;

__global__ void top_n_rows(const float* s, int rows, int K, int n, int* idx, float* val) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    kernels::warp_row_top_n(s + size_t(row) * K, K, n, lane, [&](int p, int bi, float bv) {
        if (lane == 0) {
            idx[size_t(row) * n + p] = bi < K ? bi : -1;
            val[size_t(row) * n + p] = bv;
        }
    });
}

enum class Fill { kRandom, kTies, kNanInf, kAllNan, kAllEqual };

TEST(RowSelectCuda, TopNMatchesSpec) {
    SKIP_WITHOUT_GPU();
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    for (const int K : {1, 5, 31, 32, 33, 300, 4097}) {
        for (const int n : {1, 2, 8, 9, 16, 17, 40, 64}) {
            const std::vector<Fill> fills = {Fill::kRandom, Fill::kTies, Fill::kNanInf, Fill::kAllNan, Fill::kAllEqual};
            const int per = 3, rows = int(fills.size()) * per;
            std::mt19937 rng(uint32_t(K * 100 + n));
            std::normal_distribution<float> n01;
            std::uniform_int_distribution<int> small(0, 2), pick(0, 9);
            std::vector<float> s(size_t(rows) * K);
            for (int r = 0; r < rows; ++r) {
                const Fill f = fills[size_t(r / per)];
                for (int k = 0; k < K; ++k) {
                    float v = n01(rng);
                    if (f == Fill::kTies) v = float(small(rng));
                    if (f == Fill::kNanInf) {
                        const int c = pick(rng);
                        v = c == 0 ? nan : c == 1 ? -inf : c == 2 ? inf : v;
                    }
                    if (f == Fill::kAllNan) v = nan;
                    if (f == Fill::kAllEqual) v = 0.5f;
                    s[size_t(r) * K + k] = v;
                }
            }
            DevBuf<float> d_s(s), d_val(size_t(rows) * n);
            DevBuf<int> d_idx(size_t(rows) * n);
            top_n_rows<<<(rows + 7) / 8, 256>>>(d_s.d, rows, K, n, d_idx.d, d_val.d);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            const std::vector<int> idx = d_idx.get();
            const std::vector<float> val = d_val.get();
            for (int r = 0; r < rows; ++r) {
                std::vector<std::pair<float, int>> ref;
                for (int k = 0; k < K; ++k)
                    if (!std::isnan(s[size_t(r) * K + k])) ref.push_back({s[size_t(r) * K + k], k});
                std::sort(ref.begin(), ref.end(), [](const auto& a, const auto& b) {
                    return a.first > b.first || (a.first == b.first && a.second < b.second);
                });
                for (int p = 0; p < n; ++p) {
                    const int want = p < int(ref.size()) ? ref[size_t(p)].second : -1;
                    const float want_v = p < int(ref.size()) ? ref[size_t(p)].first : -inf;
                    ASSERT_EQ(idx[size_t(r) * n + p], want)
                        << "K " << K << " n " << n << " row " << r << " fill " << r / per << " pick " << p;
                    ASSERT_EQ(val[size_t(r) * n + p], want_v)
                        << "K " << K << " n " << n << " row " << r << " pick " << p;
                }
            }
        }
    }
}

}  // namespace
}  // namespace tms

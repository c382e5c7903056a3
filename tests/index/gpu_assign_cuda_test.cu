// Copyright TileMaxSim authors. GPU nearest-centroid assignment vs the CPU argmax.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "index/encode/gpu_assign.h"
#include "index/encode/encoder.h"
#include "index/index_data.h"
#include "index/train/train.h"
#include "kernels/cuda/maxsim_cuda.h"
#include "kernels/maxsim.h"
#include "tests/kernels/cuda_test_util.h"

namespace tms {
namespace {

// dim 200: past the fused kernel, the GEMM and row argmax.
TEST(GpuAssignCuda, MatchesCpuArgmaxUpToTf32Ties) {
    SKIP_WITHOUT_GPU();
    for (const auto [K, dim, n] : {std::tuple{7, 32, 1000}, std::tuple{1024, 128, 70000}, std::tuple{4096, 96, 3000},
                                   std::tuple{300, 200, 2000}}) {
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

// The GPU encoder against the CPU encoder on the same trained model: centroid ids equal up to
// TF32 near-ties; where they are equal, residual codes are identical and PQ codes equal up to
// float near-ties of the code distances. Several batches (70K rows), every input dtype.
TEST(GpuEncoderCuda, MatchesCpuEncoder) {
    SKIP_WITHOUT_GPU();
    struct Case {
        const char* codec;
        int dim, pq_m, nbits;
        DType dtype;
    };
    const Case cases[] = {{"pq", 128, 16, 0, DType::kF16},      {"pq", 128, 8, 0, DType::kF32},
                          {"pq", 128, 4, 0, DType::kBF16},      {"pq", 128, 2, 0, DType::kF16},
                          {"pq", 96, 12, 0, DType::kF16},       {"residual", 128, 0, 1, DType::kF16},
                          {"residual", 128, 0, 2, DType::kF32}, {"residual", 96, 0, 4, DType::kBF16}};
    for (const Case& c : cases) {
        SCOPED_TRACE(std::string(c.codec) + " dim=" + std::to_string(c.dim) + " m=" + std::to_string(c.pq_m) +
                     " nbits=" + std::to_string(c.nbits) + " dtype=" + DTypeName(c.dtype));
        const int64_t n = 70001;
        std::mt19937 rng(c.dim + c.pq_m + c.nbits);
        std::normal_distribution<float> n01;
        std::vector<float> xf(size_t(n) * c.dim);
        for (auto& v : xf) v = n01(rng);
        std::vector<uint16_t> x16(xf.size());
        for (size_t i = 0; i < xf.size(); ++i) {
            x16[i] = c.dtype == DType::kBF16 ? kernels::float_to_bf16(xf[i]) : kernels::float_to_half(xf[i]);
        }
        const EmbeddingView v{c.dtype == DType::kF32 ? static_cast<const void*>(xf.data()) : x16.data(), c.dtype, n,
                              c.dim};
        IndexBuildOptions o;
        o.codec = c.codec;
        o.pq_m = c.pq_m;
        o.residual_nbits = c.nbits;
        o.n_centroids = 256;
        o.max_train_tokens = 20000;
        o.device = Device::kCpu;
        o.progress = false;
        index::IndexModel m;
        std::vector<std::pair<std::string, double>> phases;
        ASSERT_TRUE(index::TrainModel({v}, o, &m, &phases).ok());
        std::unique_ptr<index::Encoder> cpu;
        ASSERT_TRUE(index::Encoder::Create(m, Device::kCpu, 0, &cpu).ok());
        std::unique_ptr<index::GpuEncoder> gpu;
        ASSERT_TRUE(index::GpuEncoder::Create(m, 0, &gpu).ok());
        const int ncb = m.n_code_bytes;
        std::vector<uint32_t> cc(n), gc(n);
        std::vector<uint8_t> ccode(size_t(n) * ncb), gcode(size_t(n) * ncb);
        ASSERT_TRUE(cpu->Encode(v, 0, n, cc.data(), ccode.data()).ok());
        // Two calls (rows split unevenly) as the builder makes them.
        ASSERT_TRUE(gpu->Encode(v, 0, 40000, gc.data(), gcode.data()).ok());
        ASSERT_TRUE(gpu->Encode(v, 40000, n - 40000, gc.data() + 40000, gcode.data() + size_t(40000) * ncb).ok());
        int64_t moved = 0, code_diff = 0;
        for (int64_t t = 0; t < n; ++t) {
            std::vector<double> row(c.dim);
            for (int j = 0; j < c.dim; ++j) row[j] = kernels::load_as_float(v.data, v.dtype, t * c.dim + j);
            ASSERT_LT(gc[t], uint32_t(m.n_centroids));
            if (gc[t] != cc[t]) {
                auto score = [&](uint32_t k) {
                    double s = 0;
                    for (int j = 0; j < c.dim; ++j) s += row[j] * m.centroids[size_t(k) * c.dim + j];
                    return s;
                };
                EXPECT_NEAR(score(gc[t]), score(cc[t]), 2e-3 * std::sqrt(double(c.dim)) * 4.0) << "row " << t;
                ++moved;
                continue;
            }
            const float* cen = m.centroids.data() + size_t(cc[t]) * c.dim;
            for (int b = 0; b < ncb; ++b) {
                const uint8_t a = ccode[size_t(t) * ncb + b], g = gcode[size_t(t) * ncb + b];
                if (a == g) continue;
                ++code_diff;
                ASSERT_EQ(std::string(c.codec), "pq") << "residual codes differ at row " << t << " byte " << b;
                const int dsub = c.dim / m.pq_m;
                auto dist = [&](int code) {
                    double d = 0;
                    for (int j = 0; j < dsub; ++j) {
                        const double r = double(float(row[b * dsub + j]) - cen[b * dsub + j]);
                        const double e = r - m.codebook[(size_t(b) * 256 + code) * dsub + j];
                        d += e * e;
                    }
                    return d;
                };
                EXPECT_NEAR(dist(g), dist(a), 1e-4) << "row " << t << " sub-quantizer " << b;
            }
        }
        EXPECT_LE(moved, n / 100);
        EXPECT_LE(code_diff, int64_t(n) * ncb / 1000);
        // A non-finite value is reported with its row within the view, in any batch.
        if (c.dtype == DType::kF32) {
            xf[size_t(65600) * c.dim + 5] = std::nanf("");
        } else {
            x16[size_t(65600) * c.dim + 5] = c.dtype == DType::kBF16 ? 0x7fc0 : 0x7e00;  // NaN
        }
        Status st = gpu->Encode(v, 1000, n - 1000, gc.data(), gcode.data());
        ASSERT_FALSE(st.ok());
        EXPECT_EQ(st.message(), "docs: non-finite value (NaN) at row 65600, column 5");
        ASSERT_TRUE(gpu->Encode(v, 0, 1000, gc.data(), gcode.data()).ok()) << "usable after an error";
        // So is a finite value beyond fp16's range (fp32 and bf16 hold them; fp16 cannot).
        if (c.dtype != DType::kF16) {
            if (c.dtype == DType::kF32)
                xf[size_t(65600) * c.dim + 5] = 1e5f;
            else
                x16[size_t(65600) * c.dim + 5] = 0x47c3;  // bf16 99840
            st = gpu->Encode(v, 1000, n - 1000, gc.data(), gcode.data());
            ASSERT_FALSE(st.ok());
            EXPECT_EQ(st.message(), std::string("docs: value ") + (c.dtype == DType::kF32 ? "100000" : "99840") +
                                        " beyond fp16's range (|x| <= 65504; the index stores and scores fp16) at "
                                        "row 65600, column 5");
        }
    }
}

}  // namespace
}  // namespace tms

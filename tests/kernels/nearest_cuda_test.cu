// Copyright TileMaxSim authors. Nearest centroid: the fused CUDA kernel against the spec.
#include <gtest/gtest.h>

#include "kernels/cuda/nearest_cuda.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/nearest_cases.h"

namespace tms {
namespace {

TEST(NearestCuda, AgreesWithReferenceOnEveryCase) {
    SKIP_WITHOUT_GPU();
    for (const test::NearestCase& c : test::NearestCases()) {
        SCOPED_TRACE(c.name);
        const test::NearestData d = test::MakeNearestData(c);
        std::vector<uint32_t> want(size_t(c.n));
        std::vector<float> want_best(size_t(c.n));
        ASSERT_TRUE(
            kernels::nearest_ref(test::NearestParamsOf(c, d.x.data(), d.c.data(), want.data(), want_best.data())).ok());

        test::DevBuf<float> x(d.x), cen(d.c);
        test::DevBuf<uint32_t> labels(std::vector<uint32_t>(size_t(c.n), 0xdeadu));
        test::DevBuf<float> best(std::vector<float>(size_t(c.n), -7.f));
        test::DevBuf<uint16_t> c16(size_t(kernels::nearest_padded_centroids(c.n_centroids)) *
                                   kernels::nearest_padded_dim(c.dim));
        const float scale = kernels::nearest_centroid_scale(d.c.data(), int64_t(d.c.size()));
        ASSERT_TRUE(kernels::nearest_prepare_cuda(cen.d, c.n_centroids, c.dim, scale, c16.d, nullptr).ok());
        const Status st = kernels::nearest_cuda(test::NearestParamsOf(c, x.d, cen.d, labels.d, best.d), c16.d, nullptr);
        if (c.dim > kernels::kNearestMaxDim) {
            EXPECT_EQ(st.code(), Status::Code::kNotSupported) << st.ToString();
            continue;
        }
        ASSERT_TRUE(st.ok()) << st.ToString();
        CUDA_OK(cudaDeviceSynchronize());
        test::ExpectNearestAgrees(c, d, want, labels.get(), best.get());
    }
}

}  // namespace
}  // namespace tms

// Copyright TileMaxSim authors. Nearest centroid: the CPU path against the spec.
#include <gtest/gtest.h>

#include "tests/kernels/nearest_cases.h"

namespace tms {
namespace {

TEST(NearestCpu, AgreesWithReferenceOnEveryCase) {
    for (const test::NearestCase& c : test::NearestCases()) {
        SCOPED_TRACE(c.name);
        const test::NearestData d = test::MakeNearestData(c);
        std::vector<uint32_t> want(size_t(c.n)), got(size_t(c.n));
        std::vector<float> want_best(size_t(c.n)), got_best(size_t(c.n));
        ASSERT_TRUE(
            kernels::nearest_ref(test::NearestParamsOf(c, d.x.data(), d.c.data(), want.data(), want_best.data())).ok());
        ASSERT_TRUE(
            kernels::nearest_cpu(test::NearestParamsOf(c, d.x.data(), d.c.data(), got.data(), got_best.data())).ok());
        test::ExpectNearestAgrees(c, d, want, got, got_best);
    }
}

TEST(NearestCpu, RefusesEmptyShapes) {
    kernels::NearestParams p;
    p.dim = 8;
    EXPECT_EQ(kernels::nearest_cpu(p).code(), Status::Code::kInvalidArgument);  // no centroids
    p.n_centroids = 4;
    p.n = 3;  // rows but no pointers
    EXPECT_EQ(kernels::nearest_ref(p).code(), Status::Code::kInvalidArgument);
}

}  // namespace
}  // namespace tms

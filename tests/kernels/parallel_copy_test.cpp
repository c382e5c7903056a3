// Copyright TileMaxSim authors. kernels::ParallelMemcpy and TeamMemcpy: every byte lands,
// whatever the size and thread count (pieces of uneven length, copies below the per-thread
// minimum or one 64 KB piece).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/parallel_copy.h"

namespace tms {
namespace {

TEST(ParallelMemcpy, CopiesEveryByte) {
    kernels::ParallelMemcpy(nullptr, nullptr, 0, 0);  // empty vectors' data() may be null (UBSan)
    std::mt19937 rng(3);
    std::vector<uint8_t> src((size_t(21) << 20) + 7);
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    for (const size_t n : {size_t(0), size_t(1), size_t(4095), size_t(4) << 20, (size_t(9) << 20) + 3, src.size()}) {
        for (const int threads : {0, 1, 3, 16}) {
            std::vector<uint8_t> dst(n + 2, 0xEE);
            kernels::ParallelMemcpy(dst.data() + 1, src.data(), n, threads);
            ASSERT_EQ(dst.front(), 0xEE) << "wrote before the destination";
            ASSERT_EQ(dst.back(), 0xEE) << "wrote past the destination";
            ASSERT_TRUE(std::equal(src.begin(), src.begin() + n, dst.begin() + 1))
                << n << " bytes, " << threads << " threads";
        }
    }
}

TEST(TeamMemcpy, CopiesEveryByte) {
    std::mt19937 rng(4);
    std::vector<uint8_t> src((size_t(5) << 20) + 11);
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    for (const size_t n :
         {size_t(0), size_t(1), size_t(65535), size_t(65536), size_t(65537), size_t(1) << 20, src.size()}) {
        std::vector<uint8_t> dst(n + 2, 0xEE);
        kernels::TeamMemcpy(dst.data() + 1, src.data(), n);
        ASSERT_EQ(dst.front(), 0xEE) << "wrote before the destination";
        ASSERT_EQ(dst.back(), 0xEE) << "wrote past the destination";
        ASSERT_TRUE(std::equal(src.begin(), src.begin() + n, dst.begin() + 1)) << n << " bytes";
    }
}

}  // namespace
}  // namespace tms

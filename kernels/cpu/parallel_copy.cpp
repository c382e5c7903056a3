// Copyright TileMaxSim authors.
#include "kernels/cpu/parallel_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace tms::kernels {

void ParallelMemcpy(void* dst, const void* src, size_t bytes, int threads) {
    if (bytes == 0) return;                            // an empty vector's data() may be null: memcpy must not see it
    constexpr size_t kMinPerThread = size_t(4) << 20;  // below this a thread costs more than it copies
    const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    int t = threads > 0 ? threads : std::min(16, hw);
    t = static_cast<int>(std::min<size_t>(size_t(t), std::max<size_t>(1, bytes / kMinPerThread)));
    if (t <= 1) {
        std::memcpy(dst, src, bytes);
        return;
    }
    const size_t piece = (bytes + t - 1) / t;
    std::vector<std::thread> pool;
    pool.reserve(t - 1);
    auto copy = [&](int i) {
        const size_t o = size_t(i) * piece;
        if (o < bytes)
            std::memcpy(static_cast<char*>(dst) + o, static_cast<const char*>(src) + o, std::min(piece, bytes - o));
    };
    for (int i = 1; i < t; ++i) pool.emplace_back(copy, i);
    copy(0);
    for (auto& th : pool) th.join();
}

void TeamMemcpy(void* dst, const void* src, size_t bytes) {
    constexpr size_t kPiece = size_t(64) << 10;
    const int64_t n = int64_t((bytes + kPiece - 1) / kPiece);
#pragma omp parallel for schedule(static) if (n > 1)
    for (int64_t i = 0; i < n; ++i) {
        const size_t o = size_t(i) * kPiece;
        std::memcpy(static_cast<char*>(dst) + o, static_cast<const char*>(src) + o, std::min(kPiece, bytes - o));
    }
}

}  // namespace tms::kernels

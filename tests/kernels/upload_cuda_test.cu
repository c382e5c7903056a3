// Copyright TileMaxSim authors. kernels::ParallelUpload: pieces the host fills itself land at
// their offsets on the device, whatever the piece and stage sizes and the thread count, and a
// failing fill stops the upload with its status.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/cuda/upload.h"
#include "tests/kernels/cuda_test_util.h"

namespace tms {
namespace {

TEST(ParallelUploadCuda, PiecesLandAtTheirOffsets) {
    SKIP_WITHOUT_GPU();
    CUDA_OK(cudaSetDevice(0));
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreate(&stream));
    // Uneven pieces (one empty, one larger than many stages), then several stage sizes.
    const std::vector<size_t> bounds{0, 1000, 1000, 1024, 70000, 70001, 300000};
    std::vector<uint8_t> want(bounds.back());
    for (size_t i = 0; i < want.size(); ++i) want[i] = uint8_t(i * 7 + i / 251);
    for (size_t stage : {size_t(1), size_t(4096), size_t(65536), size_t(1) << 20}) {
        for (int threads : {1, 3, 16}) {
            uint8_t* d = nullptr;
            CUDA_OK(cudaMalloc(&d, want.size()));
            CUDA_OK(cudaMemset(d, 0, want.size()));
            std::vector<size_t> next(bounds.size(), 0);  // per piece: the offset its next call must ask for
            std::atomic<int> out_of_order{0};
            const Status st = kernels::ParallelUpload(
                0, stream, d, bounds, stage, threads, [&](size_t i, size_t o, size_t n, void* dst) {
                    if (o != next[i] || n == 0 || n > stage || bounds[i] + o + n > bounds[i + 1]) ++out_of_order;
                    next[i] = o + n;
                    std::memcpy(dst, want.data() + bounds[i] + o, n);
                    return Status::OK();
                });
            ASSERT_TRUE(st.ok()) << st.ToString();
            EXPECT_EQ(out_of_order.load(), 0) << "stage " << stage << " threads " << threads;
            for (size_t i = 0; i + 1 < bounds.size(); ++i) EXPECT_EQ(next[i], bounds[i + 1] - bounds[i]) << i;
            std::vector<uint8_t> got(want.size());
            CUDA_OK(cudaMemcpy(got.data(), d, got.size(), cudaMemcpyDeviceToHost));
            EXPECT_EQ(got, want) << "stage " << stage << " threads " << threads;
            CUDA_OK(cudaFree(d));
        }
    }
    // A fill that fails: its status comes back.
    uint8_t* d = nullptr;
    CUDA_OK(cudaMalloc(&d, want.size()));
    const Status st = kernels::ParallelUpload(0, stream, d, bounds, 4096, 4, [&](size_t i, size_t, size_t, void*) {
        return i == 3 ? Status::Corruption("piece 3 is damaged") : Status::OK();
    });
    EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
    EXPECT_EQ(st.message(), "piece 3 is damaged");
    CUDA_OK(cudaFree(d));
    CUDA_OK(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace tms

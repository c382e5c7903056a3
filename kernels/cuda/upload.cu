// Copyright TileMaxSim authors.
#include "kernels/cuda/upload.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>

#include "base/first_error.h"
#include "kernels/cpu/parallel_copy.h"
#include "kernels/cuda/cuda_check.h"

namespace tms::kernels {

StagedUploader::~StagedUploader() {
    for (int i = 0; i < 2; ++i) {
        if (done_[i]) {
            cudaEventSynchronize(done_[i]);
            cudaEventDestroy(done_[i]);
        }
        if (pinned_[i]) cudaFreeHost(pinned_[i]);
    }
}

Status StagedUploader::Reserve() {
    for (int i = 0; i < 2; ++i) {
        if (!pinned_[i]) TMS_CUDA_RETURN_IF_ERROR(cudaMallocHost(&pinned_[i], stage_));
        if (!done_[i]) TMS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming));
    }
    return Status::OK();
}

Status StagedUploader::Upload(void* d_dst, const void* h_src, size_t bytes) {
    if (bytes == 0) return Status::OK();
    if (bytes < min_staged_) {
        TMS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_dst, h_src, bytes, cudaMemcpyHostToDevice, stream_));
        TMS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // the caller may free h_src
        return Status::OK();
    }
    TMS_RETURN_IF_ERROR(Reserve());
    int k = 0;
    for (size_t o = 0; o < bytes; o += stage_, k ^= 1) {
        const size_t n = std::min(stage_, bytes - o);
        TMS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(done_[k]));  // its previous DMA has drained
        if (team_copy_) {
            TeamMemcpy(pinned_[k], static_cast<const char*>(h_src) + o, n);
        } else {
            ParallelMemcpy(pinned_[k], static_cast<const char*>(h_src) + o, n);
        }
        TMS_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(static_cast<char*>(d_dst) + o, pinned_[k], n, cudaMemcpyHostToDevice, stream_));
        TMS_CUDA_RETURN_IF_ERROR(cudaEventRecord(done_[k], stream_));
    }
    return Status::OK();
}

Status ParallelUpload(int device, cudaStream_t stream, void* d_dst, const std::vector<size_t>& bounds, size_t stage,
                      int threads, const FillPiece& fill) {
    if (bounds.size() < 2) return Status::OK();
    if (stage == 0) return Status::InvalidArgument("ParallelUpload: stage 0");
    const size_t n_pieces = bounds.size() - 1;
    threads = int(std::clamp<size_t>(size_t(std::max(threads, 1)), 1, n_pieces));
    std::atomic<size_t> next{0};
    FirstError err;
    const auto work = [&] {
        if (cudaSetDevice(device) != cudaSuccess)
            return err.Set(Status::Internal("cannot select device " + std::to_string(device)));
        void* buf[2] = {nullptr, nullptr};
        cudaEvent_t done[2] = {nullptr, nullptr};
        const auto run = [&]() -> Status {
            for (int k = 0; k < 2; ++k) {
                TMS_CUDA_RETURN_IF_ERROR(cudaMallocHost(&buf[k], stage));
                TMS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done[k], cudaEventDisableTiming));
            }
            int k = 0;
            for (size_t i = next++; i < n_pieces && !err.failed(); i = next++) {
                for (size_t o = bounds[i]; o < bounds[i + 1] && !err.failed(); o += stage, k ^= 1) {
                    const size_t n = std::min(stage, bounds[i + 1] - o);
                    TMS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(done[k]));  // its last copy has drained
                    TMS_RETURN_IF_ERROR(fill(i, o - bounds[i], n, buf[k]));
                    TMS_CUDA_RETURN_IF_ERROR(
                        cudaMemcpyAsync(static_cast<char*>(d_dst) + o, buf[k], n, cudaMemcpyHostToDevice, stream));
                    TMS_CUDA_RETURN_IF_ERROR(cudaEventRecord(done[k], stream));
                }
            }
            return Status::OK();
        };
        Status st = run();
        for (int k = 0; k < 2; ++k) {
            if (done[k]) {
                cudaEventSynchronize(done[k]);
                cudaEventDestroy(done[k]);
            }
            if (buf[k]) cudaFreeHost(buf[k]);
        }
        err.Set(std::move(st));
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    return err.status();
}

Status MakeQueryUploader(cudaStream_t stream, std::unique_ptr<StagedUploader>* out) {
    auto up = std::make_unique<StagedUploader>(stream, size_t(1) << 20, size_t(1) << 20, /*team_copy=*/true);
    TMS_RETURN_IF_ERROR(up->Reserve());
    *out = std::move(up);
    return Status::OK();
}

namespace {

// Documents' rows read by the device from registered host memory (over the link) into one
// packed device array: block b copies documents b, b + gridDim.x, ..., 16 bytes a thread, four
// loads in flight before their stores (the link's latency is microseconds).
__global__ void gather_rows_kernel(const uint16_t* const* src, const int64_t* off, int64_t n_docs, int dim,
                                   uint16_t* dst) {
    for (int64_t i = blockIdx.x; i < n_docs; i += gridDim.x) {
        const uint4* s = reinterpret_cast<const uint4*>(src[i]);
        uint4* d = reinterpret_cast<uint4*>(dst + off[i] * dim);
        const int64_t n = (off[i + 1] - off[i]) * dim / 8;
        int64_t j = threadIdx.x;
        for (; j + 3 * blockDim.x < n; j += 4 * blockDim.x) {
            const uint4 a = s[j], b = s[j + blockDim.x], c = s[j + 2 * blockDim.x], e = s[j + 3 * blockDim.x];
            d[j] = a;
            d[j + blockDim.x] = b;
            d[j + 2 * blockDim.x] = c;
            d[j + 3 * blockDim.x] = e;
        }
        for (; j < n; j += blockDim.x) d[j] = s[j];
    }
}

}  // namespace

Status gather_rows_cuda(const uint16_t* const* src, const int64_t* off, int64_t n_docs, int dim, uint16_t* dst,
                        cudaStream_t stream) {
    const int blocks = int(std::min<int64_t>(n_docs, 4096));
    gather_rows_kernel<<<blocks, 256, 0, stream>>>(src, off, n_docs, dim, dst);
    TMS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::OK();
}

}  // namespace tms::kernels

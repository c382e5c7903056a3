// Copyright TileMaxSim authors. Host -> device copies of large pageable arrays (index loading).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "tilemaxsim/status.h"

namespace tms::kernels {

/// Copies pageable host memory to the device through two pinned staging buffers: a
/// multi-threaded host copy into one buffer while the DMA engine drains the other, so that
/// the upload runs near PCIe speed instead of the driver's single-threaded pageable path.
/// Small copies go straight to cudaMemcpyAsync. Enqueues on `stream`; Upload returns when the
/// host memory may be reused (the last DMA may still be in flight; sync the stream before use
/// from another stream). One uploader per thread.
class StagedUploader {
public:
    explicit StagedUploader(cudaStream_t stream) : stream_(stream) {}
    ~StagedUploader();
    StagedUploader(const StagedUploader&) = delete;
    StagedUploader& operator=(const StagedUploader&) = delete;
    Status Upload(void* d_dst, const void* h_src, size_t bytes);

private:
    static constexpr size_t kStage = size_t(64) << 20;
    cudaStream_t stream_;
    void* pinned_[2] = {nullptr, nullptr};
    cudaEvent_t done_[2] = {nullptr, nullptr};
};

}  // namespace tms::kernels

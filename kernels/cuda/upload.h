// Copyright TileMaxSim authors. Host -> device copies of pageable arrays through pinned stages (index loading, and the
// scorers' per-call inputs).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

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
    /// Each of the two pinned buffers takes stage_bytes; copies of at least min_staged bytes
    /// go through them, smaller ones straight from pageable memory. Each staging memcpy runs on
    /// ParallelMemcpy's new threads, or (team_copy) on the caller's OpenMP team (TeamMemcpy).
    /// The defaults suit index loading (hundreds of MB to GB); a scorer keeps one with small
    /// stages for its per-call inputs (MakeQueryUploader).
    explicit StagedUploader(cudaStream_t stream, size_t stage_bytes = kLoadStage, size_t min_staged = 2 * kLoadStage,
                            bool team_copy = false)
        : stream_(stream), stage_(stage_bytes), min_staged_(min_staged), team_copy_(team_copy) {}
    static constexpr size_t kLoadStage = size_t(64) << 20;
    /// Allocates the pinned buffers now (else the first staged upload does).
    Status Reserve();
    ~StagedUploader();
    StagedUploader(const StagedUploader&) = delete;
    StagedUploader& operator=(const StagedUploader&) = delete;
    Status Upload(void* d_dst, const void* h_src, size_t bytes);

private:
    cudaStream_t stream_;
    size_t stage_, min_staged_;
    bool team_copy_;
    void* pinned_[2] = {nullptr, nullptr};
    cudaEvent_t done_[2] = {nullptr, nullptr};
};

/// Fills d_dst from pieces the host produces itself (rows read from files and checksummed as
/// they are read): piece i is bytes [bounds[i], bounds[i + 1]) of d_dst. `threads` host threads
/// (device `device` current) each take whole pieces in turn and call fill(i, offset, n, dst)
/// for consecutive parts [offset, offset + n) of the piece (offsets within the piece, n at
/// most `stage` bytes) into a pinned buffer of their own, whose copy on `stream` runs while
/// they fill their second. The first failing fill stops every thread and is returned. The
/// copies have drained when it returns.
using FillPiece = std::function<Status(size_t piece, size_t offset, size_t n, void* dst)>;
Status ParallelUpload(int device, cudaStream_t stream, void* d_dst, const std::vector<size_t>& bounds, size_t stage,
                      int threads, const FillPiece& fill);

/// The uploader a scorer keeps for its per-call inputs (query batches, candidate lists): two
/// pinned stages of 1 MB, allocated now, for copies of 1 MB or more (a batch of 256 queries of
/// 32 fp32 rows of 128 dims is 4 MB), filled by the caller's OpenMP team; smaller ones go
/// straight from pageable memory.
Status MakeQueryUploader(cudaStream_t stream, std::unique_ptr<StagedUploader>* out);

/// Documents' fp16 rows read by the device from registered host memory (over the link), src[i]
/// the first row of document i, into one packed device array dst (document i at row off[i],
/// off [n_docs + 1]); enqueued on `stream`.
Status gather_rows_cuda(const uint16_t* const* src, const int64_t* off, int64_t n_docs, int dim, uint16_t* dst,
                        cudaStream_t stream);

}  // namespace tms::kernels

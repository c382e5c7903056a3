// Copyright TileMaxSim authors. Writing one chunk of a vectors file: O_DIRECT for the aligned interior.
#pragma once

#include <fcntl.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "index/store/file_io.h"
#include "tilemaxsim/status.h"

namespace tms::index {

// One chunk's bytes, handed over in order, written at [at, at + n) of a vectors file: the
// 4 KiB-aligned interior through `direct` (the file opened O_DIRECT: a build's bulk goes
// straight to the disk instead of through the page cache's writeback, which sustains less on
// the disks measured, BENCHMARKS.md), the partial pages at either end through `fd` (they
// share their pages with the neighbouring chunks, written by other threads). Without a direct
// descriptor, or when the file system refuses direct writes (EINVAL: *direct_ok goes false
// for every later chunk), everything goes through `fd`, each piece handed to writeback.
class ChunkWriter {
public:
    static constexpr uint64_t kAlign = 4096;
    static constexpr size_t kBuffer = size_t(8) << 20;  // a direct write; a multiple of kAlign
    ChunkWriter(int fd, int direct, uint64_t at, uint64_t n, const std::string& name, std::atomic<bool>* direct_ok,
                char* buf)
        : fd_(fd),
          direct_(direct),
          pos_(at),
          a0_((at + kAlign - 1) / kAlign * kAlign),
          a1_((at + n) / kAlign * kAlign),
          name_(name),
          direct_ok_(direct_ok),
          buf_(buf) {
        if (direct_ < 0 || !buf_ || a1_ <= a0_ || !direct_ok_->load()) a0_ = a1_ = at + n;  // all through fd
    }
    Status Put(const char* p, uint64_t n) {
        while (n > 0) {
            uint64_t m;
            if (pos_ < a0_ || pos_ >= a1_) {  // a partial page, or everything: through the page cache
                m = pos_ < a0_ ? std::min(n, a0_ - pos_) : n;
                TMS_RETURN_IF_ERROR(pwrite_all(fd_, p, m, pos_, name_));
                if (a0_ == a1_) (void)::sync_file_range(fd_, off_t(pos_), off_t(m), SYNC_FILE_RANGE_WRITE);
            } else {
                m = std::min<uint64_t>({n, a1_ - pos_, kBuffer - fill_});
                std::memcpy(buf_ + fill_, p, m);
                fill_ += m;
                if (fill_ == kBuffer || pos_ + m == a1_) TMS_RETURN_IF_ERROR(Flush(pos_ + m - fill_));
            }
            p += m;
            n -= m;
            pos_ += m;
        }
        return Status::OK();
    }

private:
    Status Flush(uint64_t at) {  // buf_[0, fill_) at `at`: both multiples of kAlign
        const size_t n = fill_;
        fill_ = 0;
        if (direct_ok_->load()) {
            const ssize_t w = ::pwrite(direct_, buf_, n, off_t(at));
            if (w == ssize_t(n)) return Status::OK();
            if (w >= 0 || errno != EINVAL) return io_error(name_ + ": write failed", w < 0 ? errno : EIO);
            direct_ok_->store(false);
        }
        return pwrite_all(fd_, buf_, n, at, name_);
    }
    int fd_, direct_;
    uint64_t pos_, a0_, a1_;
    const std::string& name_;
    std::atomic<bool>* direct_ok_;
    char* buf_;
    size_t fill_ = 0;
};

}  // namespace tms::index

// Copyright TileMaxSim authors. POSIX file I/O of the stores' vectors files: descriptors, whole reads and writes,
// errors that name the file.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <unistd.h>

#include "tilemaxsim/status.h"

namespace tms::index {

// A file descriptor, closed with its owner.
struct Fd {
    int fd = -1;
    Fd() = default;
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
    Fd& operator=(Fd&& o) noexcept {
        if (this != &o) {
            reset();
            fd = std::exchange(o.fd, -1);
        }
        return *this;
    }
    ~Fd() { reset(); }
    void reset() {
        if (fd >= 0) ::close(fd);
        fd = -1;
    }
};

void advise_huge_pages(void* p, size_t bytes);
/// An I/O error naming `what` (ENOSPC: "disk full").
Status io_error(const std::string& what, int err);
/// Every byte written (or read) at `at`, retrying short transfers and EINTR.
Status pwrite_all(int fd, const void* p, size_t n, uint64_t at, const std::string& what);
Status pread_all(int fd, void* p, size_t n, uint64_t at, const std::string& what);
Status open_vectors_file(const std::string& vp, int flags, Fd* out);
Status fsync_fd(int fd, const std::string& what);

}  // namespace tms::index

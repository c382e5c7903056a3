// Copyright TileMaxSim authors. POSIX file I/O of the stores' vectors files.

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "index/store/file_io.h"

namespace tms::index {

// Asks for transparent huge pages on a large array before it is first written: reading an
// index faults in gigabytes of fresh memory, 512 times fewer faults with 2 MB pages.
void advise_huge_pages(void* p, size_t bytes) {
    constexpr uintptr_t kHuge = uintptr_t(2) << 20;
    const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
    const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
    if (e > a) (void)::madvise(reinterpret_cast<void*>(a), e - a, MADV_HUGEPAGE);
}

Status io_error(const std::string& what, int err) {
    if (err == ENOSPC) return Status::IOError(what + ": disk full");
    return Status::IOError(what + ": " + std::strerror(err));
}

Status pwrite_all(int fd, const void* p, size_t n, uint64_t at, const std::string& what) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
        const ssize_t w = ::pwrite(fd, c, std::min<size_t>(n, size_t(1) << 30), off_t(at));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return io_error(what + ": write failed", w < 0 ? errno : EIO);
        c += w;
        n -= size_t(w);
        at += uint64_t(w);
    }
    return Status::OK();
}

Status pread_all(int fd, void* p, size_t n, uint64_t at, const std::string& what) {
    char* c = static_cast<char*>(p);
    while (n > 0) {
        const ssize_t r = ::pread(fd, c, std::min<size_t>(n, size_t(1) << 30), off_t(at));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return io_error(what + ": read failed", errno);
        if (r == 0) return Status::Corruption(what + ": truncated");
        c += r;
        n -= size_t(r);
        at += uint64_t(r);
    }
    return Status::OK();
}

// Opens the vectors file `vp` of a store that has one (a missing one: the index is damaged).
Status open_vectors_file(const std::string& vp, int flags, Fd* out) {
    out->reset();
    out->fd = ::open(vp.c_str(), flags | O_CLOEXEC);
    if (out->fd >= 0) return Status::OK();
    return errno == ENOENT ? Status::Corruption(vp + ": missing (the index is damaged)")
                           : io_error(vp + ": cannot open", errno);
}

Status fsync_fd(int fd, const std::string& what) {
    if (::fsync(fd) != 0) return io_error(what + ": fsync failed", errno);
    return Status::OK();
}

}  // namespace tms::index

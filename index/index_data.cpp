// Copyright TileMaxSim authors. The large arrays of a loaded index.
#include <sys/mman.h>

#include <new>

#include "index/index_data.h"

namespace tms::index {

void* AllocLarge(size_t bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    (void)madvise(p, bytes, MADV_HUGEPAGE);  // a hint: refused where huge pages are off
    return p;
}

void FreeLarge(void* p, size_t bytes) { munmap(p, bytes); }

}  // namespace tms::index

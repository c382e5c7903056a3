// Copyright TileMaxSim authors. The in-memory form of an index, as written and as loaded.
// Internal to the library (not installed).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "index/model.h"
#include "index/store/vectors_file.h"
#include "tilemaxsim/options.h"
#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms::index {

/// Anonymous memory for the large arrays of a loaded index: mmap with transparent huge pages
/// asked for (madvise), so that filling gigabytes takes a page fault per 2 MB, not per 4 KB
/// (page faults serialise on the process's memory map: they bounded parallel loading).
void* AllocLarge(size_t bytes);
void FreeLarge(void* p, size_t bytes);
inline constexpr size_t kLargeAlloc = size_t(32) << 20;

/// An allocator that leaves elements default-initialised (uninitialised for integers) on
/// resize: the loader fills multi-GB arrays with parallel copies right after, and a serial
/// zeroing pass first would cost as much as the load itself. Arrays of kLargeAlloc bytes or
/// more come from AllocLarge.
template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
    template <typename U>
    struct rebind {
        using other = DefaultInitAllocator<U>;
    };
    DefaultInitAllocator() = default;
    template <typename U>
    DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}
    T* allocate(size_t n) {
        if (n * sizeof(T) >= kLargeAlloc) return static_cast<T*>(AllocLarge(n * sizeof(T)));
        return std::allocator<T>::allocate(n);
    }
    void deallocate(T* p, size_t n) {
        if (n * sizeof(T) >= kLargeAlloc) return FreeLarge(p, n * sizeof(T));
        std::allocator<T>::deallocate(p, n);
    }
    template <typename U, typename... Args>
    void construct(U* p, Args&&... args) {
        if constexpr (sizeof...(Args) == 0) {
            ::new (static_cast<void*>(p)) U;
        } else {
            ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
        }
    }
};
template <typename T>
using PodVector = std::vector<T, DefaultInitAllocator<T>>;

/// How a reader treats an index's fp16 vectors: skipped, read into IndexData::vectors, or left
/// in their files (IndexData::vector_files; format 5 only); kFileOrMemory: left in their files
/// where a store has them, else read.
enum class VectorLoad { kNone, kMemory, kFile, kFileOrMemory };

/// A whole index in host memory, internal ids 0..n_docs-1.
struct IndexData {
    IndexInfo info;
    IndexModel model;
    std::vector<int64_t> doc_offsets;          ///< [n_docs + 1] token offsets
    PodVector<uint32_t> token_centroids;       ///< [n_tokens]
    PodVector<uint8_t> codes;                  ///< [n_tokens, n_code_bytes]
    PodVector<uint16_t> vectors;               ///< fp16 [n_tokens, dim], empty unless kept/loaded
    std::vector<VectorFileSpan> vector_files;  ///< VectorLoad::kFile: the vectors, on disk
    std::vector<int64_t> ivf_offsets;          ///< [n_centroids + 1]
    std::vector<int32_t> ivf_docs;             ///< doc ids per centroid, sorted, unique
    std::vector<std::string> doc_ids;          ///< external ids [n_docs]
    std::vector<char> deleted;                 ///< [n_docs] tombstones (read only; IVF lists skip them)
    /// Global internal id of document 0: ids above are local to this shard (0 unsharded).
    int64_t first_doc = 0;
    /// The store's RocksDB identity as read (a rewrite of the store, as compaction's, changes it).
    std::string store_identity;
};

}  // namespace tms::index

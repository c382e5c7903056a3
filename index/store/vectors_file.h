// Copyright TileMaxSim authors. A store's fp16 vectors file, read on demand, each chunk's checksum checked once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "index/store/file_io.h"
#include "tilemaxsim/status.h"

namespace tms::index {

/// A store's fp16 vectors left in its vectors file (format 5) and read on demand, by token
/// range. Each chunk's CRC-32C is checked the first time any of its rows is read; a damaged or
/// truncated chunk fails that read and every later one that touches it, naming the file. The
/// file stays open (a later update appends past the rows read; a compaction replaces the
/// directory, not this file). Thread-safe.
class VectorFile {
public:
    ~VectorFile();
    /// Rows [t0, t0 + n) of the store's tokens into dst [n, dim].
    Status Read(int64_t t0, int64_t n, uint16_t* dst) const;
    /// For reading every row once, each chunk's checksum computed on the rows as they are read:
    /// rows [t0, t0 + n), inside one chunk, into dst. One caller reads a chunk in order from its
    /// first row, *crc carried between its calls (0 before the first); the call that reads the
    /// chunk's last rows checks it (as Read would).
    Status ReadInChunk(int64_t t0, int64_t n, uint16_t* dst, uint32_t* crc) const;
    /// [n_chunks + 1]: the first row of each checksummed chunk, then n_tokens().
    const std::vector<int64_t>& chunk_starts() const { return chunk_t0_; }
    int dim() const { return dim_; }
    int64_t n_tokens() const { return chunk_t0_.empty() ? 0 : chunk_t0_.back(); }
    const std::string& path() const { return path_; }

private:
    friend struct VectorFileBuilder;
    VectorFile() = default;
    Status Check(size_t chunk) const;  // the chunk's checksum, once
    std::string path_;
    int fd_ = -1;
    int dim_ = 0;
    std::vector<int64_t> chunk_t0_;  ///< [n_chunks + 1] first token of each chunk
    std::vector<uint32_t> crc_;      ///< [n_chunks]
    struct State;
    std::unique_ptr<State> state_;  ///< per chunk: unchecked, good or bad
};

/// Consecutive token rows [token0, token0 + file->n_tokens()) of an IndexData, on disk.
struct VectorFileSpan {
    int64_t token0 = 0;
    std::shared_ptr<const VectorFile> file;
};

// Fills a VectorFile from read_store's chunk references.
struct VectorFileBuilder {
    static std::shared_ptr<VectorFile> Make(std::string path, Fd* fd, int dim, std::vector<int64_t> chunk_t0,
                                            std::vector<uint32_t> crc);
};

}  // namespace tms::index

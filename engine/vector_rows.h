// Copyright TileMaxSim authors. Where a segment's fp16 vectors are read from when scoring does
// not find them where it runs (host or disk tier): consecutive token ranges in host arrays or
// in the stores' vectors files.
#pragma once

#include <cstdint>
#include <vector>

#include "index/index_data.h"
#include "tilemaxsim/status.h"

namespace tms::engine {

/// The token rows of a segment, in parts that cover [0, n_tokens) in order. Thread-safe.
class VectorRows {
public:
    /// Rows [token0, token0 + n_tokens) are `data` (host memory that outlives this object).
    void AddHost(int64_t token0, const uint16_t* data, int64_t n_tokens);
    /// Rows [f.token0, f.token0 + f.file->n_tokens()) are in f's file.
    void AddFile(const index::VectorFileSpan& f);
    bool empty() const { return parts_.empty(); }
    int64_t n_tokens() const { return parts_.empty() ? 0 : parts_.back().token0 + parts_.back().n_tokens; }
    bool on_disk() const { return !parts_.empty() && parts_.front().file != nullptr; }

    /// Where row t starts in host memory (host parts only; the part's rows run on from there).
    const uint16_t* HostRow(int64_t t) const;
    /// Rows [t0, t0 + n) into dst [n, dim] (one read or copy per part they touch).
    Status Range(int64_t t0, int64_t n, uint16_t* dst) const;
    /// Rows of documents docs[0..n) (any order; their rows per the segment's `doc_offsets`)
    /// into dst, document i's at row offsets[i]. Copies or reads run on OpenMP threads.
    Status Gather(const int64_t* doc_offsets, const int32_t* docs, int64_t n, const int64_t* offsets,
                  uint16_t* dst) const;

    /// For reading every row once on several threads: boundaries [0, ..., n_tokens] of pieces
    /// that are each a file's checksummed chunk or at most host_rows rows of a host part.
    std::vector<int64_t> Pieces(int64_t host_rows) const;
    /// Rows [t0, t0 + n), inside one piece, into dst: one caller reads a piece in order from
    /// its first row, *crc carried between its calls (0 before the first); a file chunk's
    /// checksum is checked with its last rows (index::VectorFile::ReadInChunk).
    Status ReadInPiece(int64_t t0, int64_t n, uint16_t* dst, uint32_t* crc) const;

    int dim = 0;

private:
    struct Part {
        int64_t token0 = 0, n_tokens = 0;
        const uint16_t* host = nullptr;
        const index::VectorFile* file = nullptr;
    };
    /// The part holding row t, or parts_.end().
    std::vector<Part>::const_iterator PartOf(int64_t t) const;
    std::vector<Part> parts_;
    std::vector<std::shared_ptr<const index::VectorFile>> keep_;  // the files stay open
};

}  // namespace tms::engine

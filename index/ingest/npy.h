// Copyright TileMaxSim authors. .npy files: read whole or memory-mapped, written, viewed as embeddings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms {

/// An owning host array as read from a .npy file (C order only).
struct HostArray {
    std::string descr;           ///< numpy descr, e.g. "<f2", "<f4", "<i4", "<i8"
    std::vector<int64_t> shape;  ///< numpy shape
    std::vector<uint8_t> bytes;  ///< raw little-endian payload

    int64_t numel() const {
        int64_t n = 1;
        for (int64_t s : shape) n *= s;
        return n;
    }
};

/// Read a .npy file (format 1.0-3.0, C order, little-endian). Any failure names the file:
/// "docs.npy: truncated: header says 1000x128 <f2 (256000 bytes), file has 1024".
Status LoadNpy(const std::string& path, HostArray* out);
/// A .npy held in memory (an HTTP body), checked as LoadNpy checks a file; `what` names it.
Status ParseNpy(const std::string& bytes, const std::string& what, HostArray* out);
/// The next .npy of a stream of them (`f`: standard input, a pipe), checked as LoadNpy checks a
/// file; *end (and OK) when the stream ends before its first byte. `what` names the stream.
Status ReadNpyStream(std::FILE* f, const std::string& what, HostArray* out, bool* end);
/// The .npy (format 1.0) preamble and header for `descr` and `shape`, padded to 64 bytes:
/// write it, then the C-order payload.
std::string NpyHeader(const std::string& descr, const std::vector<int64_t>& shape);
/// Write a .npy file (format 1.0) atomically (PATH.tmp, then rename).
Status SaveNpy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape, const void* data,
               size_t nbytes);

/// View a float16/bfloat16/float32 array (bfloat16: ml_dtypes's, which numpy saves as descr <V2)
/// of rank `rank` (2: [rows, dim], 3: [n, tokens, dim]) as
/// embeddings; checks dtype, rank, dim in [32, 1024] and that every value is finite.
/// `what` names the file in messages.
Status EmbeddingsFromArray(const HostArray& arr, int rank, const std::string& what, EmbeddingView* out);
/// Integer array of rank 1, int32 or int64 (other dtypes are refused), as int64 values.
Status IntegersFromArray(const HostArray& arr, const std::string& what, std::vector<int64_t>* out);

namespace index {

/// A read-only memory-mapped .npy file (header checked like LoadNpy); the payload is paged in
/// on demand, so a corpus larger than RAM can be read.
class MappedNpy {
public:
    static Status Open(const std::string& path, std::unique_ptr<MappedNpy>* out);
    /// Map a payload of `nbytes` at byte `offset` of any file (a safetensors tensor), described
    /// by `header` (descr, shape).
    static Status OpenRange(const std::string& path, size_t offset, size_t nbytes, HostArray header,
                            std::unique_ptr<MappedNpy>* out);
    ~MappedNpy();
    const HostArray& header() const { return header_; }  ///< descr and shape; bytes empty
    const uint8_t* data() const { return data_; }
    size_t nbytes() const { return nbytes_; }
    /// Drop the resident pages of payload bytes [from, upto) (they are re-read if touched
    /// again), so a streaming pass over a corpus larger than RAM keeps a bounded resident set.
    void Release(size_t from, size_t upto) const;
    /// Access pattern hint: random (no readahead, no fault-around) or sequential.
    void Advise(bool random) const;

private:
    MappedNpy() = default;
    HostArray header_;
    void* map_ = nullptr;
    size_t map_len_ = 0;
    const uint8_t* data_ = nullptr;
    size_t nbytes_ = 0;
};

/// EmbeddingsFromArray over a payload held elsewhere (a mapping). `check_finite`: scan every
/// value (a builder that checks values as it encodes them skips the extra pass).
Status EmbeddingsFromRaw(const HostArray& header, const void* data, int rank, const std::string& what,
                         EmbeddingView* out, bool check_finite = true);

}  // namespace index
}  // namespace tms

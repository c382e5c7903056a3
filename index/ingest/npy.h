// Copyright TileMaxSim authors. Memory-mapped .npy (and safetensors) payloads, read without loading them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms::index {

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

}  // namespace tms::index

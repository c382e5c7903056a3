// Copyright TileMaxSim authors.
#include "engine/vector_rows.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "base/first_error.h"

namespace tms::engine {

void VectorRows::AddHost(int64_t token0, const uint16_t* data, int64_t n_tokens) {
    if (n_tokens > 0) parts_.push_back({token0, n_tokens, data, nullptr});
}

void VectorRows::AddFile(const index::VectorFileSpan& f) {
    if (!f.file || f.file->n_tokens() == 0) return;
    dim = f.file->dim();
    keep_.push_back(f.file);
    parts_.push_back({f.token0, f.file->n_tokens(), nullptr, f.file.get()});
}

std::vector<VectorRows::Part>::const_iterator VectorRows::PartOf(int64_t t) const {
    // The last part starting at or before t, if t is inside it.
    auto it = std::upper_bound(parts_.begin(), parts_.end(), t, [](int64_t x, const Part& p) { return x < p.token0; });
    if (it == parts_.begin()) return parts_.end();
    --it;
    return t < it->token0 + it->n_tokens ? it : parts_.end();
}

const uint16_t* VectorRows::HostRow(int64_t t) const {
    const auto it = PartOf(t);
    return it != parts_.end() && it->host ? it->host + size_t(t - it->token0) * dim : nullptr;
}

Status VectorRows::Range(int64_t t0, int64_t n, uint16_t* dst) const {
    for (auto it = PartOf(t0); n > 0; ++it) {
        if (it == parts_.end() || t0 < it->token0 || t0 >= it->token0 + it->n_tokens) {
            return Status::Internal("vector rows: token " + std::to_string(t0) + " in no part");
        }
        const int64_t take = std::min(n, it->token0 + it->n_tokens - t0);
        if (it->file) {
            TMS_RETURN_IF_ERROR(it->file->Read(t0 - it->token0, take, dst));
        } else {
            std::memcpy(dst, it->host + size_t(t0 - it->token0) * dim, size_t(take) * dim * sizeof(uint16_t));
        }
        dst += size_t(take) * dim;
        t0 += take;
        n -= take;
    }
    return Status::OK();
}

std::vector<int64_t> VectorRows::Pieces(int64_t host_rows) const {
    std::vector<int64_t> b{0};
    host_rows = std::max<int64_t>(host_rows, 1);
    for (const Part& p : parts_) {
        if (p.file) {
            const std::vector<int64_t>& c = p.file->chunk_starts();
            for (size_t i = 1; i < c.size(); ++i) b.push_back(p.token0 + c[i]);
        } else {
            for (int64_t t = host_rows; t < p.n_tokens; t += host_rows) b.push_back(p.token0 + t);
            b.push_back(p.token0 + p.n_tokens);
        }
    }
    return b;
}

Status VectorRows::ReadInPiece(int64_t t0, int64_t n, uint16_t* dst, uint32_t* crc) const {
    const auto it = PartOf(t0);
    if (it == parts_.end() || n < 0 || t0 + n > it->token0 + it->n_tokens) {
        return Status::Internal("vector rows: [" + std::to_string(t0) + ", " + std::to_string(t0 + n) +
                                ") in no one part");
    }
    if (it->file) return it->file->ReadInChunk(t0 - it->token0, n, dst, crc);
    std::memcpy(dst, it->host + size_t(t0 - it->token0) * dim, size_t(n) * dim * sizeof(uint16_t));
    return Status::OK();
}

Status VectorRows::Gather(const int64_t* doc_offsets, const int32_t* docs, int64_t n, const int64_t* offsets,
                          uint16_t* dst) const {
    FirstError err;
#pragma omp parallel for schedule(dynamic, 64)
    for (int64_t i = 0; i < n; ++i) {
        if (err.failed()) continue;
        const int64_t t0 = doc_offsets[docs[i]];
        err.Set(Range(t0, doc_offsets[docs[i] + 1] - t0, dst + size_t(offsets[i]) * dim));
    }
    return err.status();
}

}  // namespace tms::engine

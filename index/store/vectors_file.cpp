// Copyright TileMaxSim authors. A store's fp16 vectors file, read on demand and checked chunk by chunk.

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>

#include "index/store/crc32c.h"
#include "index/store/file_io.h"
#include "index/store/vectors_file.h"

namespace tms::index {

struct VectorFile::State {
    explicit State(size_t n) : checked(new std::atomic<uint8_t>[n]) {
        for (size_t i = 0; i < n; ++i) checked[i].store(0, std::memory_order_relaxed);
    }
    std::unique_ptr<std::atomic<uint8_t>[]> checked;  // 0 unchecked, 1 good, 2 bad
    std::array<std::mutex, 64> mu;                    // one checker per chunk (striped)
};

std::shared_ptr<VectorFile> VectorFileBuilder::Make(std::string path, Fd* fd, int dim, std::vector<int64_t> chunk_t0,
                                                    std::vector<uint32_t> crc) {
    std::shared_ptr<VectorFile> f(new VectorFile());
    f->path_ = std::move(path);
    f->fd_ = std::exchange(fd->fd, -1);
    f->dim_ = dim;
    f->chunk_t0_ = std::move(chunk_t0);
    f->crc_ = std::move(crc);
    f->state_ = std::make_unique<VectorFile::State>(f->crc_.size());
    return f;
}

VectorFile::~VectorFile() {
    if (fd_ >= 0) ::close(fd_);
}

Status VectorFile::Check(size_t c) const {
    std::atomic<uint8_t>& st = state_->checked[c];
    if (st.load(std::memory_order_acquire) == 0) {
        std::lock_guard<std::mutex> g(state_->mu[c % state_->mu.size()]);
        if (st.load(std::memory_order_acquire) == 0) {
            const int64_t n = chunk_t0_[c + 1] - chunk_t0_[c];
            std::unique_ptr<uint16_t[]> buf;
            try {
                buf.reset(new uint16_t[std::max<size_t>(size_t(n) * dim_, 1)]);
            } catch (const std::bad_alloc&) {
                return Status::ResourceExhausted(path_ + ": no memory to check chunk " + std::to_string(c));
            }
            uint32_t crc = 0;
            const Status r = ReadInChunk(chunk_t0_[c], n, buf.get(), &crc);
            if (!r.ok() && r.code() != Status::Code::kCorruption) return r;  // an I/O error may pass
        }
    }
    if (st.load(std::memory_order_acquire) == 2) {
        return Status::Corruption(path_ + ": chunk " + std::to_string(c) + ": checksum mismatch or truncated");
    }
    return Status::OK();
}

Status VectorFile::ReadInChunk(int64_t t0, int64_t n, uint16_t* dst, uint32_t* crc) const {
    const size_t c = size_t(std::upper_bound(chunk_t0_.begin(), chunk_t0_.end(), t0) - chunk_t0_.begin()) - 1;
    if (t0 < 0 || n < 0 || c + 1 >= chunk_t0_.size() || t0 + n > chunk_t0_[c + 1]) {
        return Status::InvalidArgument(path_ + ": rows [" + std::to_string(t0) + ", " + std::to_string(t0 + n) +
                                       ") not inside one chunk");
    }
    std::atomic<uint8_t>& st = state_->checked[c];
    const auto bad = [&] {
        st.store(2, std::memory_order_release);
        return Status::Corruption(path_ + ": chunk " + std::to_string(c) + ": checksum mismatch or truncated");
    };
    const uint8_t was = st.load(std::memory_order_acquire);
    if (was == 2) return bad();
    const size_t row = size_t(dim_) * 2;
    const Status r = pread_all(fd_, dst, size_t(n) * row, uint64_t(t0) * row, path_ + ": chunk " + std::to_string(c));
    if (!r.ok()) return r.code() == Status::Code::kCorruption ? bad() : r;
    if (was == 1) return Status::OK();  // checked before (once good, always good)
    *crc = Crc32(dst, size_t(n) * row, *crc);
    if (t0 + n < chunk_t0_[c + 1]) return Status::OK();
    if (*crc != crc_[c]) return bad();
    st.store(1, std::memory_order_release);
    return Status::OK();
}

Status VectorFile::Read(int64_t t0, int64_t n, uint16_t* dst) const {
    if (n <= 0) return Status::OK();
    if (t0 < 0 || t0 + n > n_tokens()) {
        return Status::InvalidArgument(path_ + ": rows [" + std::to_string(t0) + ", " + std::to_string(t0 + n) +
                                       ") outside the store's " + std::to_string(n_tokens()));
    }
    size_t c = size_t(std::upper_bound(chunk_t0_.begin(), chunk_t0_.end(), t0) - chunk_t0_.begin()) - 1;
    for (; c + 1 < chunk_t0_.size() && chunk_t0_[c] < t0 + n; ++c) TMS_RETURN_IF_ERROR(Check(c));
    const size_t row = size_t(dim_) * 2;
    return pread_all(fd_, dst, size_t(n) * row, uint64_t(t0) * row, path_);
}

}  // namespace tms::index

// Copyright TileMaxSim authors. How stored values are encoded: big-endian keys, varints, the CRC-32C trailer
// every value ends with (seal, unseal), and a bounds-checked reader of values.
#pragma once

#include <rocksdb/slice.h>
#include <cstdint>
#include <cstring>
#include <string>

#include "index/store/crc32c.h"
#include "tilemaxsim/status.h"

namespace tms::index {

inline std::string be64(uint64_t v) {
    std::string s(8, '\0');
    for (int i = 7; i >= 0; --i, v >>= 8) s[i] = static_cast<char>(v & 0xff);
    return s;
}
inline std::string be32(uint32_t v) {
    std::string s(4, '\0');
    for (int i = 3; i >= 0; --i, v >>= 8) s[i] = static_cast<char>(v & 0xff);
    return s;
}

template <typename T>
void put(std::string* s, const T* p, size_t n) {
    s->append(reinterpret_cast<const char*>(p), n * sizeof(T));
}
template <typename T>
void put1(std::string* s, T v) {
    put(s, &v, 1);
}

inline void put_varint(std::string* s, uint64_t v) {
    while (v >= 0x80) {
        s->push_back(static_cast<char>((v & 0x7f) | 0x80));
        v >>= 7;
    }
    s->push_back(static_cast<char>(v));
}

inline void seal(std::string* s) { put1<uint32_t>(s, Crc32(s->data(), s->size())); }

// Checks and strips the CRC trailer.
inline Status unseal(const std::string& what, std::string* s) {
    if (s->size() < 4) return Status::Corruption(what + ": value too short");
    uint32_t crc;
    std::memcpy(&crc, s->data() + s->size() - 4, 4);
    s->resize(s->size() - 4);
    if (Crc32(s->data(), s->size()) != crc) return Status::Corruption(what + ": checksum mismatch");
    return Status::OK();
}

// Checks the CRC trailer of a value in place (the payload is the first size() - 4 bytes).
inline Status check_seal(const std::string& what, const rocksdb::Slice& s) {
    if (s.size() < 4) return Status::Corruption(what + ": value too short");
    uint32_t crc;
    std::memcpy(&crc, s.data() + s.size() - 4, 4);
    if (Crc32(s.data(), s.size() - 4) != crc) return Status::Corruption(what + ": checksum mismatch");
    return Status::OK();
}

class Reader {
public:
    Reader(const std::string& what, const std::string& s) : what_(what), p_(s.data()), end_(s.data() + s.size()) {}
    Reader(const std::string& what, const char* p, size_t n) : what_(what), p_(p), end_(p + n) {}
    const char* pos() const { return p_; }
    Status skip(size_t n) {
        if (size_t(end_ - p_) < n) return Status::Corruption(what_ + ": value truncated");
        p_ += n;
        return Status::OK();
    }
    template <typename T>
    Status get(T* out, size_t n) {
        if (size_t(end_ - p_) < n * sizeof(T)) return Status::Corruption(what_ + ": value truncated");
        std::memcpy(out, p_, n * sizeof(T));
        p_ += n * sizeof(T);
        return Status::OK();
    }
    Status varint(uint64_t* v) {
        *v = 0;
        for (int shift = 0; shift < 64; shift += 7) {
            if (p_ >= end_) return Status::Corruption(what_ + ": varint truncated");
            const uint8_t b = static_cast<uint8_t>(*p_++);
            *v |= uint64_t(b & 0x7f) << shift;
            if (!(b & 0x80)) return Status::OK();
        }
        return Status::Corruption(what_ + ": bad varint");
    }
    bool done() const { return p_ == end_; }

private:
    std::string what_;
    const char* p_;
    const char* end_;
};

}  // namespace tms::index

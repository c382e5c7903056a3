// Copyright TileMaxSim authors. CRC-32C (Castagnoli) of stored values and vector chunks.

#include <array>
#include <cstring>

#include "index/store/crc32c.h"

namespace tms::index {

namespace {

// CRC-32C (Castagnoli): the SSE4.2 crc32 instruction, 8 bytes a step, where the CPU has it;
// a table otherwise. Same values either way.
uint32_t crc32c_table(uint32_t c, const uint8_t* p, size_t n) {
    static const auto table = [] {
        std::array<uint32_t, 256> t{};
        for (uint32_t i = 0; i < 256; ++i) {
            uint32_t x = i;
            for (int k = 0; k < 8; ++k) x = (x & 1) ? 0x82f63b78u ^ (x >> 1) : x >> 1;
            t[i] = x;
        }
        return t;
    }();
    for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("sse4.2"))) uint32_t crc32c_hw(uint32_t c, const uint8_t* p, size_t n) {
    uint64_t c64 = c;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t v;
        std::memcpy(&v, p, 8);
        c64 = __builtin_ia32_crc32di(c64, v);
    }
    c = static_cast<uint32_t>(c64);
    for (; n > 0; --n, ++p) c = __builtin_ia32_crc32qi(c, *p);
    return c;
}
#endif

}  // namespace

uint32_t Crc32(const void* data, size_t n, uint32_t seed) {
    const auto* p = static_cast<const uint8_t*>(data);
    uint32_t c = ~seed;
#if defined(__x86_64__) && defined(__GNUC__)
    static const bool hw = __builtin_cpu_supports("sse4.2");
    c = hw ? crc32c_hw(c, p, n) : crc32c_table(c, p, n);
#else
    c = crc32c_table(c, p, n);
#endif
    return ~c;
}

}  // namespace tms::index

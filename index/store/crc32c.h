// Copyright TileMaxSim authors. CRC-32C (Castagnoli): the checksum of every stored value and vector chunk.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tms::index {

/// CRC-32C (Castagnoli; hardware instruction where available) of a byte range, used to check
/// stored chunks.
uint32_t Crc32(const void* data, size_t n, uint32_t seed = 0);

}  // namespace tms::index

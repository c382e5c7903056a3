// Copyright TileMaxSim authors. The version, written here only: CMake, the Python package and
// the wheel read these three lines.
#pragma once

#define TMS_VERSION_MAJOR 0
#define TMS_VERSION_MINOR 1
#define TMS_VERSION_PATCH 0

namespace tms {
/// "0.1.0"
const char* VersionString();
/// On-disk index format written by this build. The format of one store (an unsharded index, or
/// one shard): 2: chunk checksums are CRC-32C; 3: external ids stored per chunk; 5: the fp16
/// vectors in a flat file beside the store (vectors.f16), each chunk's range checksummed. 3 and
/// 5 are read (and updated in their own format); others are refused with a message.
inline constexpr int kIndexFormatVersion = 5;
/// The format of a sharded index: a manifest (DIR/SHARDS) naming stores of kIndexFormatVersion.
inline constexpr int kShardedFormatVersion = 4;
}  // namespace tms

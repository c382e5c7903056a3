// Copyright TileMaxSim authors. Shards: how many for a corpus, which documents each holds, and read shards joined.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "index/index_data.h"

namespace tms::index {

/// The shard count for `requested` (0: one per kTokensPerShard tokens, within [1, kMaxShards]).
int ResolveShardCount(int requested, int64_t n_tokens);
/// Documents per shard: `shards` contiguous ranges of about equal tokens, each at least one
/// document (fewer shards when there are fewer documents).
std::vector<int64_t> SplitShards(const std::vector<int64_t>& doclens, int shards);
/// "shard-0003": the directory of shard 3 inside a sharded index.
std::string ShardDirName(int shard);
/// A sharded index's manifest, DIR/SHARDS: JSON {"format_version", "shards": [dir, ...],
/// "model_crc"}, written last (atomically) into the build directory.
inline constexpr const char* kManifestFile = "SHARDS";

/// The metadata of the whole index from its shards' (ReadIndexShards): counts summed, one
/// ShardInfo each.
IndexInfo SumShardInfos(const std::vector<IndexData>& shards);
/// Consecutive shards (each one's first_doc the end of the one before) as one IndexData whose
/// ids count from the first's first_doc (0 for a whole index: global ids); moved from, then
/// cleared. `vector_parts`: when given, the shards' vectors are moved there, one per shard in
/// order, instead of being concatenated (out->vectors stays empty; a GPU uploads the parts).
void ConcatShards(std::vector<IndexData>* shards, IndexData* out,
                  std::vector<PodVector<uint16_t>>* vector_parts = nullptr);

}  // namespace tms::index

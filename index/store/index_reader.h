// Copyright TileMaxSim authors. Reading an index: whole, or shard by shard, with its metadata.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "index/index_data.h"
#include "index/store/db.h"
#include "index/store/store_reader.h"
#include "tilemaxsim/status.h"

namespace tms::index {

class MetadataSnapshot;

/// Read an index as one IndexData (the shards of a sharded index concatenated). Fails with a
/// one-line message on anything that is not a complete index of a supported format, or on a
/// checksum mismatch.
Status ReadIndex(const std::string& path, bool load_vectors, bool progress, IndexData* data);
/// Read an index shard by shard (in parallel), the vectors as `vectors` says: one IndexData
/// each, ids local to the shard (first_doc its global offset), info its own counts (info.shards
/// its one entry), every shard's tombstones applied. An unsharded index reads as one shard. `want`: only these shards
/// (numbers, any order; empty: all), in shard order; only their stores and the last shard's
/// (which holds every shard's tombstones) need exist. `metadata`: when given, the index's
/// metadata (null when it has none), loaded under the same reader lock as the stores, for
/// the whole index's documents whatever `want` selects.
Status ReadIndexShards(const std::string& path, VectorLoad vectors, bool progress, std::vector<IndexData>* shards,
                       const std::vector<int>& want = {}, std::unique_ptr<MetadataSnapshot>* metadata = nullptr);
/// A store as a reader loaded it: its RocksDB identity and where what it held ends.
struct StoreMark {
    std::string identity;
    StoreStart end;
};

/// What changed in an index since it was loaded (ReadIndexUpdate).
struct IndexUpdate {
    /// A store is not the one loaded (compaction or a rebuild replaced it) or lost documents: the
    /// index must be read whole, and nothing else below is set.
    bool rewritten = false;
    IndexInfo info;                   ///< the whole index now (n_deleted: its tombstones)
    IndexData added;                  ///< the head store's documents from `from` (first_doc global)
    std::vector<int64_t> tombstones;  ///< every store's, global ids, ascending
    std::vector<StoreMark> marks;     ///< each store now
};

/// The index at `path` now, against `loaded` (each of its stores as a reader loaded it, in
/// order): the head store's documents from choose_from(the head's documents now) (at or before
/// where its loaded part ends: a part loaded before may be read again), their vectors in memory
/// when `vectors`; every store's tombstones; and the metadata (null when none), under one
/// reader lock.
Status ReadIndexUpdate(const std::string& path, const std::vector<StoreMark>& loaded,
                       const std::function<StoreStart(int64_t)>& choose_from, bool vectors, IndexUpdate* out,
                       std::unique_ptr<MetadataSnapshot>* metadata);

/// The number of shards of the index at `path` (1 unsharded), from its manifest alone.
Status ReadShardCount(const std::string& path, int* n);

/// Read only the metadata.
Status ReadIndexInfo(const std::string& path, IndexInfo* info);
/// The model (centroids, codec) of the index at `path`, as its first shard's store holds it
/// (every shard's is the same).
Status ReadIndexModel(const std::string& path, IndexModel* model);
/// The tokens' nearest centroids as the index at `path` holds them, for a build of `model` whose
/// centroids are that index's (IndexBuildOptions::centroids_from) over documents of lengths
/// `lens`: filled only where that index holds these very documents (the same lengths, in
/// order, none deleted) and these centroids, else left empty (the build assigns them). Reads the
/// whole index but its vectors (codes and lists too): far less than assigning every token again.
void ReadKnownAssignments(const std::string& path, const IndexModel& model, const std::vector<int64_t>& lens,
                          std::vector<uint32_t>* out);

/// Internal to the store: the reading steps the updater and compaction share.
Status read_shard_metas(const Layout& layout, std::vector<Db>& dbs, const std::string& path,
                        std::vector<IndexInfo>* infos, std::vector<nlohmann::json>* stats);
Status read_shards(const Layout& layout, std::vector<Db>& dbs, const std::string& path, VectorLoad vectors,
                   bool progress, const std::vector<int>& want, std::vector<IndexData>* shards,
                   int64_t* index_docs = nullptr);
Status read_layout(const fs::path& dir, const std::string& path, Layout* out, const std::vector<int>& want = {},
                   bool count_only = false);
IndexInfo combine_infos(const Layout& layout, const std::vector<IndexInfo>& infos,
                        const std::vector<nlohmann::json>& stats);

}  // namespace tms::index

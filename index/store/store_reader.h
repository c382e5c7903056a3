// Copyright TileMaxSim authors. Reading one store of an index.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "index/index_data.h"
#include "index/store/db.h"
#include "tilemaxsim/status.h"

namespace tms::index {

/// One store's documents (local ids 0..n_docs-1 in `d`; stored as global ids from `first_doc`)
/// and its raw tombstones (global ids below `limit`). `d->deleted` and the IVF filtering are the
/// caller's (read_shards: a tombstone may live in another shard's store).
Status read_store(Db& db, const std::string& path, VectorLoad vectors, bool progress, int64_t first_doc, int64_t limit,
                  IndexData* d, std::vector<int64_t>* tombstones);

}  // namespace tms::index

// Copyright TileMaxSim authors. Reading one store of an index.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "index/index_data.h"
#include "index/store/db.h"
#include "tilemaxsim/status.h"

namespace tms::index {

/// Where a read of a store begins: at chunk `chunk`, the store's document `doc` and token `token`
/// (zeros: the whole store). Adds append whole chunks, so what a store gained since a reader
/// loaded (doc, token, chunk) of it is exactly the chunks from there.
struct StoreStart {
    int64_t doc = 0, token = 0, chunk = 0;
};

/// One store's documents (local ids 0..n_docs-1 in `d`; stored as global ids from `first_doc`)
/// and its raw tombstones (global ids below `limit`). `d->deleted` and the IVF filtering are the
/// caller's (read_shards: a tombstone may live in another shard's store). From `from` on, `d`
/// holds the documents from there (ids local from 0, its info their counts) and its IVF lists
/// are built from their tokens; vectors cannot then stay in their file (VectorLoad::kFile).
Status read_store(Db& db, const std::string& path, VectorLoad vectors, bool progress, int64_t first_doc, int64_t limit,
                  IndexData* d, std::vector<int64_t>* tombstones, const StoreStart& from = {});

}  // namespace tms::index

// Copyright TileMaxSim authors. A store's RocksDB database: where an index's stores are (Layout), opening one (Db),
// and reading its metadata, model, IVF lists and tombstones.
#pragma once

#include <rocksdb/db.h>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "index/index_data.h"
#include "tilemaxsim/status.h"

namespace tms::index {

namespace fs = std::filesystem;

// Where an index's stores are: the index directory itself, or the shards of its manifest.
struct Layout {
    fs::path dir;  // the index directory
    bool sharded = false;
    std::vector<fs::path> stores;
    uint32_t model_crc = 0;  // the manifest's
    // A partial open (read_layout's `want`): the shard number of each store and the index's
    // shard count. The last shard (the head, which holds every shard's tombstones) is always in.
    std::vector<int> numbers;
    int n_shards = 0;
    bool partial() const { return int(stores.size()) < n_shards; }
};

struct Db {
    std::unique_ptr<rocksdb::DB> db;
    std::vector<rocksdb::ColumnFamilyHandle*> cf;
    void Close() {
        if (!db) return;
        for (auto* h : cf) db->DestroyColumnFamilyHandle(h);
        cf.clear();
        db->Close();
        db.reset();
    }
    ~Db() { Close(); }
};

/// A RocksDB status as ours, naming `path`.
Status from_rocks(const rocksdb::Status& s, const std::string& path);
Status open_db(const std::string& path, bool read_only, Db* out, bool updating = false);
/// A complete store's metadata (fails on an incomplete or unsupported one).
Status read_meta(Db& db, const std::string& path, IndexInfo* info, nlohmann::json* stats);
/// `path` is an index directory (not a shard of one, not another program's directory).
Status check_is_index_dir(const std::string& path);
Status read_ivf_list(Db& db, const std::string& path, int k, int64_t lo, int64_t hi, std::vector<int32_t>* out);
Status read_tombstones(Db& db, const std::string& path, int64_t limit, std::vector<int64_t>* ids);
Status read_floats(Db& db, const std::string& path, const char* key, std::vector<float>* out);
Status read_model(Db& db, const std::string& path, const IndexInfo& info, const nlohmann::json& stats, IndexModel* m);

}  // namespace tms::index

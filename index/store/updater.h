// Copyright TileMaxSim authors. In-place updates of an index: add, delete, commit (one store written, the head).
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>
#include <nlohmann/json.hpp>

#include "index/index_data.h"
#include "index/metadata/metadata.h"
#include "index/store/db.h"
#include "index/store/file_io.h"
#include "index/store/index_dir.h"
#include "tilemaxsim/metadata.h"
#include "tilemaxsim/status.h"

namespace tms::index {

namespace fs = std::filesystem;

/// In-place updates of an existing index (holds the RocksDB lock: one writer at a time).
/// Nothing is visible to readers until UpdaterCommit, which applies everything in one batch.
struct IndexUpdaterImpl;
struct UpdaterDeleter {
    void operator()(IndexUpdaterImpl* u) const;
};
using UpdaterPtr = std::unique_ptr<IndexUpdaterImpl, UpdaterDeleter>;
Status OpenUpdater(const std::string& path, UpdaterPtr* out);
/// `metadata`: the new documents' (null: none; in an index with metadata they get NULLs).
Status UpdaterAdd(IndexUpdaterImpl* u, const EmbeddingView& tokens, const std::vector<int64_t>& doclens,
                  std::vector<std::string> doc_ids, bool replace, bool progress, const DocMetadata* metadata = nullptr);
/// Ids of documents deleted before (and not added again) are skipped and counted in
/// *already_deleted; an id the index never held is an error naming its line.
Status UpdaterDelete(IndexUpdaterImpl* u, const std::vector<std::string>& doc_ids, const std::string& what,
                     int64_t* already_deleted = nullptr);
Status UpdaterCommit(IndexUpdaterImpl* u);
const IndexInfo& UpdaterInfo(const IndexUpdaterImpl* u);

// An update writes to one store only, the last shard's (the head): new documents get the next
// global ids there, and tombstones of any shard's documents go there too, so that one commit
// applies all of it.
struct IndexUpdaterImpl {
    std::string path;
    fs::path dir;
    std::unique_ptr<FileLock> writer;  // the whole command; declared first, released last
    Layout layout;
    std::vector<Db> dbs;  // every store; the head (back) read-write, the others read-only
    Db& db() { return dbs.back(); }
    IndexInfo info;              // the head store's own metadata (its documents, chunks, tombstones)
    IndexInfo view;              // the whole index as it will be after Commit (UpdaterInfo)
    int64_t first_doc = 0;       // global id of the head's first document
    int64_t others_deleted = 0;  // tombstones held by the other stores
    nlohmann::json stats;
    IndexModel model;
    int chunk_docs = 2048;
    std::unordered_map<std::string, int64_t> ids;  // live external id -> global internal id
    std::unordered_set<std::string> deleted_ids;   // external ids with no live document
    // IVF lists of the head (global ids) are read when an added token first touches them
    // (ivf_loaded), not at open: adding a few documents to a large index reads a few lists.
    std::vector<std::vector<int32_t>> ivf;
    std::vector<char> ivf_loaded;
    int64_t committed_docs = 0;  // head documents the stored lists may name
    Fd vec_file;                 // the head's vectors file (format 5 with vectors), appended to
    std::vector<char> ivf_dirty;
    std::vector<int64_t> tombstones;     // global ids
    std::vector<IndexInfo> store_infos;  // every store's metadata at open
    // Document metadata (index/metadata.h): the columns (the file's, then those added rows
    // bring) and a row for each added document, written at Commit before the stores' commit.
    bool meta_exists = false;  // the index has a metadata file
    bool meta_given = false;   // an add brought metadata: Commit creates the file if missing
    std::vector<MetaColumn> meta_columns;
    int64_t meta_rows = 0;  // rows of the file below the committed documents
    struct StagedRow {
        int64_t doc;
        std::string id;
        MetaCells cells;
    };
    std::vector<StagedRow> meta_staged;  // the added documents' rows, in doc order
    int64_t committed_global() const { return first_doc + committed_docs; }
    // Staged rows of documents that exist (an add that failed part way wrote fewer).
    void trim_staged() {
        while (!meta_staged.empty() && meta_staged.back().doc >= first_doc + info.n_docs) meta_staged.pop_back();
    }
    void update_view() {
        view.n_docs = first_doc + info.n_docs;
        view.n_tokens = info.n_tokens;
        for (size_t s = 0; s + 1 < view.shards.size(); ++s) view.n_tokens += view.shards[s].n_tokens;
        view.n_chunks = info.n_chunks;
        view.n_deleted = others_deleted + info.n_deleted;
        view.shards.back().n_docs = info.n_docs;
        view.shards.back().n_tokens = info.n_tokens;
        // Every added document gets a row (NULLs without metadata of its own).
        const bool meta = meta_exists || meta_given;
        view.metadata_columns = meta ? meta_columns : std::vector<MetaColumn>();
        view.metadata_rows = meta_exists  ? meta_rows + (view.n_docs - committed_global())
                             : meta_given ? view.n_docs
                                          : -1;
    }
};

/// Closes the head's read-write database (under the readers' marker lock).
void close_updating(Db* db, const fs::path& dir);

}  // namespace tms::index

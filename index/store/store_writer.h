// Copyright TileMaxSim authors. One store being written: its chunks, vectors, IVF lists and metadata.
#pragma once

#include <rocksdb/write_batch.h>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "index/model.h"
#include "index/store/db.h"
#include "index/store/file_io.h"
#include "index/store/vectors_ahead.h"
#include "tilemaxsim/options.h"
#include "tilemaxsim/status.h"

namespace tms::index {

namespace fs = std::filesystem;

// One store being written: a whole unsharded index, or one shard. Its documents are the
// global internal ids [first_doc, first_doc + n_docs): chunk headers and IVF lists hold global
// ids, so that a tombstone names a document the same way in every shard.
struct StoreWriter {
    std::string path;  // for messages
    IndexBuildOptions opts;
    const IndexModel* model = nullptr;
    Db db;
    int64_t first_doc = 0;
    int64_t n_docs = 0, n_tokens = 0, n_chunks = 0;
    std::vector<std::vector<int32_t>> ivf;
    int64_t ivf_entries = 0;  // held in `ivf`
    uint32_t ivf_runs = 0;    // spilled runs, keys be32(centroid) + be32(run) in the ivf family
    // The chunk being filled.
    std::vector<int64_t> lens;
    std::vector<uint32_t> cids;
    std::vector<uint8_t> codes;
    std::vector<std::string> ids;
    Fd vec_file;                // kVectorsFile, with keep_vectors
    uint64_t vec_written = 0;   // bytes written to it (WriteVectors, ahead of Append)
    uint64_t chunk_vec_at = 0;  // the chunk's first vector byte in it
    uint64_t chunk_vec_bytes = 0;
    uint32_t chunk_vec_crc = 0;     // CRC-32C of the chunk's vector bytes so far
    VectorsAhead* ahead = nullptr;  // when set, the vectors file is written by it (store ahead_store)
    size_t ahead_store = 0;

    Status Open(const fs::path& dir, const IndexBuildOptions& o, const IndexModel& m, int64_t first,
                VectorsAhead* vectors_ahead = nullptr, size_t store = 0);

    Status write(rocksdb::WriteBatch& b);

    // Spill the in-memory lists as one sorted run (documents only grow, so runs concatenate).
    Status spill_ivf();

    // Final lists: the in-memory ones, or (after spills) each centroid's runs concatenated. Blocks
    // of centroids: their runs are read in key order, decoded, concatenated and re-encoded in
    // parallel, then written (and the runs deleted) in one batch per block.
    Status write_ivf();

    Status flush_chunk();

    // The vectors of the next documents to Append, n_tokens rows, written to the vectors file
    // in parallel pieces at once (they are the bulk of the bytes); the kernel is asked to start
    // writing them back, so that Finish's sync has little left to wait for.
    Status WriteVectors(const uint16_t* v, int64_t n_tok);

    // One document: `len` tokens' centroid ids, codes and vectors (null unless kept, or when
    // written ahead; written before by WriteVectors, here only checksummed into the chunk's
    // reference).
    Status Append(int64_t len, const uint32_t* tc, const uint8_t* cd, const uint16_t* vec, const std::string& id);

    // The IVF lists and the metadata, flushed; then marked complete, durably, and closed.
    Status Finish(const nlohmann::json& shard_meta);
};

}  // namespace tms::index

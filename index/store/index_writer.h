// Copyright TileMaxSim authors. Writing a new index, chunk by chunk, into a build directory put in place when complete.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "index/index_data.h"
#include "index/store/index_dir.h"
#include "index/model.h"
#include "tilemaxsim/options.h"
#include "tilemaxsim/status.h"

namespace tms::index {

/// Writes a new index chunk by chunk into a sibling temporary directory of `path`; Finish()
/// marks it complete and puts it in place (replacing an old index only with opts.overwrite,
/// holding the old one's writer lock from Create on: `target_lock` when the caller has it).
/// `shard_docs`: documents per shard (SplitShards); empty or one entry: an unsharded index (one
/// store); more: shard directories, each a store of the same model, and a manifest.
/// Destroying an unfinished writer removes the temporary directory.
/// A part of a distributed build (`part`, size > 1) writes only shards rank, rank + size, ...:
/// rank 0's writer makes the build directory (build_dir()) and completes the index once every
/// part has finished its shards; the others join that directory (part->dir) and only write.
struct WriterPart {
    int rank = 0, size = 1;
    std::string dir;  // rank 0's build directory (the other ranks)
};

/// fp16 rows [t0, t0 + n) of a build's input (tokens numbered across the whole input): a
/// pointer into the input, or the rows converted into *buf. Called from several threads at once.
using VectorSource = std::function<const uint16_t*(int64_t t0, int64_t n, std::vector<uint16_t>* buf)>;

class IndexWriter {
public:
    static Status Create(const std::string& path, const IndexBuildOptions& opts, const IndexModel& model,
                         std::unique_ptr<IndexWriter>* out, std::unique_ptr<FileLock> target_lock = nullptr,
                         std::vector<int64_t> shard_docs = {}, const WriterPart* part = nullptr);
    /// Create in two steps, for a build that writes its vectors while the model trains: Begin
    /// makes the build directory (not for a joining part), WriteVectorsAhead may follow, and
    /// SetModel opens the first store; then AppendDocs as after Create.
    static Status Begin(const std::string& path, const IndexBuildOptions& opts, std::unique_ptr<IndexWriter>* out,
                        std::unique_ptr<FileLock> target_lock = nullptr, std::vector<int64_t> shard_docs = {},
                        const WriterPart* part = nullptr);
    Status SetModel(const IndexModel& model);
    /// A stream's shards (after Begin with no shard_docs, before SetModel): shards are opened as
    /// documents come, each closed at a document boundary once it holds `shard_tokens` tokens, as
    /// many as the documents fill (a sharded index, even of one shard).
    Status SetShardTokens(int64_t shard_tokens);
    /// Writes the fp16 vectors of every document (`doclens`: all of them) into the stores'
    /// vectors files on threads of its own, from now on (they do not depend on the model), at
    /// most about `max_lead` bytes ahead of the documents appended; AppendDocs then takes no
    /// vectors. An error surfaces from AppendDocs or FinishShards. Not for a part of a
    /// distributed build.
    Status WriteVectorsAhead(const std::vector<int64_t>& doclens, int dim, int64_t max_lead, VectorSource source);
    /// After FinishShards: seconds from WriteVectorsAhead until every vector was written (0 without).
    double vectors_ahead_seconds() const;
    /// The temporary directory the index is written into.
    const std::string build_dir() const;
    ~IndexWriter();
    /// Appends n documents (the next internal ids): lengths, per-token centroid ids and codes,
    /// fp16 vectors (nullptr unless the index keeps them) and external ids.
    Status AppendDocs(const int64_t* doclens, int64_t n, const uint32_t* token_centroids, const uint8_t* codes,
                      const uint16_t* vectors, const std::string* ids);
    /// Writes the IVF lists and metadata (and the manifest), marks the index complete, renames
    /// it into place: FinishShards, then Complete.
    Status Finish();
    /// Finishes this writer's shards (each store's IVF lists and metadata).
    Status FinishShards();
    /// Writes the manifest and puts the index in place (not for a joined part).
    Status Complete();

private:
    IndexWriter();
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

/// Write `data` as a RocksDB index at `path`. The index is built in a sibling temporary
/// directory and renamed into place only when complete; an existing index at `path` is
/// replaced only with `overwrite` (and only after the new one is complete). `target_lock`: the
/// writer lock of the index at `path`, when the caller holds it already (compaction).
/// `before_complete(build_dir)`: called once the stores are written, before the index is put
/// in place, to add files that must appear with it (compaction's metadata).
Status WriteIndex(const std::string& path, const IndexData& data, const IndexBuildOptions& opts,
                  std::unique_ptr<FileLock> target_lock = nullptr,
                  const std::function<Status(const std::string& build_dir)>& before_complete = nullptr);

}  // namespace tms::index

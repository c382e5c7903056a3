// Copyright TileMaxSim authors. Building an on-disk index.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tilemaxsim/metadata.h"
#include "tilemaxsim/options.h"
#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms {

/// What a build did.
struct BuildStats {
    int64_t n_docs = 0;
    int64_t n_tokens = 0;
    int n_centroids = 0;
    int dim = 0;
    double code_bytes_per_token = 0;
    double seconds_total = 0;
    std::vector<std::pair<std::string, double>> phase_seconds;  ///< "load", "kmeans", "encode", ...
};

/// The ranks of a distributed build (MakeMpiBuildGroup in mpi/mpi_searcher.h, over MPI).
/// Rank 0 trains the model and sends it to every rank, each rank encodes and writes its shards
/// (r, r + R, ... of IndexBuildOptions::shards) into the build directory rank 0 made (so every
/// rank must see the index's parent directory: a shared filesystem), and rank 0 puts the index
/// in place only once every rank has finished; a failure on any rank fails the build on every
/// rank and leaves nothing that opens as an index. Every rank builds from the same input.
class BuildGroup {
public:
    virtual ~BuildGroup() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    /// Collective: rank 0's bytes on every rank.
    virtual Status Broadcast(std::string* bytes) = 0;
    /// Collective: OK when every rank's `mine` is OK; else, on every rank, the failed ranks'
    /// messages.
    virtual Status Agree(const Status& mine) = 0;
};

/// Builds one index directory (RocksDB). The index appears at `path` only when complete:
/// it is written to a sibling temporary directory and renamed at the end, so an interrupted
/// or failed build never leaves anything that opens as an index.
/// Thread-safety: one Build call at a time per builder.
class IndexBuilder {
public:
    /// Validates options; nothing is written yet.
    static Status Create(const IndexBuildOptions& opts, const std::string& path, std::unique_ptr<IndexBuilder>* out);
    ~IndexBuilder();

    /// Build from memory. `tokens`: [n_tokens, dim] float16/float32, rows of each document
    /// contiguous and in document order; `doclens`: tokens per document (each >= 1, summing to
    /// n_tokens); `doc_ids`: external ids (no whitespace, unique), or empty for "0".."n-1".
    /// `metadata`: the documents' attributes (checked before anything is trained or written),
    /// stored in the index beside them; none: the index has no metadata.
    Status Build(const EmbeddingView& tokens, const std::vector<int64_t>& doclens,
                 const std::vector<std::string>& doc_ids, BuildStats* stats = nullptr,
                 const DocMetadata* metadata = nullptr);

    /// Build from files: docs .npy [n_tokens, dim] (float16/float32), doclens .npy (int32/int64)
    /// and an optional ids file (one id per line; "" for 0..n-1). Errors name the file.
    Status BuildFromFiles(const std::string& docs_npy, const std::string& doclens_npy, const std::string& doc_ids_txt,
                          BuildStats* stats = nullptr, const DocMetadata* metadata = nullptr);

    /// Build as one rank of `group` (null: alone); every rank makes the same Build call.
    void SetGroup(BuildGroup* group) { group_ = group; }

private:
    IndexBuilder(IndexBuildOptions opts, std::string path);
    IndexBuildOptions opts_;
    std::string path_;
    BuildGroup* group_ = nullptr;
};

/// Builds an index from documents as they are produced (an encoder's batches, chunks of a
/// stream), never holding the collection: the first documents are held until they fill the
/// training sample (max_train_tokens at most: fp16, 256 bytes a token at d = 128), the model
/// trains on them, and from then on every batch is encoded and written as it comes. Peak memory:
/// that sample and its training (about 3x its bytes), two encoded groups of about 1M tokens, the
/// IVF entries held before a spill (ivf_memory_entries), the external ids and the metadata cells;
/// not the embeddings. The index appears at `path` only when Finish completes (as Build's).
///
/// The centroid count needs the corpus size before the corpus is seen: `expected_tokens` (of the
/// input, before any pooling; an estimate is enough; 0: sized for kStreamDefaultTokens of the
/// index) sets it by PLAID's rule unless
/// opts.n_centroids does, and the shard count (opts.shards, else one per kTokensPerShard of it):
/// with more than one, shards close as they fill, as many as the stream needs. A stream that
/// ends before the sample is full is built exactly as Build builds the same documents.
/// The sample is the stream's first documents: a stream ordered by topic trains on its first
/// topics (shuffle such a collection, or build from files, which samples the whole corpus).
/// Thread-compatible: one call at a time.
class IndexStreamBuilder {
public:
    /// The corpus size a stream without `expected_tokens` is sized for (1M documents of 128 tokens).
    static constexpr int64_t kStreamDefaultTokens = int64_t(1) << 27;
    /// Validates options; nothing is written until the sample is full (or Finish).
    static Status Create(const IndexBuildOptions& opts, const std::string& path, int64_t expected_tokens,
                         std::unique_ptr<IndexStreamBuilder>* out);
    ~IndexStreamBuilder();  // an unfinished build leaves nothing that opens as an index

    /// The next documents, as Build takes them: `tokens` [n, dim] (float32/float16/bfloat16),
    /// `doclens`, `doc_ids` (empty: numbered on from the documents before, "0".."n-1" overall),
    /// `metadata` for these documents (none: NULLs; a field's type is fixed where it first appears).
    /// The memory is not kept past the call. An error leaves the build failed (Finish refuses).
    Status Add(const EmbeddingView& tokens, const std::vector<int64_t>& doclens,
               const std::vector<std::string>& doc_ids, const DocMetadata* metadata = nullptr);
    /// Writes what remains and puts the index in place.
    Status Finish(BuildStats* stats = nullptr);

    int64_t n_docs() const;
    int64_t n_tokens() const;

private:
    IndexStreamBuilder();
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

/// Metadata of an index (tms info), without loading it.
Status ReadIndexInfo(const std::string& path, IndexInfo* info);
/// The number of shards of the index at `path` (1 when unsharded), from its manifest alone (no
/// store is opened).
Status ReadIndexShardCount(const std::string& path, int* n_shards);

}  // namespace tms

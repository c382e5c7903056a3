// Copyright TileMaxSim authors. Plain value types shared by the public API.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tms {

/// Element type of an embedding array.
enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };
const char* DTypeName(DType t);
inline int DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }

/// The largest magnitude a document or query value may have: fp16's largest finite value, since
/// the engine stores vectors and scores on the GPU in fp16. Values beyond it, Inf and NaN are
/// refused where they enter (naming the file or query, the row and the column), so that every
/// score is finite.
inline constexpr float kMaxEmbeddingValue = 65504.0f;

/// Where scoring runs. kAuto picks the GPU when this build has CUDA and a device is present.
enum class Device : uint8_t { kAuto = 0, kCpu = 1, kGpu = 2 };
const char* DeviceName(Device d);

/// Where a searcher keeps an index's fp16 vectors (exact rerank, exhaustive search). kGpu: on
/// the GPU with the codes (CPU searchers: as kHost); kHost: in host memory, the candidates'
/// rows copied to the GPU per search; kDisk: in the index's vectors files, only the rows a
/// search scores read (through the page cache); kNone: not loaded (no rerank, no exhaustive
/// search). kAuto: the fastest that fits (SearcherOptions::vectors).
enum class VectorTier : uint8_t { kAuto = 0, kGpu = 1, kHost = 2, kDisk = 3, kNone = 4 };
/// "auto", "gpu", "host", "disk", "none".
const char* VectorTierName(VectorTier t);

/// How a search prunes the documents its probes reach to SearchOptions::ncandidates before
/// compressed scoring. kProbe: each document scored by the probed centroids whose IVF lists hold
/// it (one term per query token, its best probe; WARP's imputed score when none), a cost of the
/// probed lists' entries. kInteraction: PLAID's centroid interaction, every candidate token
/// against every query token, a cost that grows with the candidates' tokens.
enum class Pruning : uint8_t { kProbe = 0, kInteraction = 1 };
const char* PruningName(Pruning p);

/// What a search ranks by (SearchOptions::mode).
enum class SearchMode : uint8_t { kMaxSim = 0, kBm25 = 1, kHybrid = 2 };
/// How a hybrid search fuses its two rankings (SearchOptions::fusion).
enum class Fusion : uint8_t { kRrf = 0, kWeighted = 1 };
/// "maxsim", "bm25", "hybrid"; "rrf", "weighted". Parse*: InvalidArgument naming the accepted
/// words otherwise.
const char* SearchModeName(SearchMode m);
const char* FusionName(Fusion f);

/// Declared type of a metadata column (SQLite's type affinity; values keep their own type).
enum class MetaType : uint8_t { kInteger = 0, kReal = 1, kText = 2 };
/// "integer", "real", "text".
const char* MetaTypeName(MetaType t);
/// A column of document metadata (tilemaxsim/metadata.h).
struct MetaColumn {
    std::string name;
    MetaType type = MetaType::kText;
};

/// A non-owning view of a row-major matrix [rows, dim] of token embeddings.
/// `data` points to rows * dim elements of `dtype`, C order, no row padding.
struct EmbeddingView {
    const void* data = nullptr;
    DType dtype = DType::kF32;
    int64_t rows = 0;
    int dim = 0;
};

/// One search result.
struct SearchHit {
    std::string doc_id;   ///< external document id
    int64_t internal_id;  ///< dense internal id [0, n_docs)
    float score;          ///< MaxSim score (exact when reranked or exhaustive)
};

/// One shard of an index: a range of internal ids with its own store.
struct ShardInfo {
    std::string dir;        ///< its directory, relative to the index directory ("." unsharded)
    int64_t first_doc = 0;  ///< internal id of its first document
    int64_t n_docs = 0;
    int64_t n_tokens = 0;
    int64_t bytes = 0;  ///< on disk
};

/// What an index holds (tms info).
struct IndexInfo {
    int format_version = 0;
    int64_t n_docs = 0;
    int64_t n_tokens = 0;
    int dim = 0;
    int n_centroids = 0;
    std::string codec;         ///< "pq" or "residual"
    int pq_m = 0;              ///< PQ sub-quantizers (codec pq)
    int pq_nbits = 0;          ///< bits per PQ code (codec pq)
    int residual_nbits = 0;    ///< bits per dimension (codec residual)
    bool has_vectors = false;  ///< fp16 vectors stored (exact scoring, rerank)
    /// The training tokens were unit vectors: compressed scores treat each decoded token as one
    /// (its similarities divided by its decoded norm, as PLAID normalises). False for indexes
    /// written before this was recorded.
    bool unit_norm = false;
    double code_bytes_per_token = 0;    ///< centroid id + codes
    double vector_bytes_per_token = 0;  ///< fp16 vectors, 0 without
    int64_t n_chunks = 0;
    int64_t n_deleted = 0;  ///< documents deleted (tombstoned) since the last compaction
    std::string build_config_json;
    std::vector<ShardInfo> shards;             ///< in id order; one entry for an unsharded index
    std::vector<MetaColumn> metadata_columns;  ///< document metadata columns, in table order
    /// Metadata rows of documents below n_docs (deleted documents' rows count until compaction);
    /// -1: the index has no metadata.
    int64_t metadata_rows = -1;
};

}  // namespace tms

// Copyright TileMaxSim authors. The in-memory form of an index, as written and as loaded.
// Internal to the library (not installed).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "index/index_dir.h"
#include "tilemaxsim/metadata.h"
#include "tilemaxsim/options.h"
#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms::index {

class MetadataSnapshot;

/// Trained parameters: coarse centroids and the codec's residual decoder.
struct IndexModel {
    int dim = 0;
    int n_centroids = 0;
    std::string codec;       ///< "pq" or "residual"
    int pq_m = 0, pq_nbits = 0, residual_nbits = 0;
    std::vector<float> centroids;  ///< [n_centroids, dim], unit rows
    int n_code_bytes = 0;          ///< bytes of code per token
    /// [n_code_bytes, 256, dim / n_code_bytes]: the residual block each byte value decodes to
    /// (kernels::CodeMaxSimParams::codebook).
    std::vector<float> codebook;
    std::vector<float> residual_cutoffs;  ///< residual codec: 2^nbits - 1 bucket boundaries
    std::vector<float> residual_weights;  ///< residual codec: 2^nbits bucket values
    /// Every sampled training token was a unit vector (norm within 1% of 1): compressed scores
    /// then normalise each decoded token (kernels::CodeMaxSimParams::token_scales), as PLAID
    /// does. False for indexes written before the flag existed.
    bool unit_norm = false;
};

/// Anonymous memory for the large arrays of a loaded index: mmap with transparent huge pages
/// asked for (madvise), so that filling gigabytes takes a page fault per 2 MB, not per 4 KB
/// (page faults serialise on the process's memory map: they bounded parallel loading).
void* AllocLarge(size_t bytes);
void FreeLarge(void* p, size_t bytes);
inline constexpr size_t kLargeAlloc = size_t(32) << 20;

/// An allocator that leaves elements default-initialised (uninitialised for integers) on
/// resize: the loader fills multi-GB arrays with parallel copies right after, and a serial
/// zeroing pass first would cost as much as the load itself. Arrays of kLargeAlloc bytes or
/// more come from AllocLarge.
template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
    template <typename U>
    struct rebind {
        using other = DefaultInitAllocator<U>;
    };
    DefaultInitAllocator() = default;
    template <typename U>
    DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}
    T* allocate(size_t n) {
        if (n * sizeof(T) >= kLargeAlloc) return static_cast<T*>(AllocLarge(n * sizeof(T)));
        return std::allocator<T>::allocate(n);
    }
    void deallocate(T* p, size_t n) {
        if (n * sizeof(T) >= kLargeAlloc) return FreeLarge(p, n * sizeof(T));
        std::allocator<T>::deallocate(p, n);
    }
    template <typename U, typename... Args>
    void construct(U* p, Args&&... args) {
        if constexpr (sizeof...(Args) == 0) {
            ::new (static_cast<void*>(p)) U;
        } else {
            ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
        }
    }
};
template <typename T>
using PodVector = std::vector<T, DefaultInitAllocator<T>>;

/// A store's fp16 vectors left in its vectors file (format 5) and read on demand, by token
/// range. Each chunk's CRC-32C is checked the first time any of its rows is read; a damaged or
/// truncated chunk fails that read and every later one that touches it, naming the file. The
/// file stays open (a later update appends past the rows read; a compaction replaces the
/// directory, not this file). Thread-safe.
class VectorFile {
public:
    ~VectorFile();
    /// Rows [t0, t0 + n) of the store's tokens into dst [n, dim].
    Status Read(int64_t t0, int64_t n, uint16_t* dst) const;
    /// For reading every row once, each chunk's checksum computed on the rows as they are read:
    /// rows [t0, t0 + n), inside one chunk, into dst. One caller reads a chunk in order from its
    /// first row, *crc carried between its calls (0 before the first); the call that reads the
    /// chunk's last rows checks it (as Read would).
    Status ReadInChunk(int64_t t0, int64_t n, uint16_t* dst, uint32_t* crc) const;
    /// [n_chunks + 1]: the first row of each checksummed chunk, then n_tokens().
    const std::vector<int64_t>& chunk_starts() const { return chunk_t0_; }
    int dim() const { return dim_; }
    int64_t n_tokens() const { return chunk_t0_.empty() ? 0 : chunk_t0_.back(); }
    const std::string& path() const { return path_; }

private:
    friend struct VectorFileBuilder;
    VectorFile() = default;
    Status Check(size_t chunk) const;  // the chunk's checksum, once
    std::string path_;
    int fd_ = -1;
    int dim_ = 0;
    std::vector<int64_t> chunk_t0_;  ///< [n_chunks + 1] first token of each chunk
    std::vector<uint32_t> crc_;      ///< [n_chunks]
    struct State;
    std::unique_ptr<State> state_;  ///< per chunk: unchecked, good or bad
};

/// Consecutive token rows [token0, token0 + file->n_tokens()) of an IndexData, on disk.
struct VectorFileSpan {
    int64_t token0 = 0;
    std::shared_ptr<const VectorFile> file;
};

/// How a reader treats an index's fp16 vectors: skipped, read into IndexData::vectors, or left
/// in their files (IndexData::vector_files; format 5 only); kFileOrMemory: left in their files
/// where a store has them, else read.
enum class VectorLoad { kNone, kMemory, kFile, kFileOrMemory };

/// A whole index in host memory, internal ids 0..n_docs-1.
struct IndexData {
    IndexInfo info;
    IndexModel model;
    std::vector<int64_t> doc_offsets;       ///< [n_docs + 1] token offsets
    PodVector<uint32_t> token_centroids;    ///< [n_tokens]
    PodVector<uint8_t> codes;               ///< [n_tokens, n_code_bytes]
    PodVector<uint16_t> vectors;            ///< fp16 [n_tokens, dim], empty unless kept/loaded
    std::vector<VectorFileSpan> vector_files;  ///< VectorLoad::kFile: the vectors, on disk
    std::vector<int64_t> ivf_offsets;       ///< [n_centroids + 1]
    std::vector<int32_t> ivf_docs;          ///< doc ids per centroid, sorted, unique
    std::vector<std::string> doc_ids;       ///< external ids [n_docs]
    std::vector<char> deleted;              ///< [n_docs] tombstones (read only; IVF lists skip them)
    /// Global internal id of document 0: ids above are local to this shard (0 unsharded).
    int64_t first_doc = 0;
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
/// The number of shards of the index at `path` (1 unsharded), from its manifest alone.
Status ReadShardCount(const std::string& path, int* n);
/// The metadata of the whole index from its shards' (ReadIndexShards): counts summed, one
/// ShardInfo each.
IndexInfo SumShardInfos(const std::vector<IndexData>& shards);
/// Consecutive shards (each one's first_doc the end of the one before) as one IndexData whose
/// ids count from the first's first_doc (0 for a whole index: global ids); moved from, then
/// cleared. `vector_parts`: when given, the shards' vectors are moved there, one per shard in
/// order, instead of being concatenated (out->vectors stays empty; a GPU uploads the parts).
void ConcatShards(std::vector<IndexData>* shards, IndexData* out,
                  std::vector<PodVector<uint16_t>>* vector_parts = nullptr);

/// Read only the metadata.
Status ReadIndexInfo(const std::string& path, IndexInfo* info);

/// Build `IndexData` from embeddings: sample, k-means, assign, encode, IVF. Validates input.
Status BuildIndexData(const EmbeddingView& tokens, const std::vector<int64_t>& doclens,
                      std::vector<std::string> doc_ids, const IndexBuildOptions& opts, IndexData* out,
                      std::vector<std::pair<std::string, double>>* phase_seconds);

/// Input checks shared by every build path: dim range, lengths >= 1 summing to the rows,
/// ids unique and whitespace-free (filled with "0".."n-1" when empty).
Status ValidateInput(const EmbeddingView& tokens, const std::vector<int64_t>& doclens, std::vector<std::string>* doc_ids);

/// Writes `path` through `fill` (false: a write failed) so that no reader sees a partial file:
/// a temporary sibling, synced, then renamed over it. A symbolic link is followed (the file it
/// names is replaced, the link stays); a device, FIFO or pipe (/dev/stdout) is written in place,
/// never replaced; "-" is standard output.
Status WriteFileAtomically(const std::string& path, const std::function<bool(std::FILE*)>& fill);

/// A shape read from a file header: every dimension >= 0 and the byte count (with
/// `elem_size`-byte elements) below 2^50, computed without overflow. Messages name `what`.
Status CheckShape(const std::vector<int64_t>& shape, int64_t elem_size, const std::string& what);

/// Document lengths against the token rows they split: each >= 1, summing to `rows` exactly
/// (checked step by step, so that no sum of huge lengths wraps around). Messages name
/// `lens_what` and `rows_what`.
Status CheckDocLens(const std::vector<int64_t>& lens, int64_t rows, const std::string& lens_what,
                    const std::string& rows_what);

/// A document or query id as runs and metadata store it: non-empty, at most 1,024 bytes, no
/// whitespace or control characters (TREC runs separate fields by whitespace; a NUL would cut
/// the id short). Messages start with `what`.
Status CheckId(const std::string& id, const std::string& what);

/// `release(shard, rows)`: the first `rows` rows of a memory-mapped shard are done with (their
/// pages may be dropped).
using ReleaseFn = std::function<void(size_t shard, int64_t rows)>;

/// The tokens TrainModel samples for `n_centroids` centroids out of `n_tokens`:
/// max(kMinTrainTokens, opts.train_tokens_per_centroid x n_centroids), at most
/// opts.max_train_tokens (when > 0) and n_tokens.
inline constexpr int64_t kMinTrainTokens = 262144;
int64_t TrainSampleTokens(int64_t n_tokens, int n_centroids, const IndexBuildOptions& opts);

/// Sample (TrainSampleTokens rows for k-means and an independent 65,536 for the codec, drawn
/// directly: no memory beyond the samples), k-means, codec training on the residuals of its
/// sample. Reads only the sampled rows of `tokens` (and releases them behind
/// the sampling pass when `release` is set); a non-finite sampled value is an error naming
/// names[shard] (or "docs"). `shards` are read as one concatenated token matrix.
Status TrainModel(const std::vector<EmbeddingView>& shards, const IndexBuildOptions& opts, IndexModel* model,
                  std::vector<std::pair<std::string, double>>* phase_seconds,
                  const std::vector<std::string>* names = nullptr, const ReleaseFn& release = nullptr);

/// What is wrong with a value that is not finite or beyond kMaxEmbeddingValue: "non-finite value
/// (NaN)", or "value 1e+30 beyond fp16's range (|x| <= 65504)".
std::string BadValueText(float v);
/// "<what>: <BadValueText(v)> at row R, column C".
Status NonFiniteError(const std::string& what, int64_t row, int col, float v);

/// The metadata of a fresh index.
void FillInfo(const IndexModel& m, int64_t n_docs, int64_t n_tokens, const IndexBuildOptions& opts, IndexInfo* info);

/// Assigns tokens to centroids and encodes their residuals, in bounded batches.
/// Not thread-safe (owns scratch buffers); `model` must outlive it.
class Encoder {
public:
    /// `device`: where assignment runs (kAuto: the GPU when present); `gpu`: which one.
    static Status Create(const IndexModel& model, Device device, int gpu, std::unique_ptr<Encoder>* out);
    ~Encoder();
    /// Rows [row0, row0 + n) of `tokens` -> cids [n], codes [n, n_code_bytes]. A non-finite
    /// input value is an InvalidArgument "docs: non-finite value ... at row R" (R within `tokens`).
    Status Encode(const EmbeddingView& tokens, int64_t row0, int64_t n, uint32_t* cids, uint8_t* codes);

private:
    Encoder();
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

class GpuAssigner;
/// A GPU assigner on GPU `gpu` for `device` (kCpu: none; kAuto: one if a GPU is present; kGpu:
/// required).
Status MaybeGpuAssigner(Device device, int gpu, std::unique_ptr<GpuAssigner>* out);

/// Squared norms [pq_m, 256] of a PQ codebook's codes, summed in dimension order: the CPU and
/// GPU encoders use the same values, so that they pick the same codes.
std::vector<float> PqCodeNorms(const IndexModel& model);

/// The codebook of PLAID residual codes [n_code_bytes, 256, 8 / nbits]: every block equal,
/// entry v holding at position j the bucket weight (v >> (nbits * j)) & (2^nbits - 1) (a code
/// byte packs 8 / nbits dimensions, dimension j at bits nbits * j, as residual_encode writes).
std::vector<float> ResidualCodebook(const std::vector<float>& weights, int nbits, int n_code_bytes);

/// min(k, n) distinct values of [0, n), uniformly at random (seeded), ascending: the rows
/// TrainModel samples.
std::vector<int64_t> SortedSample(int64_t n, int64_t k, uint64_t seed);

/// Rows [row0, row0 + n) as fp16 (on the calling thread alone unless `parallel`: an OpenMP team).
void ToHalf(const EmbeddingView& tokens, int64_t row0, int64_t n, uint16_t* out, bool parallel = true);

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
/// A model as bytes and back (a distributed build broadcasts rank 0's).
std::string ModelToBytes(const IndexModel& model);
Status ModelFromBytes(const std::string& bytes, IndexModel* model);
/// CRC-32C of a model's centroids and codec parameters: every shard of an index has the same.
uint32_t ModelCrc(const IndexModel& model);

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

/// A read-only memory-mapped .npy file (header checked like LoadNpy); the payload is paged in
/// on demand, so a corpus larger than RAM can be read.
class MappedNpy {
public:
    static Status Open(const std::string& path, std::unique_ptr<MappedNpy>* out);
    /// Map a payload of `nbytes` at byte `offset` of any file (a safetensors tensor), described
    /// by `header` (descr, shape).
    static Status OpenRange(const std::string& path, size_t offset, size_t nbytes, HostArray header,
                            std::unique_ptr<MappedNpy>* out);
    ~MappedNpy();
    const HostArray& header() const { return header_; }  ///< descr and shape; bytes empty
    const uint8_t* data() const { return data_; }
    size_t nbytes() const { return nbytes_; }
    /// Drop the resident pages of payload bytes [from, upto) (they are re-read if touched
    /// again), so a streaming pass over a corpus larger than RAM keeps a bounded resident set.
    void Release(size_t from, size_t upto) const;
    /// Access pattern hint: random (no readahead, no fault-around) or sequential.
    void Advise(bool random) const;

private:
    MappedNpy() = default;
    HostArray header_;
    void* map_ = nullptr;
    size_t map_len_ = 0;
    const uint8_t* data_ = nullptr;
    size_t nbytes_ = 0;
};

/// EmbeddingsFromArray over a payload held elsewhere (a mapping). `check_finite`: scan every
/// value (a builder that checks values as it encodes them skips the extra pass).
Status EmbeddingsFromRaw(const HostArray& header, const void* data, int rank, const std::string& what,
                         EmbeddingView* out, bool check_finite = true);

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
/// Rewrites the index without its deleted documents (atomically replacing it).
Status CompactIndex(const std::string& path, bool progress);

/// <q, centroid_k> for every query token: out [n, n_centroids] (BLAS sgemm via FAISS's BLAS).
void CentroidScores(const float* x, int64_t n, const IndexModel& model, float* out);

/// Make BLAS single-threaded (OpenBLAS's own threads fight OpenMP); no-op for other BLAS.
void SingleThreadedBlas();

/// CRC-32C (Castagnoli; hardware instruction where available) of a byte range, used to check
/// stored chunks.
uint32_t Crc32(const void* data, size_t n, uint32_t seed = 0);

}  // namespace tms::index

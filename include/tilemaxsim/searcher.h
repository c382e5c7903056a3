// Copyright TileMaxSim authors. Searching an index.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "tilemaxsim/options.h"
#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms {

/// A batch of queries: tokens [n_queries, q_tokens, dim], row-major, float16 or float32.
struct QueryBatch {
    const void* data = nullptr;
    DType dtype = DType::kF32;
    int n_queries = 0;
    int q_tokens = 0;
    int dim = 0;
    /// Optional [n_queries] tokens used per query (<= q_tokens); nullptr: all q_tokens.
    const int32_t* lengths = nullptr;

    /// Queries [first, first + n) of this batch (a view of the same memory).
    QueryBatch Slice(int first, int n) const {
        QueryBatch b = *this;
        b.n_queries = n;
        b.data = static_cast<const unsigned char*>(data) +
                 size_t(first) * size_t(q_tokens) * size_t(dim) * size_t(DTypeSize(dtype));
        b.lengths = lengths ? lengths + first : nullptr;
        return b;
    }
};

/// What the last Search call measured: the time of its stages, in seconds, and how deep each
/// query went (SearchOptions::adaptive, ::certify).
struct SearchTimings {
    double candidates = 0;  ///< centroid scores, IVF union, pruning
    double scoring = 0;     ///< compressed or exact scoring
    double rerank = 0;      ///< exact rerank
    double total = 0;
    /// Per query: 1 where its top-k was certified, 0 where it was not (after the last step).
    /// Empty where no query was certified or searched to be (exhaustive search: every result
    /// is exact; no vectors; certify off).
    std::vector<uint8_t> certified;
    /// Per query: how much deeper its second search was, in steps (SearchOptions::certify_steps;
    /// 0: searched once). Empty where no query could be searched again (neither certify nor
    /// adaptive applied).
    std::vector<uint8_t> depth;
};

/// Where one shard of an opened index lives.
struct ShardPlacement {
    int shard = 0;
    Device device = Device::kCpu;  ///< kCpu or kGpu
    int gpu = -1;                  ///< CUDA ordinal when on a GPU
    int64_t first_doc = 0, n_docs = 0;
    int64_t bytes = 0;                       ///< what it holds in memory (codes, lists, vectors)
    VectorTier vectors = VectorTier::kNone;  ///< where its fp16 vectors are (never kAuto)
    int64_t vector_bytes = 0;                ///< their size, in that tier
};

/// Why a document matched a query (Searcher::Explain): for each query token, the document token
/// most similar to it and that similarity; their sum is the document's MaxSim score.
struct Explanation {
    int64_t doc = -1;                 ///< internal id
    std::vector<int32_t> doc_tokens;  ///< per query token (of its length): the best document token
    std::vector<float> similarities;  ///< per query token: that token's similarity
    float score = 0;                  ///< the sum of `similarities`
    /// From the decoded codes (an approximation) rather than the stored vectors: the index keeps
    /// none, or they are on the GPU only (open with vectors host or disk for exact ones).
    bool from_codes = false;
    /// Per query token, when the index keeps token spans (IndexBuildOptions::spans_field) and
    /// the document has them: its best token's [start, end) character offsets into the
    /// document's text ([0, 0]: a token of no text). Empty otherwise.
    std::vector<std::pair<int32_t, int32_t>> spans;
};

/// A uniform sample of the queries a Searcher searched (SearcherOptions::record_queries).
struct ServedQueries {
    /// [n_queries, q_tokens, dim] fp16 bits, in no particular order; a query of fewer tokens
    /// (its QueryBatch::lengths) is padded with zero rows, which add 0 to every document's
    /// MaxSim and so change no ranking: the batch is an EstimateOptions::sample as it is.
    std::vector<uint16_t> tokens;
    int n_queries = 0, q_tokens = 0, dim = 0;
    /// Queries searched since the Searcher opened (the sample holds min(seen, record_queries)).
    int64_t seen = 0;
};

/// A uniform random sample (a reservoir: Vitter's algorithm R) of at most `capacity` queries,
/// fed by the searches of the searchers that record into it (SearcherOptions::record_queries or
/// ::record_into): an application that reopens its index (after writes) keeps one sample across
/// its searchers. Thread-safe.
class QuerySample {
public:
    explicit QuerySample(int capacity);
    /// Offers each query of q (its used tokens; a query of none is not kept): the first
    /// `capacity` are kept, then the n-th seen replaces a random one with probability capacity / n,
    /// so that every query seen is in the sample with the same probability. Nothing while not
    /// recording.
    void Add(const QueryBatch& q);
    /// The sample, shorter queries padded with zero rows (an EstimateOptions::sample as it is).
    ServedQueries Get() const;
    /// Stops (false) and resumes (true) taking queries: searches of the sample itself (a recall
    /// estimate on it) must not feed it again.
    void set_recording(bool on) { recording_.store(on); }
    int capacity() const { return capacity_; }
    /// Queries offered while recording, kept or not.
    int64_t seen() const;

private:
    const int capacity_;
    std::atomic<bool> recording_{true};
    mutable std::mutex mu_;
    std::vector<std::vector<uint16_t>> rows_;  // each query's tokens, fp16
    int64_t seen_ = 0;
    int dim_ = 0;
    std::mt19937_64 rng_{0x5e7ed};
};

/// An opened index, ready to answer queries. Search is const and thread-safe.
class Searcher {
public:
    /// Open the index at `path` and load it into host (and, for GPU, device) memory.
    static Status Open(const SearcherOptions& opts, const std::string& path, std::unique_ptr<Searcher>* out);
    virtual ~Searcher();

    /// What the index holds.
    virtual const IndexInfo& info() const = 0;
    /// The device scoring runs on (kCpu or kGpu, never kAuto).
    virtual Device device() const = 0;
    /// Where each shard is (one entry for an unsharded index), in shard order.
    virtual const std::vector<ShardPlacement>& placement() const = 0;

    /// Top-k documents per query, best first (ties: lower internal id first).
    /// results->size() == n_queries; a query may get fewer than k hits only when the index
    /// has fewer than k documents (or its candidates, in approximate mode).
    virtual Status Search(const QueryBatch& queries, const SearchOptions& opts,
                          std::vector<std::vector<SearchHit>>* results, SearchTimings* timings = nullptr) const = 0;
    /// The settings Search runs with `opts` (PlanSearch in estimate.h): target_recall resolved
    /// against the index's recall estimate, and exhaustive where the index is small enough that
    /// it is the cheaper search.
    virtual SearchOptions Plan(const SearchOptions& opts) const = 0;

    /// Rerank-only scoring: exact MaxSim (stored vectors, on the device the shards are on) of
    /// each query's given candidates, internal ids (candidates[q]: query q's; duplicates count
    /// once; deleted documents are dropped), best first (ties: lower internal id first); the
    /// best k of each when k > 0. NotSupported without loaded vectors; an id outside [0, n_docs)
    /// is InvalidArgument naming the query. A searcher of some shards (SearcherOptions::shards)
    /// takes ids below its last shard's end (placement) and drops those of the shards it does
    /// not hold, as deleted ones.
    virtual Status Rerank(const QueryBatch& queries, const std::vector<std::vector<int64_t>>& candidates, int k,
                          std::vector<std::vector<SearchHit>>* results) const = 0;
    /// The internal ids of external ids (-1 for an id the index does not hold, or deleted).
    /// The first call builds the lookup (every document's id; thread-safe).
    virtual void FindDocs(const std::vector<std::string>& doc_ids, std::vector<int64_t>* internal_ids) const = 0;
    /// The stored fp16 vectors of documents by internal id (FindDocs): (*rows)[i] holds document
    /// docs[i]'s tokens, [tokens, dim] row-major, as fp16 bits. InvalidArgument for an id outside
    /// [0, n_docs) or deleted; NotSupported when the index keeps no vectors, they were not
    /// loaded, or they are only on a GPU (open with VectorTier::kHost or kDisk to read them).
    virtual Status DocumentVectors(const std::vector<int64_t>& docs,
                                   std::vector<std::vector<uint16_t>>* rows) const = 0;
    /// The documents whose metadata satisfies `where` (SearchOptions::filter's expression), as a
    /// one-row DocSet over the whole index's documents (deleted ones may be in it: no search
    /// returns them). Literals are bound as parameters, never pasted into SQL; every name must be
    /// a column or `id`, else InvalidArgument naming it; NotSupported when the index has no
    /// metadata. Repeated expressions are answered from a small cache.
    virtual Status Filter(const std::string& where, DocSet* out) const = 0;
    /// The metadata of documents by internal id (a hit's internal_id): per document one JSON
    /// object of the columns `fields` (every column when empty; "id" is the external id), e.g.
    /// {"tenant":7,"lang":"en"}; a document added without metadata has NULLs. InvalidArgument for
    /// an unknown field or an id outside [0, n_docs); NotSupported when the index has no metadata.
    virtual Status Metadata(const std::vector<int64_t>& docs, const std::vector<std::string>& fields,
                            std::vector<std::string>* objects) const = 0;
    /// The sample of the queries searched so far (empty unless SearcherOptions::record_queries).
    virtual ServedQueries Served() const = 0;
    /// For each query q and each document of docs[q] (internal ids, e.g. its hits'), which
    /// document token gave each query token its maximum, and that similarity (Explanation), from
    /// the stored vectors where the host can read them, else from the decoded codes. A client
    /// highlights the passage's tokens with it. InvalidArgument for a deleted or unknown id.
    virtual Status Explain(const QueryBatch& queries, const std::vector<std::vector<int64_t>>& docs,
                           std::vector<std::vector<Explanation>>* out) const = 0;
    /// The index as it is now, with this searcher's options, sharing what this one loaded (host
    /// and GPU memory): only the documents added since are read and placed (beside the head
    /// shard, as segments of their own), and deletions apply from the tombstones; it searches
    /// as a searcher opened now would (the same hits and scores). Where the index was rewritten
    /// since (compaction, a rebuild) or this searcher opened some shards only, it is opened
    /// whole, as Open does; *whole (when given) says which. This searcher is left as it was.
    virtual Status Refresh(std::unique_ptr<Searcher>* out, bool* whole = nullptr) const = 0;
};

/// One GPU's memory as its driver reports it (cudaMemGetInfo).
struct GpuMemory {
    int gpu = 0;  ///< CUDA ordinal
    int64_t free_bytes = 0, total_bytes = 0;
};
/// The memory of GPU `gpu`; NotSupported in a build without CUDA or for a GPU that cannot be
/// selected. Creates the device's CUDA context when the process has none there: ask only for the
/// GPUs a searcher uses (ShardPlacement::gpu).
Status GetGpuMemory(int gpu, GpuMemory* out);

/// The tier opts.vectors gives the index at `path` on this machine now (kAuto: by the free
/// memory of the GPUs the searcher would use and of the host; kNone for an index without
/// vectors), or the error an explicit tier that cannot hold the vectors gives at Open.
Status ResolveVectorTier(const SearcherOptions& opts, const std::string& path, VectorTier* out);

}  // namespace tms

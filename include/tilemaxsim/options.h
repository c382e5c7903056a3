// Copyright TileMaxSim authors. Options for building and searching (RocksDB style: every field documents its default).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms {

class QuerySample;  // searcher.h

/// How an index is built. Load from JSON with LoadBuildOptionsJson (configs/*.json).
struct IndexBuildOptions {
    /// Token codec: "pq" (product quantization of the residual to the coarse centroid)
    /// or "residual" (ColBERTv2/PLAID: per-dimension buckets of the residual).
    /// Default: "pq"
    std::string codec = "pq";
    /// An index whose centroids this build reuses instead of running k-means (the codec is
    /// still trained, on residuals to them): another build of the same documents, e.g. the one
    /// this build replaces (`--codec auto` builds each step of its ladder on the first's). Where
    /// it holds these very documents (same lengths, in order, none deleted), its tokens'
    /// assignments are reused too (CPU encoding). Not with n_centroids. Not stored with the
    /// index's configuration. Empty: k-means.
    /// Default: ""
    std::string centroids_from;
    /// Number of k-means centroids. 0 picks PLAID's rule: the power of two nearest
    /// 16*sqrt(n_tokens), capped so that every centroid has >= 8 of the tokens sampled at most.
    /// Default: 0
    int n_centroids = 0;
    /// k-means iterations (FAISS Clustering); ColBERT/PLAID use 4: residual codes and the
    /// exact rerank absorb coarse centroid error. Default: 4
    int kmeans_iters = 4;
    /// Tokens sampled per centroid to train the centroids and the codec: the sample is
    /// max(262144, this x centroids) tokens, at most max_train_tokens and the corpus. 32 ranks
    /// compressed scores better than 8 on real text and on `tms synth` (BENCHMARKS.md, k-means
    /// training sample) for 3x the k-means time. Default: 32
    int train_tokens_per_centroid = 32;
    /// The most tokens sampled to train centroids and codecs; bounds the sample's memory (4 x dim
    /// bytes a token: 2 GiB at d = 128) and the k-means time (0: no bound). Default: 4194304
    int64_t max_train_tokens = int64_t(1) << 22;
    /// PQ sub-quantizers; must divide dim. 0 picks dim/8 capped at 32 (16 at d=128). Default: 0
    int pq_m = 0;
    /// Bits per PQ code (FAISS ProductQuantizer; 8 is the supported value). Default: 8
    int pq_nbits = 8;
    /// Bits per dimension for the residual codec: 1, 2 or 4. Default: 2
    int residual_nbits = 2;
    /// Store fp16 token vectors too (exhaustive search, exact rerank). Default: false
    bool keep_vectors = false;
    /// The metadata field (text values) that holds each document's text: indexed for BM25 and
    /// hybrid search (an SQLite FTS5 table beside the metadata, kept in step by adds, deletes
    /// and compaction). Empty: no text. Default: ""
    std::string text_field;
    /// The text's tokenizer: unicode61, porter (unicode61 with Porter stemming) or trigram.
    /// Default: unicode61
    std::string text_tokenizer = "unicode61";
    /// The metadata field that holds each document's token spans (with text_field): a JSON array
    /// of [start, end] character offsets into the text, one pair per token of the document's
    /// embeddings (a tokenizer's offset mapping; [0, 0] for a token of no text, e.g. a special
    /// token), so that explanations (Searcher::Explain) name the passage each query token
    /// matched. Checked at build and add time: a pair per token, 0 <= start <= end <= the text's
    /// length in characters (Unicode code points). Not with pool_factor > 1 (a pooled token has
    /// no one span). Empty: none. Default: ""
    std::string spans_field;
    /// Token pooling (PyLate's pool_factor): each document's most similar tokens are merged
    /// (agglomerative clustering by cosine, each cluster its mean) until ceil(len / pool_factor)
    /// remain, before encoding; the index stores, searches and scores the pooled tokens, and
    /// documents added later are pooled alike. 1: none. Default: 1
    int pool_factor = 1;
    /// Documents per stored chunk. Default: 2048
    int chunk_docs = 2048;
    /// Shards: ranges of documents (about equal in tokens), each with its own store, searched
    /// in parallel (on every GPU, or several on one) and merged exactly. 0 picks one shard per
    /// kTokensPerShard tokens (at least 1, at most kMaxShards). Default: 0
    int shards = 0;
    /// Random seed for sampling and k-means. Default: 1234
    uint64_t seed = 1234;
    /// Replace an existing index at the output path (the old one is removed only after
    /// the new one is complete). Default: false
    bool overwrite = false;
    /// Show progress bars on stderr when it is a terminal. Default: true
    bool progress = true;
    /// Threads for OpenMP work (0: all cores; at most kMaxThreads). Default: 0
    int threads = 0;
    /// IVF entries (document, centroid pairs; 4 bytes each) held in memory while building; past
    /// this a sorted run is spilled to the index and the runs are merged at the end, so the
    /// build's memory does not grow with the corpus. Default: 67108864 (256 MB)
    int64_t ivf_memory_entries = int64_t(1) << 26;
    /// Where centroid assignment (k-means, encoding) runs: kAuto uses the GPU (cuBLAS) when this
    /// build has CUDA and a device is present. Default: kAuto
    Device device = Device::kAuto;
    /// The GPU (CUDA ordinal) that assignment runs on when it runs on one. Default: 0
    int gpu = 0;
};

/// How a Searcher loads an index.
struct SearcherOptions {
    /// Where scoring runs: kCpu, kGpu (the GPUs of `gpus`), or kAuto (kGpu when this build has
    /// CUDA and a device is present, else kCpu). Default: kAuto
    Device device = Device::kAuto;
    /// The GPUs that hold shards (CUDA ordinals, as CUDA_VISIBLE_DEVICES numbers them), when
    /// scoring runs on GPUs; empty: every visible GPU. Shards are placed by size, so that each
    /// GPU holds about the same bytes (several shards may share one); every GPU works on a
    /// batch at once, their candidates are cut together as one device's would be, and their
    /// results merged exactly, so the results do not depend on the placement. A GPU that is not
    /// present is an error naming it. Default: empty
    std::vector<int> gpus;
    /// The shards to open (numbers, as `tms info` lists them); empty: every shard. A searcher
    /// over some shards returns their documents only (a distributed search opens each rank's
    /// share); only their stores and the last shard's (which holds the index's deletions) are
    /// read. Default: empty
    std::vector<int> shards;
    /// Load stored fp16 vectors (needed for exhaustive search and rerank); false: as vectors =
    /// kNone. Default: true
    bool load_vectors = true;
    /// Where the stored fp16 vectors live (VectorTier). kAuto: on the GPU when the index fits
    /// in kGpuShare of the free device memory (a GPU searcher), else in host memory when they
    /// fit in kHostShare of the available host memory, else on disk. An explicit tier that
    /// cannot hold them is an error naming the tier that would. Default: kAuto
    VectorTier vectors = VectorTier::kAuto;
    /// Vectors on the host or on disk: the bytes of rows an exhaustive search reads and scores
    /// per step (each step's top-k merged into the whole's), at least one document's; the next
    /// step is read while one is scored (two steps' buffers). Default: 512 MiB
    int64_t stream_bytes = int64_t(512) << 20;
    /// Show progress on stderr when it is a terminal. Default: true
    bool progress = true;
    /// Threads for OpenMP work (0: all cores; at most kMaxThreads). Default: 0
    int threads = 0;
    /// Gather concurrent callers' small batches (fewer than 256 queries of one shape and
    /// options) into one search, so that many threads searching a query each get close to batch
    /// throughput on a GPU. A call that finds no gathered search running starts at once (a lone
    /// caller waits for nothing); calls that arrive while one runs wait for it and go together
    /// in the next. Results are those of a search of the gathered batch: on a GPU, up to the
    /// rounding of the centroid GEMM, whose kernel cuBLAS picks by shape (as for
    /// SearchOptions::max_batch_queries). false: every call searches alone. Default: true
    bool gather = true;
    /// With gather: a batch also waits up to this many microseconds for more callers before it
    /// starts (trades each call's latency for fuller batches). Default: 0
    int gather_us = 0;
    /// Keep a uniform random sample (a reservoir) of at most this many of the queries searched
    /// (Searcher::Served), so that the recall estimate can be measured again on the queries the
    /// index really gets (EstimateOptions::sample) rather than on pseudo-queries. 0: none (no
    /// cost). Default: 0
    int record_queries = 0;
    /// Record into this sample instead (record_queries is then not used): one sample kept across
    /// the searchers an application opens one after another (tms serve, after each write).
    /// Default: null
    std::shared_ptr<QuerySample> record_into;
    /// Search each device's consecutive shards as one segment (one pipeline, one candidate list
    /// per query). false: every shard is a segment of its own, cut together with the others
    /// (SearchCuts), which gives the same results more slowly: for tests and measurements.
    /// Default: true
    bool join_shards = true;
    /// On a GPU, run one search of a synthetic batch (256 queries x 32 tokens) at open, so
    /// that the first real search does not pay for loading kernels (CUDA loads them on first
    /// use, and cuBLAS chooses its GEMM kernel by shape: tens of milliseconds).
    /// Default: true
    bool warm_up = true;
    /// A filter's evaluation (SearchOptions::filter) may take this many milliseconds at most;
    /// past it the search fails with "filter: ran longer than N ms" (an expression such as a long
    /// LIKE pattern over large values would otherwise hold a core for minutes). Default: 5000
    int64_t filter_time_ms = 5000;
    /// No value a filter computes (a string: `v || v`, lower(), substr()) may be longer than
    /// this many bytes; past it the search fails with "filter: a value longer than N bytes".
    /// Bounds a filter's memory to a few times it. Default: 16 MiB
    int64_t filter_max_bytes = int64_t(16) << 20;
};

/// Documents by internal id ([0, n_docs) of the index searched), as SearchOptions::allow takes
/// them: one row for every query of a batch, or one row per query.
struct DocSet {
    int64_t n_docs = 0;
    int rows = 1;
    /// [rows, Words(n_docs)]: bit d % 32 of word d / 32 of row r set when document d is in row r.
    std::vector<uint32_t> bits;

    static int64_t Words(int64_t n_docs) { return (n_docs + 31) / 32; }
    DocSet() = default;
    explicit DocSet(int64_t n, int n_rows = 1) : n_docs(n), rows(n_rows), bits(size_t(n_rows) * size_t(Words(n))) {}
    const uint32_t* Row(int r) const { return bits.data() + size_t(r) * size_t(Words(n_docs)); }
    void Add(int r, int64_t d) { bits[size_t(r) * size_t(Words(n_docs)) + size_t(d / 32)] |= 1u << (d % 32); }
    bool Has(int r, int64_t d) const { return (Row(r)[d / 32] >> (d % 32)) & 1u; }
    /// The documents of row r.
    int64_t Count(int r) const;
};

/// Per-call search parameters.
struct SearchOptions {
    /// Results per query; must be > 0 (more than the index's documents returns them all).
    /// Default: 10
    int k = 10;
    /// Score every document with exact MaxSim on stored vectors (needs --keep-vectors). Default: false
    bool exhaustive = false;
    /// Centroids probed per query token. Default: 8
    int nprobe = 8;
    /// Candidates kept after pruning, scored with the codec (0: score every document the
    /// probes reach). Default: 1024
    int ncandidates = 1024;
    /// How the documents the probes reach are pruned to ncandidates (Pruning's comment). kProbe
    /// costs the probed lists' entries, kInteraction the candidates' tokens: kProbe is the faster
    /// by an order of magnitude at a similar recall (BENCHMARKS.md). Default: kProbe
    Pruning pruning = Pruning::kProbe;
    /// Top compressed-scored documents rescored exactly when vectors are loaded
    /// (0: no rerank; always at least k when enabled). Default: 256
    int rerank = 256;
    /// With the index's recall estimate (tilemaxsim/estimate.h: measured by `tms index` when it
    /// keeps the vectors) and the vectors loaded, an approximate search takes nprobe,
    /// ncandidates and rerank from the cheapest measured setting whose estimated recall@10
    /// reaches this, each only where it holds its default above (a value set otherwise is kept;
    /// set 0 to use the fields exactly as given). Default: 0.99
    double target_recall = 0.99;
    /// With target_recall, the vectors and a rerank: each query is searched at the defaults (at
    /// the estimate's setting where that is cheaper), and a query whose exact top-k is not among
    /// the first 1.6 k of its compressed ranking (16 for k = 10: its codes did not settle which
    /// documents are best) is searched once more, certify_steps steps deeper (at least 2, as
    /// deep as the estimate's setting for the target), its top-k the best of both searches.
    /// The cost follows how hard the corpus is: on `tms synth` almost no query goes deeper,
    /// on MiniLM text most do (BENCHMARKS.md, "Each query searched as deep as it needs").
    /// SearchTimings::depth tells each query's; Searcher::Plan's result keeps this true only
    /// where the search does it. false: every query at the estimate's setting.
    /// Certification (certify), when asked for, decides instead. Default: true
    bool adaptive = true;
    /// Per-query certification of an approximate search that reranks with the vectors (pruning
    /// kProbe, ncandidates > 0): after the rerank, a query's top-k is certified when its k-th
    /// exact score is above what any document left out could score: the best compressed score
    /// the rerank did not reach, and the best probe score (an upper bound of a document's
    /// centroid interaction) the candidates did not keep, each plus the largest amount by which
    /// the query's own reranked documents' exact scores exceed that score of theirs. A query not
    /// certified is searched once more, certify_steps steps deeper, each step doubling the rerank
    /// where only the rerank's bound failed, else probing half again as many lists and doubling
    /// the candidates and the rerank.
    /// SearchTimings::certified and ::depth tell each query's outcome. With target_recall, the
    /// search starts at the estimate's setting where it is cheaper than the defaults, and at the
    /// defaults where it is not (certification deepens the queries that need it). An empirical
    /// certificate, not a proof: the excess is measured on the reranked documents, not bounded
    /// (2 of 290 certified queries on real text missed a document of their exhaustive top 10).
    /// Off by default: on `tms synth` at 1M documents (H100) it certified 364 of 1,000 queries
    /// whose top-k were all exact and ran at a third of the uncertified queries/s (BENCHMARKS.md,
    /// "Each query certified"). Default: false
    bool certify = false;
    /// How much deeper a query not certified (certify) or not settled (adaptive) is searched
    /// again, in steps (engine/plan.h: CertifyDeeper); 0: not again. -1: with target_recall and
    /// the index's estimate, the steps that reach the estimate's setting for the target (at
    /// least 1 for certify, 2 for adaptive: the estimate says how deep the corpus needs, the
    /// query which queries go there), else 3 for certify and 2 for adaptive. Default: -1
    int certify_steps = -1;
    /// Queries searched together at most; a larger batch is searched in chunks of this many,
    /// which bounds the per-batch centroid scores [queries, tokens, centroids] and, with
    /// Pruning::kProbe, probe scores [queries, documents], 4 bytes each. 0: as many as keep each
    /// under 1 GiB, at most 4096. A query's results do not depend on the chunk it is in (on a GPU, up to the rounding
    /// of the centroid GEMM, whose kernel cuBLAS picks by shape). Default: 0
    int max_batch_queries = 0;
    /// Only these documents may be returned: row 0 for every query, or row q for query q (rows ==
    /// the batch's queries; n_docs == the index's). Applied before scoring, inside candidate
    /// generation (documents outside it are never probed, pruned or scored), not to the top-k.
    /// A query allowed few documents (direct_max) scores them all, without probing; the others
    /// probe more widely, nprobe / sqrt(f) lists, f the share of the index a query is allowed
    /// (at most 64, or nprobe when larger). Either way it reranks rerank / sqrt(f) documents
    /// (at most 4096, or rerank when larger). A batch runs as its widest query needs. A probing
    /// query allowed at most half of the documents whose top k holds a document that its
    /// pruning did not rank among its best 4k candidates (or half of them) is searched again,
    /// probing twice as many lists (at most 64) and scoring every allowed document they reach:
    /// where a filter leaves a query few documents of its topic, its best others score alike
    /// under pruning, and the cut to ncandidates drops some of them. null: every document.
    /// Default: null
    std::shared_ptr<const DocSet> allow;
    /// An SQL boolean expression over the index's metadata (its columns and `id`, the external
    /// id), e.g. "tenant = 7 AND year >= 2024": only the documents whose metadata it holds for
    /// may be returned, as with `allow` (with both, a document must be in both). Literals are
    /// bound as parameters and names checked against the columns (Searcher::Filter). A
    /// document added without metadata has NULL attributes. Empty: no filter. Default: ""
    std::string filter;
    /// With allow or filter: a query allowed at most this many documents scores all of them
    /// (compressed, then the rerank) instead of probing. -1: no more than the IVF entries a
    /// query probing 64 lists per token visits (as costly as the widest probing; a narrow
    /// filter's best documents lie deep in the unfiltered ranking, where probing's pruning
    /// scores barely tell them apart), and at least 65,536. A query allowed no more than
    /// max(ncandidates, rerank, k) always does. Default: -1
    int64_t direct_max = -1;

    /// kMaxSim: late interaction over the query embeddings (as above). kBm25: the query texts
    /// alone, ranked by BM25 over the index's text (IndexBuildOptions::text_field), with
    /// SQLite FTS5 (k1 1.2, b 0.75; a query's words OR-ed). kHybrid: both: BM25's best
    /// lexical_candidates documents join the MaxSim search's best, each document of the union
    /// is scored by exact MaxSim (stored vectors; else its MaxSim hit's score, when it has one)
    /// and by BM25, and the two rankings are fused (`fusion`). Filters, allow sets and deleted
    /// documents bind both halves. The scores returned are the fused ones. Default: kMaxSim
    SearchMode mode = SearchMode::kMaxSim;
    /// One text per query of the batch (modes kBm25 and kHybrid). Default: null
    std::shared_ptr<const std::vector<std::string>> query_texts;
    /// kWeighted: the weighted sum of each ranking's scores scaled to [0, 1] over the documents
    /// fused; kRrf: sum over the rankings of weight / (60 + rank). kWeighted keeps how far apart
    /// the scores are, which ranks alone lose: on real text it beat both halves where reciprocal
    /// rank fusion fell below BM25 (BENCHMARKS.md, "BM25, MaxSim and hybrid"). Default: kWeighted
    Fusion fusion = Fusion::kWeighted;
    /// BM25's weight in the fusion, in [0, 1]; MaxSim's is 1 - bm25_weight (0: MaxSim's ranking,
    /// 1: BM25's, each over the documents it scored). Default: 0.5
    double bm25_weight = 0.5;
    /// BM25's documents that join a hybrid search's MaxSim candidates (and the MaxSim search's
    /// best that many, at least k). Default: 100
    int lexical_candidates = 100;
};

/// The automatic shard count: one shard per this many tokens (2^28: 64 GiB of fp16 vectors at
/// d = 128), so that a corpus that needs several GPUs is spread over
/// them and one that fits one GPU stays one store: on a single GPU shards do not search faster
/// (each prunes and reranks its own candidates) and, read in parallel, do not open faster.
inline constexpr int64_t kTokensPerShard = int64_t(1) << 28;
/// Shards an index may have.
inline constexpr int kMaxShards = 256;

/// Threads any option may ask for (OpenMP aborts far above a machine's cores).
inline constexpr int kMaxThreads = 1024;

/// The inverses of SearchModeName and FusionName; InvalidArgument naming the accepted words.
Status ParseSearchMode(const std::string& word, SearchMode* out);
Status ParseFusion(const std::string& word, Fusion* out);

/// The inverse of VectorTierName ("auto", "gpu", "host", "disk", "none"); InvalidArgument
/// naming the accepted words otherwise.
Status ParseVectorTier(const std::string& word, VectorTier* out);

/// Parses a device list as `tms search --devices` takes it into opts->device and opts->gpus:
/// "cpu", "gpu" or "all" (every visible GPU), "auto" (GPUs when present, else cpu), or CUDA
/// ordinals "0", "0,1", ... (each at most once).
Status ParseDeviceList(const std::string& list, SearcherOptions* opts);

/// Every field of `opts` in its documented range; the message names the field.
Status ValidateBuildOptions(const IndexBuildOptions& opts);

/// Parse an options JSON document (keys are the field names above, e.g. "codec",
/// "n_centroids", "pq_m"). Unknown keys are an error naming the key.
Status ParseBuildOptionsJson(const std::string& json_text, IndexBuildOptions* opts);
/// Read and parse a JSON file; errors name the file.
Status LoadBuildOptionsJson(const std::string& path, IndexBuildOptions* opts);
/// The options as JSON (stored in the index meta).
std::string BuildOptionsToJson(const IndexBuildOptions& opts);

}  // namespace tms

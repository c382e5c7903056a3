// Copyright TileMaxSim authors. `tms index`: an on-disk index from token embeddings (under mpirun, a
// distributed build), then its recall estimate.
#include <cstdio>
#include <filesystem>

#include "tools/tms/common.h"
#include "base/log.h"

#include "tools/tms/query.h"
#if TMS_WITH_MPI
#include "mpi/mpi_searcher.h"
#endif

namespace tms::cli {

// The build's summary line and timing, then, with `estimate`, its recall estimate.
tms::Status report_build(const tms::BuildStats& st, const std::string& out, const tms::IndexBuildOptions& o,
                         tms::BuildGroup* group, const tms::EstimateOptions* estimate) {
    if (group) tms::LogInfo("tms index: %d ranks\n", group->size());
    tms::LogInfo("tms index: %lld documents, %lld tokens, dim %d, %d centroids, codec %s, %.1f bytes/token -> %s\n",
                 (long long)st.n_docs, (long long)st.n_tokens, st.dim, st.n_centroids, o.codec.c_str(),
                 st.code_bytes_per_token, out.c_str());
    const bool verbose = tms::LogEnabled(tms::LogLevel::kDebug);
    std::string phases;  // at --log-level debug (tms -v): where the time went
    for (const auto& [name, s] : st.phase_seconds) phases += " " + name + " " + std::to_string(s).substr(0, 5) + "s";
    tms::LogInfo("tms index: %.2f s total (%.0f tokens/s)%s%s\n", st.seconds_total,
                 st.seconds_total > 0 ? st.n_tokens / st.seconds_total : 0.0, verbose ? ":" : "",
                 verbose ? phases.c_str() : "");
    if (estimate && (o.keep_vectors || estimate->documents)) {
        // The index is complete and usable whatever happens here: a failed estimate is a warning.
        const tms::Status est = estimate_index("tms index", out, *estimate);
        if (!est.ok()) {
            tms::LogWarning("tms index: warning: no recall estimate (%s); `tms estimate` measures it later\n",
                            est.ToString().c_str());
        }
    }
    return tms::Status::OK();
}

// Builds the index (as one rank of `group` when given: only rank 0 prints the summary), then,
// with `estimate`, measures its recall (rank 0).
tms::Status build_index(const std::string& docs, const std::string& doclens, const std::string& ids,
                        const std::string& out, const tms::IndexBuildOptions& o, tms::BuildGroup* group,
                        const tms::DocMetadata* metadata, const tms::EstimateOptions* estimate) {
    std::unique_ptr<tms::IndexBuilder> b;
    TMS_RETURN_IF_ERROR(tms::IndexBuilder::Create(o, out, &b));
    b->SetGroup(group);
    tms::BuildStats st;
    TMS_RETURN_IF_ERROR(b->BuildFromFiles(docs, doclens, ids, &st, metadata));
    if (group && group->rank() != 0) return tms::Status::OK();
    // Without stored vectors the estimate's truth is the input (one .npy file; a directory of
    // them is measured by `tms estimate --docs` over one file of them all).
    tms::EstimateOptions eo = estimate ? *estimate : tms::EstimateOptions();
    EstimateInput input;
    if (estimate && !o.keep_vectors && std::filesystem::is_regular_file(docs)) {
        const tms::Status in = load_estimate_input(docs, doclens, &input, &eo);
        if (!in.ok()) tms::LogWarning("tms index: warning: no recall estimate (%s)\n", in.ToString().c_str());
    }
    return report_build(st, out, o, group, estimate ? &eo : nullptr);
}

// `--codec auto`: the builds of tms::NextAutoCodecPqM's ladder, each over the last (--overwrite's
// swap: the index at `out` is complete at every moment) and on its centroids (k-means once), and
// measured by the build's compressed estimate, until one reaches `target` beyond its sampling
// error, else the last. PQ, not the residual
// codec: at the same bytes it ranks MiniLM token states better (BENCHMARKS.md, "Codec quality on
// real text").
tms::Status build_index_auto_codec(const std::string& docs, const std::string& doclens, const std::string& ids,
                                   const std::string& out, tms::IndexBuildOptions o, const tms::DocMetadata* metadata,
                                   const tms::EstimateOptions& estimate, double target) {
    int first = 0;  // the default's sub-quantizers, once the first build resolved them
    for (int m = 0;;) {
        o.codec = "pq";
        o.pq_m = m;
        TMS_RETURN_IF_ERROR(build_index(docs, doclens, ids, out, o, nullptr, metadata, &estimate));
        o.overwrite = true;  // from here on each build replaces the one before it
        tms::IndexInfo info;
        TMS_RETURN_IF_ERROR(tms::ReadIndexInfo(out, &info));
        if (first == 0) first = info.pq_m;
        tms::RecallEstimate e;
        if (!tms::ReadRecallEstimate(out, &e).ok() || e.points.empty()) {
            tms::LogWarning("tms index: --codec auto: no estimate to judge PQ-%d by; keeping it\n", info.pq_m);
            return tms::Status::OK();
        }
        const tms::RecallPoint* p = e.For(target);
        const int next = tms::NextAutoCodecPqM(e, target, info.dim, first, info.pq_m);
        if (next > 0) {
            tms::LogInfo("tms index: --codec auto: PQ-%d estimated %.4f, short of %.2f; building PQ-%d\n", info.pq_m,
                         p->recall, target, next);
        } else if (e.Reaches(target)) {
            tms::LogInfo("tms index: --codec auto: PQ-%d reaches recall %.2f (estimated %.4f)\n", info.pq_m, target,
                         p->recall);
        } else {
            tms::LogWarning(
                "tms index: --codec auto: no PQ up to %d sub-quantizers reaches recall %.2f; keeping PQ-%d "
                "(estimated %.4f); --keep-vectors reranks exactly\n",
                info.pq_m, target, info.pq_m, p->recall);
        }
        if (next == 0) return tms::Status::OK();
        m = next;
        // The next step on this one's centroids (no k-means): only the codes change.
        o.centroids_from = out;
        o.n_centroids = 0;
    }
}

// `tms index --docs -`: a stream of .npy pairs on standard input, (tokens [n, dim], doclens [m])
// each, built as it comes (IndexStreamBuilder). Ids: the lines of `ids` in order, else numbered;
// metadata: one object per document, in order.
tms::Status build_index_stream(const std::string& ids, const std::string& out, const tms::IndexBuildOptions& o,
                               int64_t expected_tokens, const tms::DocMetadata* metadata,
                               const tms::EstimateOptions* estimate) {
    std::unique_ptr<tms::IndexStreamBuilder> b;
    TMS_RETURN_IF_ERROR(tms::IndexStreamBuilder::Create(o, out, expected_tokens, &b));
    // The ids as a file build reads them (ReadLines); they are held by the builder anyway.
    std::vector<std::string> all_ids;
    if (!ids.empty()) TMS_RETURN_IF_ERROR(tms::ReadLines(ids, &all_ids));
    std::FILE* in = stdin;
    for (int64_t pair = 1;; ++pair) {
        const std::string what = "standard input: pair " + std::to_string(pair);
        tms::HostArray tokens, lens_arr;
        bool end = false;
        TMS_RETURN_IF_ERROR(tms::ReadNpyStream(in, what + " (tokens)", &tokens, &end));
        if (end) break;
        TMS_RETURN_IF_ERROR(tms::ReadNpyStream(in, what + " (doclens)", &lens_arr, &end));
        if (end) return tms::Status::InvalidArgument(what + ": the stream ended before its doclens .npy");
        // Values are checked by the builder as it takes the batch (not twice).
        tms::EmbeddingView v;
        TMS_RETURN_IF_ERROR(
            tms::index::EmbeddingsFromRaw(tokens, tokens.bytes.data(), 2, what + " (tokens)", &v, false));
        std::vector<int64_t> lens;
        TMS_RETURN_IF_ERROR(tms::IntegersFromArray(lens_arr, what + " (doclens)", &lens));
        const int64_t d0 = b->n_docs(), d1 = d0 + int64_t(lens.size());
        std::vector<std::string> batch_ids;
        if (!ids.empty()) {
            if (int64_t(all_ids.size()) < d1) {
                return tms::Status::InvalidArgument(ids + ": " + std::to_string(all_ids.size()) +
                                                    " ids, fewer than the stream's documents");
            }
            batch_ids.assign(all_ids.begin() + d0, all_ids.begin() + d1);
        }
        tms::DocMetadata md;
        if (metadata) {
            if (int64_t(metadata->objects.size()) < d1) {
                return tms::Status::InvalidArgument(metadata->source + ": " + std::to_string(metadata->objects.size()) +
                                                    " objects, fewer than the stream's documents (one per document, "
                                                    "in order)");
            }
            md.objects.assign(metadata->objects.begin() + d0, metadata->objects.begin() + d1);
            md.declared = metadata->declared;
            md.source = metadata->source;
            for (int64_t d = d0; d < d1; ++d)
                md.lines.push_back(metadata->lines.empty() ? d + 1 : metadata->lines[size_t(d)]);
        }
        TMS_RETURN_IF_ERROR(b->Add(v, lens, batch_ids, metadata ? &md : nullptr));
    }
    if (metadata && int64_t(metadata->objects.size()) > b->n_docs()) {
        return tms::Status::InvalidArgument(metadata->source + ": " + std::to_string(metadata->objects.size()) +
                                            " objects, more than the stream's " + std::to_string(b->n_docs()) +
                                            " documents");
    }
    if (int64_t(all_ids.size()) > b->n_docs()) {
        return tms::Status::InvalidArgument(ids + ": " + std::to_string(all_ids.size()) +
                                            " ids, more than the stream's " + std::to_string(b->n_docs()) +
                                            " documents");
    }
    tms::BuildStats st;
    TMS_RETURN_IF_ERROR(b->Finish(&st));
    return report_build(st, out, o, nullptr, estimate);
}

Command AddIndex(CLI::App& app, const Context& ctx) {
    struct State {
        tms::IndexBuildOptions io;
        std::string docs, doclens, doc_ids, index_out, config;
        int n_centroids = -1, pq_m = -1, nbits = -1, shards = -1;
        std::string codec;
        bool keep_vectors = false, overwrite = false, no_progress = false;
        std::string index_meta, index_meta_types;
        [[maybe_unused]] double index_mpi_timeout = 86400;  // read under mpirun only
        std::string index_device = "auto";
        bool no_estimate = false;
        tms::EstimateOptions index_eo;
        std::string index_sample;
        int64_t expected_tokens = 0;
        int pool_factor = 0;
        double codec_target = tms::SearchOptions().target_recall;
    };
    auto s = std::make_shared<State>();
    auto& io = s->io;
    auto& docs = s->docs;
    auto& doclens = s->doclens;
    auto& doc_ids = s->doc_ids;
    auto& index_out = s->index_out;
    auto& config = s->config;
    auto& n_centroids = s->n_centroids;
    auto& pq_m = s->pq_m;
    auto& nbits = s->nbits;
    auto& shards = s->shards;
    auto& codec = s->codec;
    auto& keep_vectors = s->keep_vectors;
    auto& overwrite = s->overwrite;
    auto& no_progress = s->no_progress;
    auto& index_meta = s->index_meta;
    auto& index_meta_types = s->index_meta_types;
    auto& index_mpi_timeout = s->index_mpi_timeout;
    auto& index_device = s->index_device;
    auto& no_estimate = s->no_estimate;
    auto& index_eo = s->index_eo;
    auto& index_sample = s->index_sample;
    auto* idx = app.add_subcommand("index", "Build an on-disk index from token embeddings");
    idx->add_option("--docs", docs,
                    "Token embeddings: .npy [n_tokens, dim] (float16/bfloat16/float32), a directory of shards "
                    "docs_*.npy + doclens_*.npy, .safetensors (tensors 'embeddings', 'doclens'), or - : a stream "
                    "of .npy pairs on standard input (tokens [n, dim], then doclens [m]; e.g. an encoder's batches), "
                    "each encoded and written as it comes, in bounded memory")
        ->required();
    idx->add_option("--expected-tokens", s->expected_tokens,
                    "With --docs -: the stream's tokens, roughly; sets the centroid and shard counts (default: "
                    "sized for 2^27 tokens, about 1M documents)")
        ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
    idx->add_option("--doclens", doclens, "Tokens per document .npy [n_docs], int32 or int64 (with a .npy --docs)");
    idx->add_option("--doc-ids", doc_ids, "Document ids, one per line (default: 0..n-1)");
    idx->add_option("--out", index_out, "Index directory to create")->required();
    idx->add_option("--config", config, "JSON preset (configs/*.json); flags override it");
    idx->add_option("--codec", codec,
                    "Token codec: pq, residual, or auto (without --keep-vectors: PQ of dim/8 sub-quantizers, else "
                    "of twice or four times as many, the fewest whose compressed recall estimate reaches 0.99; "
                    "each is built and measured in turn) (default pq)")
        ->check(CLI::IsMember({"pq", "residual", "auto"}));
    auto* codec_target_opt =
        idx->add_option("--target-recall", s->codec_target,
                        "With --codec auto: the compressed recall@10 the codes must reach (the build's estimate)")
            ->capture_default_str()
            ->check(CLI::Range(0.0, 1.0));
    idx->add_option("--centroids,--n-centroids", n_centroids,
                    "k-means centroids (0 or unset: power of two near 16*sqrt(tokens))")
        ->check(CLI::Range(0, 1 << 24));
    idx->add_option("--pq-m", pq_m, "PQ sub-quantizers (0 or unset: dim/8, at most 32)")->check(CLI::Range(0, 1024));
    idx->add_option("--nbits,--residual-nbits", nbits,
                    "Residual codec bits per dimension: 1, 2 or 4 (default 2); implies --codec residual")
        ->check(CLI::IsMember({1, 2, 4}));
    idx->add_option("--shards", shards,
                    "Shards: document ranges with their own stores, loaded and searched in parallel (0 or "
                    "unset: one per 2^28 tokens, so that a corpus that needs several GPUs is spread over them)")
        ->check(CLI::Range(0, tms::kMaxShards));
    idx->add_flag("--keep-vectors", keep_vectors, "Also store fp16 vectors (exhaustive search, exact rerank)");
    idx->add_option("--pool-factor", s->pool_factor,
                    "Token pooling (PyLate's pool_factor): merge each document's most similar tokens until "
                    "1/N of them remain (index size and search cost shrink; documents added later are pooled "
                    "alike; default 1: none)")
        ->check(CLI::Range(1, 64));
    idx->add_flag("--overwrite", overwrite, "Replace an existing index (only once the new one is complete)");
    idx->add_flag("--no-progress", no_progress, "No progress bars");
    auto* index_meta_opt = idx->add_option("--metadata", index_meta, kMetadataHelp);
    idx->add_option("--metadata-types", index_meta_types, kMetadataTypesHelp)->needs(index_meta_opt);
    idx->add_option("--text-field", io.text_field,
                    "The --metadata field that holds each document's text (strings): indexed for BM25 and hybrid "
                    "search (tms search --mode bm25|hybrid --query-text), kept in step by add, delete and compact")
        ->needs(index_meta_opt);
    idx->add_option("--spans-field", io.spans_field,
                    "The --metadata field that holds each document's token spans: [[start, end], ...] character "
                    "offsets into its --text-field text, one pair per token (a tokenizer's offset mapping); "
                    "tms search --explain then names the passage each query token matched")
        ->needs(index_meta_opt);
    idx->add_option("--text-tokenizer", io.text_tokenizer,
                    "The text's tokenizer (SQLite FTS5): unicode61, porter (unicode61 with Porter stemming) or trigram")
        ->capture_default_str()
        ->check(CLI::IsMember({"unicode61", "porter", "trigram"}));
#if TMS_WITH_MPI
    idx->add_option("--mpi-timeout", index_mpi_timeout,
                    "Under mpirun: seconds any rank waits for the others (training, the slowest rank's shards) "
                    "before ending the job")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
#endif
    idx->add_option("--threads", io.threads, "Threads (0: all cores)")->check(CLI::Range(0, tms::kMaxThreads));
    idx->add_option("--device", index_device, "Where centroid assignment runs: auto, cpu or gpu")
        ->capture_default_str();
    auto* no_estimate_flag = idx->add_flag(
        "--no-estimate", no_estimate,
        "Skip the recall estimate (with --keep-vectors the build ends by measuring its approximate search "
        "against exhaustive search on pseudo-queries; searches take their defaults from it)");
    idx->add_option("--estimate-queries", index_eo.queries,
                    "Pseudo-queries of the recall estimate (0: 256 on a GPU, 64 on the CPU)")
        ->capture_default_str()
        ->check(CLI::Range(0, 100000));
    idx->add_option("--estimate-sample", index_sample,
                    "The recall estimate measures these queries of your own (.npy [n, tokens, dim], e.g. a sample of "
                    "real ones) instead of pseudo-queries")
        ->check(CLI::ExistingFile)
        ->excludes(no_estimate_flag);
    auto run = [s, &ctx, codec_target_opt]() -> int {
        auto& io = s->io;
        auto& docs = s->docs;
        auto& doclens = s->doclens;
        auto& doc_ids = s->doc_ids;
        auto& index_out = s->index_out;
        auto& config = s->config;
        auto& n_centroids = s->n_centroids;
        auto& pq_m = s->pq_m;
        auto& nbits = s->nbits;
        auto& shards = s->shards;
        auto& codec = s->codec;
        auto& keep_vectors = s->keep_vectors;
        auto& overwrite = s->overwrite;
        auto& no_progress = s->no_progress;
        auto& index_meta = s->index_meta;
        auto& index_meta_types = s->index_meta_types;
        auto& index_mpi_timeout = s->index_mpi_timeout;
        auto& index_device = s->index_device;
        auto& no_estimate = s->no_estimate;
        auto& index_eo = s->index_eo;
        auto& index_sample = s->index_sample;
        int& argc = *ctx.argc;
        char**& argv = *ctx.argv;
        const bool from_stdin = docs == "-";
        if (from_stdin && !doclens.empty()) {
            return fail("index",
                        tms::Status::InvalidArgument(
                            "--doclens: the stream on standard input (--docs -) carries each batch's doclens"));
        }
        if (!from_stdin && s->expected_tokens > 0) {
            return fail("index", tms::Status::InvalidArgument(
                                     "--expected-tokens: for a stream (--docs -); files are measured, not expected"));
        }
        if (tms::Status st = tms::CheckOutputPath(index_out, tms::OutputKind::kIndex,
                                                  {{"--docs", from_stdin ? std::string() : docs},
                                                   {"--doclens", doclens},
                                                   {"--doc-ids", doc_ids},
                                                   {"--metadata", index_meta},
                                                   {"--config", config},
                                                   {"--estimate-sample", index_sample}})
                                 .WithContext("--out");
            !st.ok()) {
            return fail("index", st);
        }
        if (!config.empty()) {
            tms::Status st = tms::LoadBuildOptionsJson(config, &io);
            if (!st.ok()) return fail("index", st);
        }
        const bool auto_codec = codec == "auto";
        if (auto_codec) {
            // The choice is the compressed estimate's: the build's input at hand, and no vectors
            // whose exact rerank would make up for the codes.
            const char* why = keep_vectors || io.keep_vectors
                                  ? "--keep-vectors: the exact rerank makes up for the codes (use pq)"
                              : no_estimate             ? "--no-estimate: the choice is the estimate's"
                              : pq_m >= 0 || nbits >= 0 ? "--pq-m / --nbits: the choice is the estimate's"
                              : !std::filesystem::is_regular_file(docs)
                                  ? "--docs: the estimate needs one .npy file of the documents (not a directory or a "
                                    "stream)"
                                  : nullptr;
            if (why) return fail("index", tms::Status::InvalidArgument(std::string("--codec auto with ") + why));
        } else if (codec_target_opt->count() > 0) {
            return fail("index", tms::Status::InvalidArgument(
                                     "--target-recall: the codes' target with --codec auto (searches take theirs "
                                     "from tms search --target-recall)"));
        } else if (!codec.empty()) {
            io.codec = codec;
        }
        if (n_centroids >= 0) io.n_centroids = n_centroids;
        if (pq_m >= 0) io.pq_m = pq_m;
        if (nbits >= 0) {  // the residual codec's bits: --nbits alone means that codec (fast-plaid's nbits)
            if (codec == "pq") {
                return fail("index", tms::Status::InvalidArgument("--nbits is the residual codec's bits per "
                                                                  "dimension; --codec pq takes --pq-m"));
            }
            io.codec = "residual";
            io.residual_nbits = nbits;
        }
        if (shards >= 0) io.shards = shards;
        if (keep_vectors) io.keep_vectors = true;
        if (s->pool_factor > 0) io.pool_factor = s->pool_factor;
        io.overwrite = overwrite;
        io.progress = !no_progress;
        if (tms::Status st = parse_device(index_device, &io.device); !st.ok()) return fail("index", st);
        std::unique_ptr<tms::DocMetadata> metadata;
        if (tms::Status st = load_metadata(index_meta, index_meta_types, &metadata); !st.ok()) return fail("index", st);
        EstimateSample index_sample_q;
        if (tms::Status st = load_estimate_sample(index_sample, &index_sample_q, &index_eo); !st.ok()) {
            return fail("index", st);
        }
#if TMS_WITH_MPI
        if (under_mpirun() && auto_codec) {
            return fail("index", tms::Status::InvalidArgument("--codec auto: not in a distributed build"));
        }
        if (under_mpirun() && from_stdin) {
            return fail("index", tms::Status::InvalidArgument(
                                     "--docs -: a distributed build reads files every rank sees, not a stream"));
        }
        if (under_mpirun()) {
            int provided = 0, rank = 0;
            MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
            MPI_Comm_rank(MPI_COMM_WORLD, &rank);
            if (rank != 0) io.progress = false;
            tms::Status st;
            {
                const std::unique_ptr<tms::BuildGroup> group =
                    tms::MakeMpiBuildGroup(MPI_COMM_WORLD, index_mpi_timeout);
                index_eo.device = io.device;
                st = build_index(docs, doclens, doc_ids, index_out, io, group.get(), metadata.get(),
                                 no_estimate ? nullptr : &index_eo);
            }
            // Rank 0 says why before the job ends: once another rank has exited non-zero, mpirun
            // may end rank 0 at any moment after MPI_Finalize.
            const int rc = st.ok() ? 0 : rank != 0 ? exit_code(st) : fail("index", st);
            MPI_Finalize();
            return rc;
        }
#endif
        index_eo.device = io.device;
        tms::Status st = auto_codec   ? build_index_auto_codec(docs, doclens, doc_ids, index_out, io, metadata.get(),
                                                               index_eo, s->codec_target)
                         : from_stdin ? build_index_stream(doc_ids, index_out, io, s->expected_tokens, metadata.get(),
                                                           no_estimate ? nullptr : &index_eo)
                                      : build_index(docs, doclens, doc_ids, index_out, io, nullptr, metadata.get(),
                                                    no_estimate ? nullptr : &index_eo);
        return st.ok() ? 0 : fail("index", st);
    };
    return {idx, run};
}

}  // namespace tms::cli

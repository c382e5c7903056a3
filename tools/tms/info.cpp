// Copyright TileMaxSim authors. `tms info`: what an index holds, its recall estimate and metadata columns.
#include "tools/tms/common.h"

namespace tms::cli {
namespace {

tms::Status print_info(const std::string& path) {
    tms::IndexInfo i;
    TMS_RETURN_IF_ERROR(tms::ReadIndexInfo(path, &i));
    std::printf("index\t%s\nformat_version\t%d\ndocuments\t%lld\ntokens\t%lld\ndim\t%d\ncentroids\t%d\ncodec\t%s\n",
                path.c_str(), i.format_version, (long long)i.n_docs, (long long)i.n_tokens, i.dim, i.n_centroids,
                i.codec.c_str());
    if (i.codec == "pq")
        std::printf("pq_m\t%d\npq_nbits\t%d\n", i.pq_m, i.pq_nbits);
    else
        std::printf("residual_nbits\t%d\n", i.residual_nbits);
    std::printf("decoded_tokens\t%s\n", i.unit_norm ? "unit (normalised, as PLAID)" : "as decoded");
    std::printf("live_documents\t%lld\ndeleted\t%lld\n", (long long)(i.n_docs - i.n_deleted), (long long)i.n_deleted);
    std::printf(
        "code_bytes_per_token\t%.2f\nvectors\t%s\nvector_bytes_per_token\t%.2f\nchunks\t%lld\nbuild_config\t%s\n",
        i.code_bytes_per_token, i.has_vectors ? "yes" : "no", i.vector_bytes_per_token, (long long)i.n_chunks,
        i.build_config_json.c_str());
    // The build config keeps what was asked (0: the default rule); these are what it resolved to.
    if (i.has_vectors) {
        // Where a search with --vectors auto would keep them on this machine now.
        tms::VectorTier tier = tms::VectorTier::kNone;
        TMS_RETURN_IF_ERROR(tms::ResolveVectorTier(tms::SearcherOptions(), path, &tier));
        std::printf("vectors_bytes\t%lld\nvectors_auto\t%s\n", (long long)(i.n_tokens * i.dim * 2),
                    tms::VectorTierName(tier));
    }
    // The recall estimate (tms index --keep-vectors, tms estimate) and the settings it chose.
    tms::RecallEstimate e;
    const tms::Status est = tms::ReadRecallEstimate(path, &e);
    if (!est.ok() && est.code() != tms::Status::Code::kNotFound) return est;
    if (est.ok() && !e.points.empty()) {
        const tms::RecallPoint* d = e.Default() ? e.Default() : &e.points[0];
        std::printf("estimated_recall@%d\t%.4f\n", e.k, d->recall);
        std::printf("estimate_queries\t%d %s\n", e.queries, e.sampled ? "sample" : "pseudo");
        std::printf("estimate_truth\t%s\n", e.compressed ? "input (compressed ranking, no stored vectors)"
                                                         : "stored vectors (exhaustive search)");
        if (!e.measured_at.empty()) std::printf("estimate_measured_at\t%s\n", one_line(e.measured_at).c_str());
        for (const tms::RecallPoint& p : e.points) {
            std::printf("recall_curve\tnprobe %d\tncandidates %d\trerank %d\t%.4f\tse %.4f\n", p.nprobe, p.ncandidates,
                        p.rerank, p.recall, p.se);
        }
        const double target = tms::SearchOptions().target_recall;
        const tms::RecallPoint* t = e.For(target);
        std::printf("target_recall\t%.2f\tnprobe %d\tncandidates %d\trerank %d\n", target, t->nprobe, t->ncandidates,
                    t->rerank);
        const std::string advice = low_recall_advice(e);
        if (!advice.empty()) std::printf("hint\tlow estimated recall: %s\n", advice.c_str());
    }
    std::printf("shards\t%zu\n", i.shards.size());
    for (size_t s = 0; s < i.shards.size(); ++s) {
        const tms::ShardInfo& h = i.shards[s];
        std::printf("shard\t%zu\t%s\tfirst_doc %lld\tdocuments %lld\ttokens %lld\tbytes %lld\n", s, h.dir.c_str(),
                    (long long)h.first_doc, (long long)h.n_docs, (long long)h.n_tokens, (long long)h.bytes);
    }
    std::printf(
        "build_resolved\t{\"codec\": \"%s\", \"n_centroids\": %d, \"pq_m\": %d, \"pq_nbits\": %d, "
        "\"residual_nbits\": %d}\n",
        i.codec.c_str(), i.n_centroids, i.codec == "pq" ? i.pq_m : 0, i.codec == "pq" ? i.pq_nbits : 0,
        i.codec == "residual" ? i.residual_nbits : 0);
    // Document metadata, when the index has some: its rows, then one line per column.
    if (i.metadata_rows >= 0) {
        std::printf("metadata_rows\t%lld\n", (long long)i.metadata_rows);
        for (const tms::MetaColumn& c : i.metadata_columns) {
            std::printf("metadata_column\t%s\t%s\n", c.name.c_str(), tms::MetaTypeName(c.type));
        }
    }
    return tms::Status::OK();
}

}  // namespace

Command AddInfo(CLI::App& app) {
    struct State {
        std::string info_path;
    };
    auto s = std::make_shared<State>();
    auto& info_path = s->info_path;
    auto* info = app.add_subcommand("info", "Print what an index holds");
    info->add_option("--index", info_path, "Index directory")->required();
    auto run = [s]() -> int {
        auto& info_path = s->info_path;
        tms::Status st = print_info(info_path);
        return st.ok() ? 0 : fail("info", st);
    };
    return {info, run};
}

}  // namespace tms::cli

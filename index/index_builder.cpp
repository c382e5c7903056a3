// Copyright TileMaxSim authors. The public IndexBuilder: load, validate, build, write.
#include "tilemaxsim/index_builder.h"

#include <chrono>

#include "index/index_data.h"
#include "tilemaxsim/io.h"

namespace tms {

IndexBuilder::IndexBuilder(IndexBuildOptions opts, std::string path) : opts_(std::move(opts)), path_(std::move(path)) {}
IndexBuilder::~IndexBuilder() = default;

Status IndexBuilder::Create(const IndexBuildOptions& opts, const std::string& path, std::unique_ptr<IndexBuilder>* out) {
    if (path.empty()) return Status::InvalidArgument("index path is empty");
    if (opts.codec != "pq" && opts.codec != "residual") {
        return Status::InvalidArgument("unknown codec '" + opts.codec + "' (expected pq or residual)");
    }
    if (opts.n_centroids < 0) return Status::InvalidArgument("n_centroids must be >= 0");
    if (opts.chunk_docs <= 0) return Status::InvalidArgument("chunk_docs must be > 0");
    if (opts.kmeans_iters <= 0) return Status::InvalidArgument("kmeans_iters must be > 0");
    out->reset(new IndexBuilder(opts, path));
    return Status::OK();
}

Status IndexBuilder::Build(const EmbeddingView& tokens, const std::vector<int64_t>& doclens,
                           const std::vector<std::string>& doc_ids, BuildStats* stats) {
    const auto t0 = std::chrono::steady_clock::now();
    index::IndexData data;
    std::vector<std::pair<std::string, double>> phases;
    TMS_RETURN_IF_ERROR(index::BuildIndexData(tokens, doclens, doc_ids, opts_, &data, &phases));
    const auto tw = std::chrono::steady_clock::now();
    TMS_RETURN_IF_ERROR(index::WriteIndex(path_, data, opts_));
    const auto t1 = std::chrono::steady_clock::now();
    phases.emplace_back("write", std::chrono::duration<double>(t1 - tw).count());
    if (stats) {
        stats->n_docs = data.info.n_docs;
        stats->n_tokens = data.info.n_tokens;
        stats->n_centroids = data.info.n_centroids;
        stats->dim = data.info.dim;
        stats->code_bytes_per_token = data.info.code_bytes_per_token;
        stats->phase_seconds.insert(stats->phase_seconds.end(), phases.begin(), phases.end());
        stats->seconds_total += std::chrono::duration<double>(t1 - t0).count();
    }
    return Status::OK();
}

Status IndexBuilder::BuildFromFiles(const std::string& docs_npy, const std::string& doclens_npy,
                                    const std::string& doc_ids_txt, BuildStats* stats) {
    const auto t0 = std::chrono::steady_clock::now();
    HostArray docs, lens;
    TMS_RETURN_IF_ERROR(LoadNpy(docs_npy, &docs));
    EmbeddingView view;
    TMS_RETURN_IF_ERROR(EmbeddingsFromArray(docs, 2, docs_npy, &view));
    TMS_RETURN_IF_ERROR(LoadNpy(doclens_npy, &lens));
    std::vector<int64_t> doclens;
    TMS_RETURN_IF_ERROR(IntegersFromArray(lens, doclens_npy, &doclens));
    std::vector<std::string> ids;
    if (!doc_ids_txt.empty()) TMS_RETURN_IF_ERROR(ReadLines(doc_ids_txt, &ids));
    // Name the right file in shape errors before the build starts.
    int64_t sum = 0;
    for (size_t i = 0; i < doclens.size(); ++i) {
        if (doclens[i] <= 0) {
            return Status::InvalidArgument(doclens_npy + ": document " + std::to_string(i) + " has " +
                                           std::to_string(doclens[i]) + " tokens (must be >= 1)");
        }
        sum += doclens[i];
    }
    if (doclens.empty()) return Status::InvalidArgument(doclens_npy + ": no documents");
    if (sum != view.rows) {
        return Status::InvalidArgument(doclens_npy + ": lengths sum to " + std::to_string(sum) + " tokens but " +
                                       docs_npy + " has " + std::to_string(view.rows) + " rows");
    }
    if (!doc_ids_txt.empty() && ids.size() != doclens.size()) {
        return Status::InvalidArgument(doc_ids_txt + ": " + std::to_string(ids.size()) + " ids for " +
                                       std::to_string(doclens.size()) + " documents in " + doclens_npy);
    }
    if (stats) {
        stats->phase_seconds.emplace_back("load", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    Status st = Build(view, doclens, ids, stats);
    if (!st.ok() && st.message().rfind("doc-ids:", 0) == 0 && !doc_ids_txt.empty()) {
        return Status(st.code(), doc_ids_txt + st.message().substr(7));
    }
    return st;
}

Status ReadIndexInfo(const std::string& path, IndexInfo* info) { return index::ReadIndexInfo(path, info); }

}  // namespace tms

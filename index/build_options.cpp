// Copyright TileMaxSim authors. IndexBuildOptions <-> JSON (the nlohmann adapter).
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tilemaxsim/options.h"

namespace tms {

Status ParseBuildOptionsJson(const std::string& text, IndexBuildOptions* o) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        return Status::InvalidArgument(std::string("invalid JSON: ") + e.what());
    }
    if (!j.is_object()) return Status::InvalidArgument("expected a JSON object");
    // A preset may hold "build" and "search" sections; the build section is read here.
    if (j.contains("build")) j = j["build"];
    for (auto it = j.begin(); it != j.end(); ++it) {
        const std::string& k = it.key();
        const auto& v = it.value();
        try {
            if (k == "codec") o->codec = v.get<std::string>();
            else if (k == "n_centroids") o->n_centroids = v.get<int>();
            else if (k == "kmeans_iters") o->kmeans_iters = v.get<int>();
            else if (k == "max_train_tokens") o->max_train_tokens = v.get<int64_t>();
            else if (k == "pq_m") o->pq_m = v.get<int>();
            else if (k == "pq_nbits") o->pq_nbits = v.get<int>();
            else if (k == "residual_nbits") o->residual_nbits = v.get<int>();
            else if (k == "keep_vectors") o->keep_vectors = v.get<bool>();
            else if (k == "chunk_docs") o->chunk_docs = v.get<int>();
            else if (k == "seed") o->seed = v.get<uint64_t>();
            else if (k == "threads") o->threads = v.get<int>();
            else if (k == "ivf_memory_entries") o->ivf_memory_entries = v.get<int64_t>();
            else if (k == "search" || k == "description") continue;
            else return Status::InvalidArgument("unknown key '" + k + "'");
        } catch (const nlohmann::json::exception&) {
            return Status::InvalidArgument("key '" + k + "' has the wrong type");
        }
    }
    if (o->n_centroids < 0) return Status::InvalidArgument("n_centroids must be >= 0");
    if (o->kmeans_iters <= 0) return Status::InvalidArgument("kmeans_iters must be > 0");
    if (o->chunk_docs <= 0) return Status::InvalidArgument("chunk_docs must be > 0");
    if (o->pq_m < 0) return Status::InvalidArgument("pq_m must be >= 0");
    if (o->ivf_memory_entries <= 0) return Status::InvalidArgument("ivf_memory_entries must be > 0");
    return Status::OK();
}

Status LoadBuildOptionsJson(const std::string& path, IndexBuildOptions* opts) {
    std::ifstream f(path);
    if (!f) return Status::NotFound(path + ": no such file");
    std::stringstream ss;
    ss << f.rdbuf();
    return ParseBuildOptionsJson(ss.str(), opts).WithContext(path);
}

std::string BuildOptionsToJson(const IndexBuildOptions& o) {
    nlohmann::json j;
    j["codec"] = o.codec;
    j["n_centroids"] = o.n_centroids;
    j["kmeans_iters"] = o.kmeans_iters;
    j["max_train_tokens"] = o.max_train_tokens;
    j["pq_m"] = o.pq_m;
    j["pq_nbits"] = o.pq_nbits;
    j["residual_nbits"] = o.residual_nbits;
    j["keep_vectors"] = o.keep_vectors;
    j["chunk_docs"] = o.chunk_docs;
    j["seed"] = o.seed;
    return j.dump();
}

}  // namespace tms

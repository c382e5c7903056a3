// Copyright TileMaxSim authors. IndexBuildOptions <-> JSON (the nlohmann adapter).
#include <cctype>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>
#include <sstream>

#include "index/metadata/metadata.h"
#include "index/metadata/names.h"
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
    if (j.contains("build")) {
        nlohmann::json build = j["build"];
        if (!build.is_object()) return Status::InvalidArgument("key 'build' must be an object");
        j = std::move(build);
    }
    for (auto it = j.begin(); it != j.end(); ++it) {
        const std::string& k = it.key();
        const auto& v = it.value();
        // An integer option: a JSON integer within the field's type (a float, or a number past
        // the type, is an error rather than a conversion).
        const auto integer = [&](auto* field) -> Status {
            using T = std::remove_pointer_t<decltype(field)>;
            const auto range = Status::InvalidArgument("key '" + k + "' is out of range");
            if (!v.is_number_integer()) return Status::InvalidArgument("key '" + k + "' must be an integer");
            if (v.is_number_unsigned()) {
                const uint64_t u = v.get<uint64_t>();
                if (u > uint64_t(std::numeric_limits<T>::max())) return range;
                *field = T(u);
                return Status::OK();
            }
            const int64_t x = v.get<int64_t>();
            if constexpr (std::is_unsigned_v<T>) {
                if (x < 0) return range;
            } else {
                if (x < int64_t(std::numeric_limits<T>::min()) || x > int64_t(std::numeric_limits<T>::max()))
                    return range;
            }
            *field = T(x);
            return Status::OK();
        };
        try {
            Status st;
            if (k == "codec")
                o->codec = v.get<std::string>();
            else if (k == "centroids_from")
                o->centroids_from = v.get<std::string>();
            else if (k == "n_centroids")
                st = integer(&o->n_centroids);
            else if (k == "kmeans_iters")
                st = integer(&o->kmeans_iters);
            else if (k == "max_train_tokens")
                st = integer(&o->max_train_tokens);
            else if (k == "train_tokens_per_centroid")
                st = integer(&o->train_tokens_per_centroid);
            else if (k == "pq_m")
                st = integer(&o->pq_m);
            else if (k == "pq_nbits")
                st = integer(&o->pq_nbits);
            else if (k == "residual_nbits")
                st = integer(&o->residual_nbits);
            else if (k == "keep_vectors")
                o->keep_vectors = v.get<bool>();
            else if (k == "text_field")
                o->text_field = v.get<std::string>();
            else if (k == "text_tokenizer")
                o->text_tokenizer = v.get<std::string>();
            else if (k == "spans_field")
                o->spans_field = v.get<std::string>();
            else if (k == "chunk_docs")
                st = integer(&o->chunk_docs);
            else if (k == "shards")
                st = integer(&o->shards);
            else if (k == "gpu")
                st = integer(&o->gpu);
            else if (k == "seed")
                st = integer(&o->seed);
            else if (k == "threads")
                st = integer(&o->threads);
            else if (k == "ivf_memory_entries")
                st = integer(&o->ivf_memory_entries);
            else if (k == "pool_factor")
                st = integer(&o->pool_factor);
            else if (k == "search" || k == "description")
                continue;
            else
                return Status::InvalidArgument("unknown key '" + k + "'");
            if (!st.ok()) return st;
        } catch (const nlohmann::json::exception&) {
            return Status::InvalidArgument("key '" + k + "' has the wrong type");
        }
    }
    return ValidateBuildOptions(*o);
}

Status ValidateBuildOptions(const IndexBuildOptions& o) {
    const auto range = [](const char* name, int64_t v, int64_t lo, int64_t hi) {
        if (v >= lo && v <= hi) return Status::OK();
        return Status::InvalidArgument(std::string(name) + " must be in [" + std::to_string(lo) + ", " +
                                       std::to_string(hi) + "], got " + std::to_string(v));
    };
    if (o.codec != "pq" && o.codec != "residual") {
        return Status::InvalidArgument("unknown codec '" + o.codec + "' (expected pq or residual)");
    }
    TMS_RETURN_IF_ERROR(range("n_centroids", o.n_centroids, 0, 1 << 24));
    if (!o.centroids_from.empty() && o.n_centroids > 0) {
        return Status::InvalidArgument("n_centroids with centroids_from: the centroids are those of " +
                                       o.centroids_from);
    }
    TMS_RETURN_IF_ERROR(range("kmeans_iters", o.kmeans_iters, 1, 1000));
    TMS_RETURN_IF_ERROR(range("max_train_tokens", o.max_train_tokens, 0, int64_t(1) << 40));
    TMS_RETURN_IF_ERROR(range("train_tokens_per_centroid", o.train_tokens_per_centroid, 1, 1 << 16));
    TMS_RETURN_IF_ERROR(range("pq_m", o.pq_m, 0, 1024));
    TMS_RETURN_IF_ERROR(range("pq_nbits", o.pq_nbits, 8, 8));
    if (o.residual_nbits != 1 && o.residual_nbits != 2 && o.residual_nbits != 4) {
        return Status::InvalidArgument("residual_nbits must be 1, 2 or 4, got " + std::to_string(o.residual_nbits));
    }
    TMS_RETURN_IF_ERROR(range("chunk_docs", o.chunk_docs, 1, 1 << 20));
    if (!o.text_field.empty()) {
        TMS_RETURN_IF_ERROR(index::CheckMetaColumnName(o.text_field, "text_field"));
        std::string low = o.text_field;
        for (char& c : low) c = char(std::tolower(static_cast<unsigned char>(c)));
        if (low == "rank" || low == "rowid" || low == "texts") {  // FTS5's own names
            return Status::InvalidArgument("text_field '" + o.text_field +
                                           "': rank, rowid and texts are reserved by SQLite FTS5 (rename the field)");
        }
    }
    TMS_RETURN_IF_ERROR(index::CheckTextTokenizer(o.text_tokenizer));
    if (!o.spans_field.empty()) {
        TMS_RETURN_IF_ERROR(index::CheckMetaColumnName(o.spans_field, "spans_field"));
        if (o.text_field.empty()) {
            return Status::InvalidArgument("spans_field '" + o.spans_field +
                                           "': spans are offsets into the text, so a text_field is needed");
        }
        if (index::lower(o.spans_field) == index::lower(o.text_field)) {
            return Status::InvalidArgument("spans_field '" + o.spans_field + "' is the text_field");
        }
        if (o.pool_factor > 1) {
            return Status::InvalidArgument("spans_field '" + o.spans_field +
                                           "' with pool_factor > 1: a pooled token has no one span");
        }
    }
    TMS_RETURN_IF_ERROR(range("shards", o.shards, 0, kMaxShards));
    TMS_RETURN_IF_ERROR(range("gpu", o.gpu, 0, 1023));
    TMS_RETURN_IF_ERROR(range("threads", o.threads, 0, kMaxThreads));
    TMS_RETURN_IF_ERROR(range("ivf_memory_entries", o.ivf_memory_entries, 1, int64_t(1) << 40));
    TMS_RETURN_IF_ERROR(range("pool_factor", o.pool_factor, 1, 64));
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
    j["train_tokens_per_centroid"] = o.train_tokens_per_centroid;
    j["pq_m"] = o.pq_m;
    j["pq_nbits"] = o.pq_nbits;
    j["residual_nbits"] = o.residual_nbits;
    j["keep_vectors"] = o.keep_vectors;
    if (!o.text_field.empty()) {
        j["text_field"] = o.text_field;
        j["text_tokenizer"] = o.text_tokenizer;
        if (!o.spans_field.empty()) j["spans_field"] = o.spans_field;
    }
    if (o.pool_factor > 1) j["pool_factor"] = o.pool_factor;
    j["chunk_docs"] = o.chunk_docs;
    j["shards"] = o.shards;
    j["gpu"] = o.gpu;
    j["seed"] = o.seed;
    return j.dump();
}

}  // namespace tms

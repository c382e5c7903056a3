// Copyright TileMaxSim authors. IndexModel <-> bytes (a distributed build sends the model rank 0
// trained to the other ranks; same machine type, so native byte order).
#include <cstring>

#include "index/model.h"

#include "tilemaxsim/index_builder.h"
#include "tilemaxsim/options.h"
#include "index/store/crc32c.h"

namespace tms::index {
namespace {

void put_int(std::string* b, int64_t v) { b->append(reinterpret_cast<const char*>(&v), sizeof(v)); }
void put_floats(std::string* b, const std::vector<float>& v) {
    put_int(b, int64_t(v.size()));
    b->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

}  // namespace

std::string ModelToBytes(const IndexModel& m) {
    std::string b;
    for (int64_t v : {int64_t(m.dim), int64_t(m.n_centroids), int64_t(m.pq_m), int64_t(m.pq_nbits),
                      int64_t(m.residual_nbits), int64_t(m.n_code_bytes), int64_t(m.unit_norm)})
        put_int(&b, v);
    put_int(&b, int64_t(m.codec.size()));
    b += m.codec;
    for (const auto* v : {&m.centroids, &m.codebook, &m.residual_cutoffs, &m.residual_weights}) put_floats(&b, *v);
    return b;
}

Status ModelFromBytes(const std::string& b, IndexModel* m) {
    size_t at = 0;
    const auto bad = Status::Corruption("a model received from rank 0 is truncated");
    auto get_int = [&](int64_t* v) {
        if (b.size() - at < sizeof(*v)) return false;
        std::memcpy(v, b.data() + at, sizeof(*v));
        at += sizeof(*v);
        return true;
    };
    int64_t f[7], len = 0;
    for (int64_t& v : f)
        if (!get_int(&v)) return bad;
    if (!get_int(&len) || len < 0 || b.size() - at < size_t(len)) return bad;
    *m = IndexModel();
    m->dim = int(f[0]);
    m->n_centroids = int(f[1]);
    m->pq_m = int(f[2]);
    m->pq_nbits = int(f[3]);
    m->residual_nbits = int(f[4]);
    m->n_code_bytes = int(f[5]);
    m->unit_norm = f[6] != 0;
    m->codec.assign(b.data() + at, size_t(len));
    at += size_t(len);
    for (auto* v : {&m->centroids, &m->codebook, &m->residual_cutoffs, &m->residual_weights}) {
        if (!get_int(&len) || len < 0 || (b.size() - at) / sizeof(float) < size_t(len)) return bad;
        v->resize(size_t(len));
        std::memcpy(v->data(), b.data() + at, size_t(len) * sizeof(float));
        at += size_t(len) * sizeof(float);
    }
    return at == b.size() ? Status::OK() : bad;
}

uint32_t ModelCrc(const IndexModel& m) {
    uint32_t c = Crc32(m.centroids.data(), m.centroids.size() * sizeof(float));
    c = Crc32(m.codebook.data(), m.codebook.size() * sizeof(float), c);
    c = Crc32(m.residual_cutoffs.data(), m.residual_cutoffs.size() * sizeof(float), c);
    return Crc32(m.residual_weights.data(), m.residual_weights.size() * sizeof(float), c);
}

void FillBuildStats(const IndexInfo& info, BuildStats* stats) {
    stats->n_docs = info.n_docs;
    stats->n_tokens = info.n_tokens;
    stats->n_centroids = info.n_centroids;
    stats->dim = info.dim;
    stats->code_bytes_per_token = info.code_bytes_per_token;
}

void FillInfo(const IndexModel& m, int64_t n_docs, int64_t n_tokens, const IndexBuildOptions& opts, IndexInfo* info) {
    *info = IndexInfo{};
    info->n_docs = n_docs;
    info->n_tokens = n_tokens;
    info->dim = m.dim;
    info->n_centroids = m.n_centroids;
    info->codec = m.codec;
    info->pq_m = m.pq_m;
    info->pq_nbits = m.pq_nbits;
    info->residual_nbits = m.residual_nbits;
    info->has_vectors = opts.keep_vectors;
    info->code_bytes_per_token = 4.0 + m.n_code_bytes;  // u32 centroid id + codes
    info->vector_bytes_per_token = opts.keep_vectors ? 2.0 * m.dim : 0.0;
    info->build_config_json = BuildOptionsToJson(opts);
}

}  // namespace tms::index

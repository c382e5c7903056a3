// Copyright TileMaxSim authors. Synthetic ColBERT-like corpus generator.
#include "tools/lib/synth.h"

#include <cmath>
#include <filesystem>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <unordered_map>
#include <vector>

#include "kernels/maxsim.h"
#include "index/ingest/files.h"
#include "index/ingest/npy.h"

namespace tms {
namespace {

using Vec = std::vector<float>;

void normalize(float* v, int dim) {
    double s = 0;
    for (int i = 0; i < dim; ++i) s += double(v[i]) * v[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(std::max(s, 1e-30)));
    for (int i = 0; i < dim; ++i) v[i] *= inv;
}

Vec random_unit(int dim, std::mt19937_64& rng) {
    std::normal_distribution<float> n01;
    Vec v(dim);
    for (float& x : v) x = n01(rng);
    normalize(v.data(), dim);
    return v;
}

// a * x + b * y + noise * N(0, 1/dim), normalised.
void mix(const float* x, float a, const float* y, float b, float noise, int dim, std::mt19937_64& rng, float* out) {
    std::normal_distribution<float> n01;
    const float sd = noise / std::sqrt(static_cast<float>(dim));
    for (int i = 0; i < dim; ++i) out[i] = a * x[i] + (y ? b * y[i] : 0.f) + sd * n01(rng);
    normalize(out, dim);
}

// Writes a .npy whose shape is known up front, payload appended in pieces; PATH.tmp renamed at Close.
class NpyStreamWriter {
public:
    Status Open(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape) {
        path_ = path;
        f_.open(path + ".tmp", std::ios::binary | std::ios::trunc);
        if (!f_) return Status::IOError(path + ".tmp: cannot create: " + std::strerror(errno));
        const std::string header = NpyHeader(descr, shape);
        f_.write(header.data(), static_cast<std::streamsize>(header.size()));
        return f_ ? Status::OK() : Status::IOError(path + ".tmp: write failed");
    }
    Status Append(const void* data, size_t n) {
        f_.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
        return f_ ? Status::OK() : Status::IOError(path_ + ".tmp: write failed (disk full?)");
    }
    Status Close() {
        f_.flush();
        if (!f_) return Status::IOError(path_ + ".tmp: write failed (disk full?)");
        f_.close();
        std::error_code ec;
        std::filesystem::rename(path_ + ".tmp", path_, ec);
        return ec ? Status::IOError(path_ + ": rename failed: " + ec.message()) : Status::OK();
    }

private:
    std::string path_;
    std::ofstream f_;
};

}  // namespace

Status WriteSynthCorpus(const SynthOptions& o, const std::string& dir) {
    if (o.n_docs <= 0) return Status::InvalidArgument("--docs must be > 0");
    if (o.n_queries < 0) return Status::InvalidArgument("--queries must be >= 0");
    if (o.dim < 32 || o.dim > 1024) return Status::InvalidArgument("--dim must be in [32, 1024]");
    if (o.q_tokens <= 0 || o.min_doc_len <= 0 || o.max_doc_len < o.min_doc_len) {
        return Status::InvalidArgument("token counts must be positive and min <= max");
    }
    if (o.n_docs > INT32_MAX) return Status::InvalidArgument("--docs too large");
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return Status::IOError(dir + ": cannot create: " + ec.message());
    const int dim = o.dim;
    std::mt19937_64 rng(o.seed);
    const int n_topics = static_cast<int>(std::max<int64_t>(8, o.n_docs / 25));
    constexpr int kWords = 48;  // topic vocabulary
    std::vector<Vec> topic_words(size_t(n_topics) * kWords);
    for (int t = 0; t < n_topics; ++t) {
        Vec center = random_unit(dim, rng);
        for (int w = 0; w < kWords; ++w) {
            Vec r = random_unit(dim, rng);
            topic_words[size_t(t) * kWords + w].resize(dim);
            mix(center.data(), 0.6f, r.data(), 0.8f, 0.0f, dim, rng, topic_words[size_t(t) * kWords + w].data());
        }
    }
    // Documents: topic words with noise, plus a few document-specific tokens.
    std::uniform_int_distribution<int> len_d(o.min_doc_len, o.max_doc_len), topic_d(0, n_topics - 1),
        word_d(0, kWords - 1);
    std::uniform_real_distribution<float> u01;
    std::vector<int32_t> doclens(o.n_docs), doc_topic(o.n_docs);
    int64_t total = 0;
    for (int64_t d = 0; d < o.n_docs; ++d) {
        doclens[d] = len_d(rng);
        doc_topic[d] = topic_d(rng);
        total += doclens[d];
    }
    // Relevant documents of the queries, chosen up front so that their tokens can be kept while
    // the corpus streams to disk (memory stays bounded whatever the corpus size).
    std::uniform_int_distribution<int64_t> doc_d(0, o.n_docs - 1);
    std::vector<int64_t> rel(o.n_queries);
    for (auto& r : rel) r = doc_d(rng);
    std::vector<int64_t> want(rel);
    std::sort(want.begin(), want.end());
    want.erase(std::unique(want.begin(), want.end()), want.end());
    std::unordered_map<int64_t, std::vector<uint16_t>> kept;
    const std::filesystem::path p(dir);
    NpyStreamWriter docs_out;
    TMS_RETURN_IF_ERROR(docs_out.Open((p / "docs.npy").string(), "<f2", {total, dim}));
    // Documents are generated in parallel blocks, each document from its own generator seeded
    // by (seed, document), so the corpus does not depend on the thread count.
    std::vector<int64_t> offsets(o.n_docs + 1, 0);
    for (int64_t d = 0; d < o.n_docs; ++d) offsets[d + 1] = offsets[d] + doclens[d];
    const int64_t block = 8192;
    std::vector<uint16_t> buf;
    for (int64_t b0 = 0; b0 < o.n_docs; b0 += block) {
        const int64_t b1 = std::min<int64_t>(o.n_docs, b0 + block);
        buf.resize(size_t(offsets[b1] - offsets[b0]) * dim);
#pragma omp parallel for schedule(dynamic, 64)
        for (int64_t d = b0; d < b1; ++d) {
            std::mt19937_64 drng(o.seed * 0x9E3779B97F4A7C15ull + uint64_t(d) + 1);
            std::uniform_int_distribution<int> wd(0, kWords - 1);
            std::uniform_real_distribution<float> u(0.f, 1.f);
            Vec own = random_unit(dim, drng), t(dim);
            uint16_t* out = buf.data() + size_t(offsets[d] - offsets[b0]) * dim;
            for (int32_t k = 0; k < doclens[d]; ++k) {
                const Vec& w = topic_words[size_t(doc_topic[d]) * kWords + wd(drng)];
                if (u(drng) < 0.25f) {
                    Vec r = random_unit(dim, drng);
                    mix(own.data(), 0.7f, r.data(), 0.7f, 0.3f, dim, drng, t.data());
                } else {
                    mix(w.data(), 1.0f, nullptr, 0.f, 0.45f, dim, drng, t.data());
                }
                for (int i = 0; i < dim; ++i) out[size_t(k) * dim + i] = kernels::float_to_half(t[i]);
            }
        }
        for (auto it = std::lower_bound(want.begin(), want.end(), b0); it != want.end() && *it < b1; ++it) {
            const size_t s0 = size_t(offsets[*it] - offsets[b0]) * dim,
                         s1 = size_t(offsets[*it + 1] - offsets[b0]) * dim;
            kept[*it].assign(buf.begin() + s0, buf.begin() + s1);
        }
        TMS_RETURN_IF_ERROR(docs_out.Append(buf.data(), buf.size() * 2));
    }
    Vec tok(dim);
    TMS_RETURN_IF_ERROR(docs_out.Close());
    // Queries: noisy copies of tokens of the relevant document + words of its topic.
    std::vector<uint16_t> queries(size_t(o.n_queries) * o.q_tokens * dim);
    std::vector<std::string> qids, qrels{"query-id\tcorpus-id\tscore"}, dids(o.n_docs);
    for (int64_t d = 0; d < o.n_docs; ++d) dids[d] = "doc" + std::to_string(d);
    for (int q = 0; q < o.n_queries; ++q) {
        qids.push_back("q" + std::to_string(q));
        qrels.push_back(qids.back() + "\t" + dids[rel[q]] + "\t1");
        const std::vector<uint16_t>& src_doc = kept[rel[q]];
        std::uniform_int_distribution<int64_t> tok_d(0, doclens[rel[q]] - 1);
        for (int i = 0; i < o.q_tokens; ++i) {
            if (u01(rng) < 0.3f) {
                Vec src(dim);
                const int64_t t = tok_d(rng);
                for (int c = 0; c < dim; ++c) src[c] = kernels::half_to_float(src_doc[size_t(t) * dim + c]);
                mix(src.data(), 1.0f, nullptr, 0.f, 1.1f, dim, rng, tok.data());
            } else {
                const Vec& w = topic_words[size_t(doc_topic[rel[q]]) * kWords + word_d(rng)];
                mix(w.data(), 1.0f, nullptr, 0.f, 0.6f, dim, rng, tok.data());
            }
            for (int c = 0; c < dim; ++c)
                queries[(size_t(q) * o.q_tokens + i) * dim + c] = kernels::float_to_half(tok[c]);
        }
    }
    TMS_RETURN_IF_ERROR(SaveNpy((p / "doclens.npy").string(), "<i4", {o.n_docs}, doclens.data(), doclens.size() * 4));
    TMS_RETURN_IF_ERROR(WriteLines((p / "doc_ids.txt").string(), dids));
    TMS_RETURN_IF_ERROR(SaveNpy((p / "queries.npy").string(), "<f2", {o.n_queries, o.q_tokens, dim}, queries.data(),
                                queries.size() * 2));
    TMS_RETURN_IF_ERROR(WriteLines((p / "query_ids.txt").string(), qids));
    TMS_RETURN_IF_ERROR(WriteLines((p / "qrels.tsv").string(), qrels));
    return Status::OK();
}

}  // namespace tms

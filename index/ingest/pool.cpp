// Copyright TileMaxSim authors. Token pooling: each document's most similar tokens merged before encoding.
#include "index/ingest/pool.h"

#include <algorithm>
#include <cmath>
#include <new>

#include "kernels/maxsim.h"

namespace tms::index {

void PoolTokens(const float* x, int64_t n, int dim, int64_t keep, float* out) {
    keep = std::clamp<int64_t>(keep, 1, std::max<int64_t>(n, 1));
    if (keep >= n) {
        std::copy(x, x + n * dim, out);
        return;
    }
    // Clusters by their first token: the sum of their tokens, how many, the sum of their norms.
    std::vector<double> sum(x, x + n * dim);
    std::vector<double> norm_sum(size_t(n), 0.0), len(size_t(n), 0.0);
    std::vector<int64_t> count(size_t(n), 1);
    std::vector<char> alive(size_t(n), 1);
    const auto vec_norm = [&](int64_t a) {
        double s = 0;
        for (int j = 0; j < dim; ++j) s += sum[size_t(a * dim + j)] * sum[size_t(a * dim + j)];
        return std::sqrt(s);
    };
    for (int64_t a = 0; a < n; ++a) norm_sum[size_t(a)] = len[size_t(a)] = vec_norm(a);
    const auto cosine = [&](int64_t a, int64_t b) {
        if (len[size_t(a)] == 0 || len[size_t(b)] == 0) return -2.0;  // a zero vector joins last
        double s = 0;
        for (int j = 0; j < dim; ++j) s += sum[size_t(a * dim + j)] * sum[size_t(b * dim + j)];
        return s / (len[size_t(a)] * len[size_t(b)]);
    };
    std::vector<double> sim(size_t(n * n), -3.0);
    for (int64_t a = 0; a < n; ++a)
        for (int64_t b = a + 1; b < n; ++b) sim[size_t(a * n + b)] = sim[size_t(b * n + a)] = cosine(a, b);
    // Each cluster's most similar partner (the lowest on ties).
    std::vector<int64_t> best(size_t(n), -1);
    const auto find_best = [&](int64_t a) {
        int64_t arg = -1;
        for (int64_t b = 0; b < n; ++b)
            if (b != a && alive[size_t(b)] && (arg < 0 || sim[size_t(a * n + b)] > sim[size_t(a * n + arg)])) arg = b;
        best[size_t(a)] = arg;
    };
    for (int64_t a = 0; a < n; ++a) find_best(a);
    for (int64_t left = n; left > keep; --left) {
        int64_t a = -1;
        for (int64_t c = 0; c < n; ++c) {
            if (!alive[size_t(c)]) continue;
            if (a < 0 || sim[size_t(c * n + best[size_t(c)])] > sim[size_t(a * n + best[size_t(a)])]) a = c;
        }
        int64_t b = best[size_t(a)];
        if (b < a) std::swap(a, b);  // the merged cluster keeps the first token's name
        for (int j = 0; j < dim; ++j) sum[size_t(a * dim + j)] += sum[size_t(b * dim + j)];
        norm_sum[size_t(a)] += norm_sum[size_t(b)];
        count[size_t(a)] += count[size_t(b)];
        len[size_t(a)] = vec_norm(a);
        alive[size_t(b)] = 0;
        for (int64_t c = 0; c < n; ++c)
            if (alive[size_t(c)] && c != a) sim[size_t(a * n + c)] = sim[size_t(c * n + a)] = cosine(a, c);
        find_best(a);
        for (int64_t c = 0; c < n; ++c) {
            if (!alive[size_t(c)] || c == a) continue;
            if (best[size_t(c)] == a || best[size_t(c)] == b) {
                find_best(c);
            } else if (sim[size_t(c * n + a)] > sim[size_t(c * n + best[size_t(c)])] ||
                       (sim[size_t(c * n + a)] == sim[size_t(c * n + best[size_t(c)])] && a < best[size_t(c)])) {
                best[size_t(c)] = a;
            }
        }
    }
    int64_t o = 0;
    for (int64_t a = 0; a < n; ++a) {
        if (!alive[size_t(a)]) continue;
        const double scale = len[size_t(a)] > 0 ? norm_sum[size_t(a)] / double(count[size_t(a)]) / len[size_t(a)] : 0.0;
        for (int j = 0; j < dim; ++j) out[size_t(o * dim + j)] = float(sum[size_t(a * dim + j)] * scale);
        ++o;
    }
}

Status PoolDocuments(const EmbeddingView& tokens, const std::vector<int64_t>& doclens, int factor,
                     std::vector<uint16_t>* out, std::vector<int64_t>* out_lens) {
    const int dim = tokens.dim;
    std::vector<int64_t> in_off(doclens.size() + 1, 0), out_off(doclens.size() + 1, 0);
    out_lens->resize(doclens.size());
    for (size_t d = 0; d < doclens.size(); ++d) {
        in_off[d + 1] = in_off[d] + doclens[d];
        (*out_lens)[d] = PooledLength(doclens[d], factor);
        out_off[d + 1] = out_off[d] + (*out_lens)[d];
    }
    try {
        out->resize(size_t(out_off.back()) * size_t(dim));
    } catch (const std::bad_alloc&) {
        return Status::ResourceExhausted("out of host memory pooling tokens");
    }
    const int64_t n_docs = int64_t(doclens.size());
#pragma omp parallel
    {
        std::vector<float> x, y;
#pragma omp for schedule(dynamic, 16)
        for (int64_t d = 0; d < n_docs; ++d) {
            const int64_t n = doclens[size_t(d)], keep = (*out_lens)[size_t(d)];
            x.resize(size_t(n * dim));
            y.resize(size_t(keep * dim));
            kernels::load_as_float_n(tokens.data, tokens.dtype, in_off[size_t(d)] * dim, n * dim, x.data());
            PoolTokens(x.data(), n, dim, keep, y.data());
            uint16_t* o = out->data() + out_off[size_t(d)] * dim;
            for (int64_t i = 0; i < keep * dim; ++i) o[i] = kernels::float_to_half(y[size_t(i)]);
        }
    }
    return Status::OK();
}

}  // namespace tms::index

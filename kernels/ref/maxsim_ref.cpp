// Copyright TileMaxSim authors. Scalar reference implementations: THE SPEC.
// fp64 accumulation, no blocking, no threads. Every other path is tested against these.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/maxsim.h"

namespace tms::kernels {
namespace {

int query_len(const int32_t* lens, int q, int q_stride) { return lens ? lens[q] : q_stride; }

// Calls fn(q, doc, out_index) for every (query, candidate) pair in output order.
template <typename Fn>
void for_each_pair(int n_queries, int64_t n_docs, const int64_t* cand_offsets, const int32_t* cand_docs, Fn fn) {
    for (int q = 0; q < n_queries; ++q) {
        if (cand_offsets == nullptr) {
            for (int64_t d = 0; d < n_docs; ++d) fn(q, d, int64_t(q) * n_docs + d);
        } else {
            for (int64_t c = cand_offsets[q]; c < cand_offsets[q + 1]; ++c) fn(q, int64_t(cand_docs[c]), c);
        }
    }
}

Status check_doc(int64_t d, int64_t n_docs, const char* op) {
    if (d < 0 || d >= n_docs) {
        return Status::InvalidArgument(std::string(op) + ": candidate document " + std::to_string(d) + " outside [0, " +
                                       std::to_string(n_docs) + ")");
    }
    return Status::OK();
}

// Exact MaxSim of one query against one document given as a token accessor, fp64.
template <typename TokFn>
double maxsim_one(const std::vector<double>& q, int q_len, int dim, int64_t n_tok, TokFn tok) {
    if (n_tok == 0) return 0.0;
    std::vector<double> best(q_len, -std::numeric_limits<double>::infinity());
    std::vector<double> x(dim);
    for (int64_t t = 0; t < n_tok; ++t) {
        tok(t, x.data());
        for (int i = 0; i < q_len; ++i) {
            double s = 0;
            for (int c = 0; c < dim; ++c) s += q[size_t(i) * dim + c] * x[c];
            best[i] = std::max(best[i], s);
        }
    }
    return std::accumulate(best.begin(), best.end(), 0.0);
}

// Token tok decoded in fp64: its centroid plus its residual blocks (n_code_bytes may be 0).
void decode_token(const float* centroids, const uint32_t* token_centroids, const uint8_t* codes, int n_code_bytes,
                  const float* codebook, int dim, int64_t tok, double* x) {
    const float* c = centroids + int64_t(token_centroids[tok]) * dim;
    for (int j = 0; j < dim; ++j) x[j] = c[j];
    const int dsub = n_code_bytes ? dim / n_code_bytes : 0;
    for (int b = 0; b < n_code_bytes; ++b) {
        const uint8_t code = codes[tok * n_code_bytes + b];
        const float* blk = codebook + (int64_t(b) * 256 + code) * dsub;
        for (int j = 0; j < dsub; ++j) x[b * dsub + j] += blk[j];
    }
}

}  // namespace

Status maxsim_ref(const MaxSimParams& p, double* scores) {
    TMS_RETURN_IF_ERROR(maxsim_validate(p));
    Status st;
    for_each_pair(p.n_queries, p.n_docs, p.cand_offsets, p.cand_docs, [&](int q, int64_t d, int64_t out) {
        if (!st.ok()) return;
        st = check_doc(d, p.n_docs, "maxsim_ref");
        if (!st.ok()) return;
        const int ql = query_len(p.query_lens, q, p.q_stride);
        std::vector<double> qv(size_t(ql) * p.dim);
        for (int i = 0; i < ql; ++i) {
            for (int c = 0; c < p.dim; ++c) {
                qv[size_t(i) * p.dim + c] =
                    load_as_float(p.queries, p.q_dtype, (int64_t(q) * p.q_stride + i) * p.dim + c);
            }
        }
        const int64_t begin = p.doc_offsets[d];
        scores[out] = maxsim_one(qv, ql, p.dim, p.doc_offsets[d + 1] - begin, [&](int64_t t, double* x) {
            for (int c = 0; c < p.dim; ++c) x[c] = load_as_float(p.doc_tokens, p.d_dtype, (begin + t) * p.dim + c);
        });
    });
    return st;
}

Status code_maxsim_ref(const CodeMaxSimParams& p, const float* centroids, double* scores) {
    TMS_RETURN_IF_ERROR(code_maxsim_validate(p));
    Status st;
    for_each_pair(p.n_queries, p.n_docs, p.cand_offsets, p.cand_docs, [&](int q, int64_t d, int64_t out) {
        if (!st.ok()) return;
        st = check_doc(d, p.n_docs, "code_maxsim_ref");
        if (!st.ok()) return;
        const int ql = query_len(p.query_lens, q, p.q_stride);
        std::vector<double> qv(size_t(ql) * p.dim);
        for (int64_t i = 0; i < int64_t(ql) * p.dim; ++i) qv[i] = p.queries[int64_t(q) * p.q_stride * p.dim + i];
        const int64_t begin = p.doc_offsets[d];
        scores[out] = maxsim_one(qv, ql, p.dim, p.doc_offsets[d + 1] - begin, [&](int64_t t, double* x) {
            const int64_t tok = begin + t;
            decode_token(centroids, p.token_centroids, p.codes, p.n_code_bytes, p.codebook, p.dim, tok, x);
            if (p.token_scales && p.n_code_bytes > 0) {
                for (int j = 0; j < p.dim; ++j) x[j] *= p.token_scales[tok];
            }
        });
    });
    return st;
}

Status decoded_scales_ref(const DecodedScaleParams& p, double* scales) {
    TMS_RETURN_IF_ERROR(decoded_scales_validate(p));
    std::vector<double> x(size_t(p.dim));
    for (int64_t t = 0; t < p.n_tokens; ++t) {
        if (p.token_centroids[t] >= uint32_t(p.n_centroids)) {
            return Status::InvalidArgument("decoded_scales_ref: token " + std::to_string(t) +
                                           ": centroid id outside [0, n_centroids)");
        }
        decode_token(p.centroids, p.token_centroids, p.codes, p.n_code_bytes, p.codebook, p.dim, t, x.data());
        double ss = 0;
        for (double v : x) ss += v * v;
        scales[t] = ss > 0 ? 1.0 / std::sqrt(ss) : 1.0;
    }
    return Status::OK();
}

Status topk_ref(const TopKParams& p) {
    TMS_RETURN_IF_ERROR(topk_validate(p));
    for (int64_t s = 0; s < p.n_segments; ++s) {
        const int64_t begin = p.offsets ? p.offsets[s] : s * p.row_len;
        const int64_t end = p.offsets ? p.offsets[s + 1] : begin + p.row_len;
        std::vector<std::pair<float, int32_t>> v;
        for (int64_t i = begin; i < end; ++i) {
            v.emplace_back(p.scores[i], p.ids ? p.ids[i] : static_cast<int32_t>(i - begin));
        }
        std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
            return a.first != b.first ? a.first > b.first : a.second < b.second;
        });
        for (int j = 0; j < p.k; ++j) {
            const bool have = j < static_cast<int64_t>(v.size());
            p.out_ids[s * p.k + j] = have ? v[j].second : -1;
            p.out_scores[s * p.k + j] = have ? v[j].first : -std::numeric_limits<float>::infinity();
        }
    }
    return Status::OK();
}

}  // namespace tms::kernels

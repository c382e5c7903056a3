// Copyright TileMaxSim authors. OpenMP production paths for CPU scoring.
// Exact MaxSim: each (query, candidate) pair is one task; the document is converted to fp32
// once per task and every query token takes its running max over it (4 query tokens at a time).
// Code MaxSim: one lookup table per query, LUT[b][code][i] = <q_i[b-block], codebook[b][code]>,
// so a token costs n_code_bytes vector adds over the query tokens.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <vector>

#include "kernels/cpu/simd.h"
#include "kernels/maxsim.h"

namespace tms::kernels {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// fp16 -> fp32 through the compiler's _Float16: one vcvtph2ps per 8 values in the x86-64-v3
// clone (F16C), a library conversion in the baseline one.
TMS_TARGET_CLONES void half_to_float_n(const uint16_t* src, int64_t n, float* dst) {
#if defined(__FLT16_MAX__)
    for (int64_t i = 0; i < n; ++i) {
        _Float16 h;
        std::memcpy(&h, src + i, 2);
        dst[i] = static_cast<float>(h);
    }
#else
    for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(src[i]);
#endif
}

// sum_i max_j <q_i, x_j> for q [ql, dim], x [n, dim], fp32.
TMS_TARGET_CLONES float maxsim_block(const float* q, int ql, const float* x, int64_t n, int dim) {
    if (n == 0 || ql == 0) return 0.0f;
    float total = 0.0f;
    int i = 0;
    for (; i + 4 <= ql; i += 4) {
        const float* q0 = q + int64_t(i) * dim;
        const float* q1 = q0 + dim;
        const float* q2 = q1 + dim;
        const float* q3 = q2 + dim;
        float b0 = kNegInf, b1 = kNegInf, b2 = kNegInf, b3 = kNegInf;
        int64_t j = 0;
        // 4 query tokens x 2 document tokens: 8 running sums share each loaded vector.
        for (; j + 2 <= n; j += 2) {
            const float* xa = x + j * dim;
            const float* xb = xa + dim;
            float s0 = 0, s1 = 0, s2 = 0, s3 = 0, t0 = 0, t1 = 0, t2 = 0, t3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3, t0, t1, t2, t3)
            for (int c = 0; c < dim; ++c) {
                s0 += q0[c] * xa[c];
                s1 += q1[c] * xa[c];
                s2 += q2[c] * xa[c];
                s3 += q3[c] * xa[c];
                t0 += q0[c] * xb[c];
                t1 += q1[c] * xb[c];
                t2 += q2[c] * xb[c];
                t3 += q3[c] * xb[c];
            }
            b0 = std::max(b0, std::max(s0, t0));
            b1 = std::max(b1, std::max(s1, t1));
            b2 = std::max(b2, std::max(s2, t2));
            b3 = std::max(b3, std::max(s3, t3));
        }
        for (; j < n; ++j) {
            const float* xj = x + j * dim;
            float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
            for (int c = 0; c < dim; ++c) {
                s0 += q0[c] * xj[c];
                s1 += q1[c] * xj[c];
                s2 += q2[c] * xj[c];
                s3 += q3[c] * xj[c];
            }
            b0 = std::max(b0, s0);
            b1 = std::max(b1, s1);
            b2 = std::max(b2, s2);
            b3 = std::max(b3, s3);
        }
        total += b0 + b1 + b2 + b3;
    }
    for (; i < ql; ++i) {
        const float* qi = q + int64_t(i) * dim;
        float b = kNegInf;
        for (int64_t j = 0; j < n; ++j) {
            const float* xj = x + j * dim;
            float s = 0;
#pragma omp simd reduction(+ : s)
            for (int c = 0; c < dim; ++c) s += qi[c] * xj[c];
            b = std::max(b, s);
        }
        total += b;
    }
    return total;
}

// Maps flat output index -> (query, doc) for both dense and ragged layouts.
struct PairIndex {
    int n_queries;
    int64_t n_docs;
    const int64_t* cand_offsets;
    const int32_t* cand_docs;

    void at(int64_t idx, int* q, int64_t* d) const {
        if (cand_offsets == nullptr) {
            *q = static_cast<int>(idx / n_docs);
            *d = idx % n_docs;
            return;
        }
        *q = static_cast<int>(std::upper_bound(cand_offsets, cand_offsets + n_queries + 1, idx) - cand_offsets - 1);
        *d = cand_docs[idx];
    }
};

Status check_cands(const int64_t* cand_offsets, const int32_t* cand_docs, int n_queries, int64_t n_docs) {
    int64_t n_cand;
    return validate_host_batch("maxsim", n_queries, 0, nullptr, nullptr, cand_offsets, cand_docs, n_docs, &n_cand);
}

// One document's code MaxSim from the per-query tables: cst [K, ql] centroid scores, lut
// [nb, 256, ql]; acc/best are [ql] scratch.
TMS_TARGET_CLONES float lut_doc_score(const float* cst, const float* lut, const uint32_t* token_centroids,
                                      const uint8_t* codes, const float* scales, int nb, int ql, int64_t t0, int64_t t1,
                                      float* acc, float* best) {
    for (int i = 0; i < ql; ++i) best[i] = kNegInf;
    for (int64_t t = t0; t < t1; ++t) {
        const float* base = cst + size_t(token_centroids[t]) * ql;
        for (int i = 0; i < ql; ++i) acc[i] = base[i];
        const uint8_t* code = codes ? codes + t * nb : nullptr;
        for (int b = 0; b < nb; ++b) {
            const float* l = lut + (size_t(b) * 256 + code[b]) * ql;
            for (int i = 0; i < ql; ++i) acc[i] += l[i];
        }
        if (scales) {
            const float sc = scales[t];
            for (int i = 0; i < ql; ++i) acc[i] *= sc;
        }
        for (int i = 0; i < ql; ++i) best[i] = std::max(best[i], acc[i]);
    }
    float s = 0;
    for (int i = 0; i < ql; ++i) s += best[i];
    return s;
}

}  // namespace

void load_as_float_n(const void* src, DType t, int64_t offset, int64_t n, float* dst) {
    switch (t) {
        case DType::kF32: std::copy_n(static_cast<const float*>(src) + offset, n, dst); return;
        case DType::kF16: half_to_float_n(static_cast<const uint16_t*>(src) + offset, n, dst); return;
        case DType::kBF16: {
            const uint16_t* s = static_cast<const uint16_t*>(src) + offset;
            for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(s[i]);
            return;
        }
    }
}

void load_as_float_parallel(const void* src, DType t, int64_t offset, int64_t n, float* dst) {
    constexpr int64_t kPiece = 1 << 16;
#pragma omp parallel for schedule(static) if (n > kPiece)
    for (int64_t i = 0; i < n; i += kPiece) load_as_float_n(src, t, offset + i, std::min(kPiece, n - i), dst + i);
}

Status maxsim_cpu(const MaxSimParams& p) {
    TMS_RETURN_IF_ERROR(maxsim_validate(p));
    TMS_RETURN_IF_ERROR(check_cands(p.cand_offsets, p.cand_docs, p.n_queries, p.n_docs));
    const int64_t n_out = maxsim_num_scores(p);
    if (n_out == 0) return Status::OK();
    if (p.scores == nullptr) return Status::InvalidArgument("maxsim: scores is null");
    std::vector<float> qf(size_t(p.n_queries) * p.q_stride * p.dim);
    load_as_float_n(p.queries, p.q_dtype, 0, static_cast<int64_t>(qf.size()), qf.data());
    const PairIndex pairs{p.n_queries, p.n_docs, p.cand_offsets, p.cand_docs};
    std::exception_ptr error;
#pragma omp parallel
    {
        std::vector<float> buf;
#pragma omp for schedule(dynamic, 16)
        for (int64_t idx = 0; idx < n_out; ++idx) {
            try {
                int q;
                int64_t d;
                pairs.at(idx, &q, &d);
                const int ql = p.query_lens ? p.query_lens[q] : p.q_stride;
                const int64_t begin = p.doc_offsets[d];
                const int64_t n = p.doc_offsets[d + 1] - begin;
                if (n == 0 || ql == 0) {
                    p.scores[idx] = 0.0f;
                    continue;
                }
                const float* x;
                if (p.d_dtype == DType::kF32) {
                    x = static_cast<const float*>(p.doc_tokens) + begin * p.dim;
                } else {
                    buf.resize(size_t(n) * p.dim);
                    load_as_float_n(p.doc_tokens, p.d_dtype, begin * p.dim, n * p.dim, buf.data());
                    x = buf.data();
                }
                p.scores[idx] = maxsim_block(qf.data() + int64_t(q) * p.q_stride * p.dim, ql, x, n, p.dim);
            } catch (...) {
#pragma omp critical
                if (!error) error = std::current_exception();
            }
        }
    }
    if (error) return Status::ResourceExhausted("maxsim_cpu: out of host memory");
    return Status::OK();
}

Status code_maxsim_cpu(const CodeMaxSimParams& p) {
    TMS_RETURN_IF_ERROR(code_maxsim_validate(p));
    TMS_RETURN_IF_ERROR(check_cands(p.cand_offsets, p.cand_docs, p.n_queries, p.n_docs));
    if (code_maxsim_num_scores(p) > 0 && p.scores == nullptr)
        return Status::InvalidArgument("code_maxsim: scores is null");
    const int nb = p.n_code_bytes;
    const int dsub = nb ? p.dim / nb : 0;
    const int K = p.n_centroids;
    std::vector<float> lut;      // [nb, 256, ql]
    std::vector<float> cst;      // [K, ql]: centroid scores transposed
    std::vector<float> scratch;  // per thread: acc [ql], best [ql]
    for (int q = 0; q < p.n_queries; ++q) {
        const int ql = p.query_lens ? p.query_lens[q] : p.q_stride;
        const int64_t c_begin = p.cand_offsets ? p.cand_offsets[q] : int64_t(q) * p.n_docs;
        const int64_t c_end = p.cand_offsets ? p.cand_offsets[q + 1] : c_begin + p.n_docs;
        if (c_end == c_begin) continue;
        if (ql == 0) {
            std::fill(p.scores + c_begin, p.scores + c_end, 0.0f);
            continue;
        }
        const float* qv = p.queries + int64_t(q) * p.q_stride * p.dim;
        const float* cs = p.centroid_scores + int64_t(q) * p.q_stride * K;
        try {
            lut.resize(size_t(nb) * 256 * ql);
            cst.resize(size_t(K) * ql);
        } catch (...) {
            return Status::ResourceExhausted("code_maxsim_cpu: out of host memory");
        }
#pragma omp parallel for schedule(static)
        for (int k = 0; k < K; ++k) {
            for (int i = 0; i < ql; ++i) cst[size_t(k) * ql + i] = cs[int64_t(i) * K + k];
        }
#pragma omp parallel for collapse(2) schedule(static)
        for (int b = 0; b < nb; ++b) {
            for (int v = 0; v < 256; ++v) {
                const float* blk = p.codebook + (int64_t(b) * 256 + v) * dsub;
                float* out = lut.data() + (size_t(b) * 256 + v) * ql;
                for (int i = 0; i < ql; ++i) {
                    const float* qi = qv + int64_t(i) * p.dim + b * dsub;
                    float s = 0;
                    for (int j = 0; j < dsub; ++j) s += qi[j] * blk[j];
                    out[i] = s;
                }
            }
        }
        try {
            scratch.resize(size_t(omp_get_max_threads()) * 2 * ql);
        } catch (...) {
            return Status::ResourceExhausted("code_maxsim_cpu: out of host memory");
        }
#pragma omp parallel for schedule(dynamic, 32)
        for (int64_t c = c_begin; c < c_end; ++c) {
            const int64_t d = p.cand_offsets ? p.cand_docs[c] : c - c_begin;
            const int64_t t0 = p.doc_offsets[d], t1 = p.doc_offsets[d + 1];
            if (t1 == t0) {
                p.scores[c] = 0.0f;
                continue;
            }
            float* acc = scratch.data() + size_t(omp_get_thread_num()) * 2 * ql;
            p.scores[c] = lut_doc_score(cst.data(), lut.data(), p.token_centroids, p.codes,
                                        nb ? p.token_scales : nullptr, nb, ql, t0, t1, acc, acc + ql);
        }
    }
    return Status::OK();
}

Status decoded_scales_cpu(const DecodedScaleParams& p) {
    TMS_RETURN_IF_ERROR(decoded_scales_validate(p));
    if (p.n_tokens > 0 && p.scales == nullptr) return Status::InvalidArgument("decoded_scales: scales is null");
    const int nb = p.n_code_bytes, dsub = p.dim / nb;
    bool bad = false;
#pragma omp parallel
    {
        std::vector<float> x(size_t(p.dim));
#pragma omp for schedule(static) reduction(|| : bad)
        for (int64_t t = 0; t < p.n_tokens; ++t) {
            const uint32_t cid = p.token_centroids[t];
            if (cid >= uint32_t(p.n_centroids)) {
                bad = true;
                continue;
            }
            std::copy_n(p.centroids + int64_t(cid) * p.dim, p.dim, x.data());
            const uint8_t* code = p.codes + t * nb;
            for (int b = 0; b < nb; ++b) {
                const float* blk = p.codebook + (int64_t(b) * 256 + code[b]) * dsub;
                for (int j = 0; j < dsub; ++j) x[size_t(b) * dsub + j] += blk[j];
            }
            // A vector reduction: as one serial chain the dim adds would wait on each other, and a CPU
            // open computes this for every token.
            float ss = 0;
            const float* xs = x.data();
#pragma omp simd reduction(+ : ss)
            for (int j = 0; j < p.dim; ++j) ss += xs[j] * xs[j];
            p.scales[t] = ss > 0 ? 1.0f / std::sqrt(ss) : 1.0f;
        }
    }
    if (bad) return Status::InvalidArgument("decoded_scales_cpu: a token's centroid id is outside [0, n_centroids)");
    return Status::OK();
}

Status topk_cpu(const TopKParams& p) {
    TMS_RETURN_IF_ERROR(topk_validate(p));
    auto better = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
        return a.first != b.first ? a.first > b.first : a.second < b.second;
    };
#pragma omp parallel for schedule(dynamic, 1) if (p.n_segments > 1)
    for (int64_t s = 0; s < p.n_segments; ++s) {
        const int64_t begin = p.offsets ? p.offsets[s] : s * p.row_len;
        const int64_t end = p.offsets ? p.offsets[s + 1] : begin + p.row_len;
        // Bounded heap of the k best (the heap's top is the worst kept).
        std::vector<std::pair<float, int32_t>> heap;
        heap.reserve(std::min<int64_t>(p.k, end - begin));
        for (int64_t i = begin; i < end; ++i) {
            std::pair<float, int32_t> e{p.scores[i], p.ids ? p.ids[i] : static_cast<int32_t>(i - begin)};
            if (static_cast<int>(heap.size()) < p.k) {
                heap.push_back(e);
                std::push_heap(heap.begin(), heap.end(), better);
            } else if (better(e, heap.front())) {
                std::pop_heap(heap.begin(), heap.end(), better);
                heap.back() = e;
                std::push_heap(heap.begin(), heap.end(), better);
            }
        }
        std::sort_heap(heap.begin(), heap.end(), better);
        for (int j = 0; j < p.k; ++j) {
            const bool have = j < static_cast<int>(heap.size());
            p.out_ids[s * p.k + j] = have ? heap[j].second : -1;
            p.out_scores[s * p.k + j] = have ? heap[j].first : kNegInf;
        }
    }
    return Status::OK();
}

}  // namespace tms::kernels

// Copyright TileMaxSim authors. The spec of the candidate-generation ops (kernels/candidates.h).
#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "kernels/candidates.h"

namespace tms::kernels {

Status ivf_union_ref(const IvfUnionParams& p, std::vector<int64_t>* off, std::vector<int32_t>* docs) {
    TMS_RETURN_IF_ERROR(ivf_union_validate(p));
    off->assign(1, 0);
    docs->clear();
    for (int q = 0; q < p.n_queries; ++q) {
        std::set<int32_t> u;
        const int ql = p.query_lens ? p.query_lens[q] : p.q_stride;
        for (int i = 0; i < ql; ++i) {
            for (int j = 0; j < p.nprobe; ++j) {
                const int c = p.probe[(int64_t(q) * p.q_stride + i) * p.nprobe + j];
                if (c < 0 || c >= p.n_centroids) continue;
                for (int64_t e = p.ivf_offsets[c]; e < p.ivf_offsets[c + 1]; ++e)
                    if (doc_allowed(p, q, p.ivf_docs[e])) u.insert(p.ivf_docs[e]);
            }
        }
        docs->insert(docs->end(), u.begin(), u.end());
        off->push_back(int64_t(docs->size()));
    }
    return Status::OK();
}

Status probe_scores_ref(const ProbeScoreParams& p, std::vector<int64_t>* off, std::vector<int32_t>* docs,
                        std::vector<uint32_t>* scores) {
    TMS_RETURN_IF_ERROR(probe_scores_validate(p));
    const IvfUnionParams& u = p.lists;
    off->assign(1, 0);
    docs->clear();
    scores->clear();
    for (int q = 0; q < u.n_queries; ++q) {
        const int ql = u.query_lens ? u.query_lens[q] : u.q_stride;
        float range = 0.f;
        for (int i = 0; i < ql; ++i) {
            const int64_t row = int64_t(q) * u.q_stride + i;
            range += probe_row_range(u.probe + row * u.nprobe, p.probe_scores + row * u.nprobe, u.nprobe, u.n_centroids,
                                     p.floor_scores[row]);
        }
        const float scale = probe_score_scale(range);
        std::map<int32_t, uint32_t> acc;
        for (int i = 0; i < ql; ++i) {
            const int64_t row = int64_t(q) * u.q_stride + i;
            std::set<int32_t> seen;  // held by an earlier probe of this row
            for (int j = 0; j < u.nprobe; ++j) {
                const int c = u.probe[row * u.nprobe + j];
                if (c < 0 || c >= u.n_centroids) continue;
                const uint32_t t = probe_term(p.probe_scores[row * u.nprobe + j], p.floor_scores[row], scale);
                for (int64_t e = u.ivf_offsets[c]; e < u.ivf_offsets[c + 1]; ++e) {
                    if (doc_allowed(u, q, u.ivf_docs[e]) && seen.insert(u.ivf_docs[e]).second) acc[u.ivf_docs[e]] += t;
                }
            }
        }
        std::vector<std::pair<int32_t, uint32_t>> v(acc.begin(), acc.end());
        std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
            return a.second > b.second || (a.second == b.second && a.first < b.first);
        });
        if (p.keep > 0 && v.size() > size_t(p.keep)) v.resize(size_t(p.keep));
        for (const auto& [d, s] : v) {
            docs->push_back(d);
            scores->push_back(s);
        }
        off->push_back(int64_t(docs->size()));
    }
    return Status::OK();
}

void split_tf32x3_ref(const float* src, int64_t rows, int dim, unsigned lo_parts, float* dst) {
    for (int64_t r = 0; r < rows; ++r) {
        for (int j = 0; j < dim; ++j) {
            const float x = src[r * dim + j];
            uint32_t u;
            std::memcpy(&u, &x, 4);
            u &= 0xffffe000u;
            float hi;
            std::memcpy(&hi, &u, 4);
            const float lo = x - hi;
            for (int part = 0; part < 3; ++part) dst[(r * 3 + part) * dim + j] = (lo_parts >> part) & 1u ? lo : hi;
        }
    }
}

}  // namespace tms::kernels

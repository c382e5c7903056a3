// Copyright TileMaxSim authors. Candidate-generation ops on the CPU (kernels/candidates.h).
#include <omp.h>

#include <algorithm>

#include "kernels/candidates.h"

namespace tms::kernels {

// Queries in parallel: each thread marks documents in its own bitmap (n_docs bits), emitting them
// in increasing id order, and clears only the words it touched.
Status ivf_union_cpu(const IvfUnionParams& p, std::vector<int64_t>* off, std::vector<int32_t>* docs) {
    TMS_RETURN_IF_ERROR(ivf_union_validate(p));
    const int nq = p.n_queries;
    std::vector<std::vector<int32_t>> per_query(nq);
#pragma omp parallel
    {
        std::vector<uint64_t> bits((p.n_docs + 63) / 64);
        std::vector<int32_t> touched;
#pragma omp for schedule(dynamic, 1)
        for (int qi = 0; qi < nq; ++qi) {
            const int ql = p.query_lens ? p.query_lens[qi] : p.q_stride;
            touched.clear();
            for (int i = 0; i < ql; ++i) {
                for (int j = 0; j < p.nprobe; ++j) {
                    const int c = p.probe[(size_t(qi) * p.q_stride + i) * p.nprobe + j];
                    if (c < 0 || c >= p.n_centroids) continue;
                    for (int64_t e = p.ivf_offsets[c]; e < p.ivf_offsets[c + 1]; ++e) {
                        const int32_t d = p.ivf_docs[e];
                        if (!doc_allowed(p, qi, d)) continue;
                        uint64_t& w = bits[d >> 6];
                        const uint64_t bit = uint64_t(1) << (d & 63);
                        if (!(w & bit)) {
                            if (w == 0) touched.push_back(d >> 6);
                            w |= bit;
                        }
                    }
                }
            }
            std::sort(touched.begin(), touched.end());
            auto& out = per_query[qi];
            for (int32_t wi : touched) {
                for (uint64_t w = bits[wi]; w; w &= w - 1) out.push_back(wi * 64 + __builtin_ctzll(w));
                bits[wi] = 0;
            }
        }
    }
    off->assign(1, 0);
    for (const auto& v : per_query) off->push_back(off->back() + static_cast<int64_t>(v.size()));
    docs->resize(off->back());
    for (int qi = 0; qi < nq; ++qi) std::copy(per_query[qi].begin(), per_query[qi].end(), docs->begin() + (*off)[qi]);
    return Status::OK();
}

// Queries in parallel: each thread keeps dense per-document arrays (the score, the row that last
// touched the document, the query that last did) that are never cleared, only re-stamped.
Status probe_scores_cpu(const ProbeScoreParams& p, std::vector<int64_t>* off, std::vector<int32_t>* docs,
                        std::vector<uint32_t>* scores) {
    TMS_RETURN_IF_ERROR(probe_scores_validate(p));
    const IvfUnionParams& u = p.lists;
    const int nq = u.n_queries;
    std::vector<std::vector<std::pair<uint32_t, int32_t>>> per_query(nq);  // (score, document)
#pragma omp parallel
    {
        std::vector<uint32_t> acc(size_t(u.n_docs)), row_stamp(size_t(u.n_docs), 0), query_stamp(size_t(u.n_docs), 0);
        std::vector<int32_t> touched;
        uint32_t row_id = 0, query_id = 0;
#pragma omp for schedule(dynamic, 1)
        for (int q = 0; q < nq; ++q) {
            const int ql = u.query_lens ? u.query_lens[q] : u.q_stride;
            ++query_id;
            touched.clear();
            const float scale = probe_frame(p, q).scale;
            for (int i = 0; i < ql; ++i) {
                const int64_t row = int64_t(q) * u.q_stride + i;
                ++row_id;
                for (int j = 0; j < u.nprobe; ++j) {
                    const int c = u.probe[row * u.nprobe + j];
                    if (c < 0 || c >= u.n_centroids) continue;
                    const uint32_t t = probe_term(p.probe_scores[row * u.nprobe + j], p.floor_scores[row], scale);
                    for (int64_t e = u.ivf_offsets[c]; e < u.ivf_offsets[c + 1]; ++e) {
                        const int32_t d = u.ivf_docs[e];
                        if (row_stamp[d] == row_id || !doc_allowed(u, q, d)) continue;
                        row_stamp[d] = row_id;
                        if (query_stamp[d] != query_id) {
                            query_stamp[d] = query_id;
                            acc[d] = 0;
                            touched.push_back(d);
                        }
                        acc[d] += t;
                    }
                }
            }
            auto& out = per_query[q];
            out.resize(touched.size());
            for (size_t i = 0; i < touched.size(); ++i) out[i] = {acc[touched[i]], touched[i]};
            const auto better = [](const std::pair<uint32_t, int32_t>& a, const std::pair<uint32_t, int32_t>& b) {
                return a.first > b.first || (a.first == b.first && a.second < b.second);
            };
            const size_t keep = p.keep > 0 ? std::min(out.size(), size_t(p.keep)) : out.size();
            if (keep < out.size()) {
                std::nth_element(out.begin(), out.begin() + keep, out.end(), better);
                out.resize(keep);
            }
            std::sort(out.begin(), out.end(), better);
        }
    }
    off->assign(1, 0);
    for (const auto& v : per_query) off->push_back(off->back() + static_cast<int64_t>(v.size()));
    docs->resize(size_t(off->back()));
    scores->resize(size_t(off->back()));
#pragma omp parallel for schedule(static)
    for (int q = 0; q < nq; ++q) {
        for (size_t i = 0; i < per_query[q].size(); ++i) {
            (*scores)[size_t((*off)[q]) + i] = per_query[q][i].first;
            (*docs)[size_t((*off)[q]) + i] = per_query[q][i].second;
        }
    }
    return Status::OK();
}

ProbeFrame probe_frame(const ProbeScoreParams& p, int q) {
    const IvfUnionParams& u = p.lists;
    ProbeFrame f;
    f.rows = u.query_lens ? u.query_lens[q] : u.q_stride;
    float range = 0.f;
    for (int i = 0; i < f.rows; ++i) {
        const int64_t row = int64_t(q) * u.q_stride + i;
        range += probe_row_range(u.probe + row * u.nprobe, p.probe_scores + row * u.nprobe, u.nprobe, u.n_centroids,
                                 p.floor_scores[row]);
        f.base += p.floor_scores[row];
    }
    f.scale = probe_score_scale(range);
    return f;
}

}  // namespace tms::kernels

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

}  // namespace tms::kernels

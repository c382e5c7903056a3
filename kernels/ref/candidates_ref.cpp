// Copyright TileMaxSim authors. The spec of the candidate-generation ops (kernels/candidates.h).
#include <cstring>
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
                for (int64_t e = p.ivf_offsets[c]; e < p.ivf_offsets[c + 1]; ++e) u.insert(p.ivf_docs[e]);
            }
        }
        docs->insert(docs->end(), u.begin(), u.end());
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

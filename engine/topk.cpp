// Copyright TileMaxSim authors. Top-k selection of candidate lists, and the merge of partial top-k
// lists (engine/shard_searcher.h).
#include "engine/shard_searcher.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/maxsim.h"

namespace tms::engine {

Status select_topk(const float* scores, const int64_t* offsets, int64_t row_len, int64_t n_segments, const int32_t* ids,
                   int k, int32_t* out_ids, float* out_scores) {
    kernels::TopKParams tp;
    tp.scores = scores;
    tp.offsets = offsets;
    tp.row_len = row_len;
    tp.n_segments = n_segments;
    tp.ids = ids;
    tp.k = k;
    tp.out_ids = out_ids;
    tp.out_scores = out_scores;
    return kernels::topk_cpu(tp);
}

Status select_top(int n_queries, int keep, std::vector<int64_t>* off, std::vector<int32_t>* docs,
                  std::vector<float>* scores) {
    std::vector<int32_t> ids(size_t(n_queries) * keep);
    std::vector<float> top(size_t(n_queries) * keep);
    TMS_RETURN_IF_ERROR(
        select_topk(scores->data(), off->data(), 0, n_queries, docs->data(), keep, ids.data(), top.data()));
    std::vector<int64_t> noff(1, 0);
    std::vector<int32_t> ndocs;
    std::vector<float> nscores;
    for (int q = 0; q < n_queries; ++q) {
        for (int j = 0; j < keep; ++j) {
            if (ids[size_t(q) * keep + j] < 0) break;
            ndocs.push_back(ids[size_t(q) * keep + j]);
            nscores.push_back(top[size_t(q) * keep + j]);
        }
        noff.push_back(static_cast<int64_t>(ndocs.size()));
    }
    *off = std::move(noff);
    *docs = std::move(ndocs);
    *scores = std::move(nscores);
    return Status::OK();
}

Status select_top(int n_queries, int keep, Lists* l) {
    return select_top(n_queries, keep, &l->off, &l->docs, &l->scores);
}

void merge_top(int k, int32_t* ids, float* scores, const int32_t* c_ids, const float* c_scores, int32_t base) {
    std::vector<CutKey> all;
    all.reserve(size_t(2) * k);
    for (int j = 0; j < k; ++j) {
        if (ids[j] >= 0) all.push_back({scores[j], ids[j]});
        if (c_ids[j] >= 0) all.push_back({c_scores[j], int64_t(c_ids[j]) + base});
    }
    const size_t keep = std::min(all.size(), size_t(k));
    std::partial_sort(all.begin(), all.begin() + keep, all.end(), CutKeyBetter);
    for (int j = 0; j < k; ++j) {
        ids[j] = size_t(j) < keep ? int32_t(all[j].id) : -1;
        scores[j] = size_t(j) < keep ? all[j].score : -INFINITY;
    }
}

}  // namespace tms::engine

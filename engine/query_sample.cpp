// Copyright TileMaxSim authors. The sample of the queries searched (QuerySample, searcher.h).
#include <algorithm>

#include "kernels/maxsim.h"
#include "tilemaxsim/searcher.h"

namespace tms {

QuerySample::QuerySample(int capacity) : capacity_(std::max(0, capacity)) {}

void QuerySample::Add(const QueryBatch& q) {
    if (capacity_ == 0 || !recording_.load(std::memory_order_relaxed)) return;
    const int dim = q.dim;
    std::lock_guard<std::mutex> lock(mu_);
    dim_ = dim;
    for (int i = 0; i < q.n_queries; ++i) {
        const int len = q.lengths ? std::clamp(q.lengths[i], 0, q.q_tokens) : q.q_tokens;
        if (len == 0) continue;
        ++seen_;
        size_t slot = rows_.size();
        if (rows_.size() < size_t(capacity_)) {
            rows_.emplace_back();
        } else {
            const uint64_t j = rng_() % uint64_t(seen_);
            if (j >= uint64_t(capacity_)) continue;
            slot = size_t(j);
        }
        std::vector<uint16_t>& row = rows_[slot];
        row.resize(size_t(len) * size_t(dim));
        const int64_t first = int64_t(i) * q.q_tokens * dim;
        for (size_t e = 0; e < row.size(); ++e)
            row[e] = kernels::float_to_half(kernels::load_as_float(q.data, q.dtype, first + int64_t(e)));
    }
}

int64_t QuerySample::seen() const {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
}

ServedQueries QuerySample::Get() const {
    std::lock_guard<std::mutex> lock(mu_);
    ServedQueries out;
    out.seen = seen_;
    out.dim = dim_;
    out.n_queries = int(rows_.size());
    const size_t dim = size_t(std::max(1, dim_));
    for (const auto& r : rows_) out.q_tokens = std::max(out.q_tokens, int(r.size() / dim));
    const size_t row = size_t(out.q_tokens) * dim;
    out.tokens.assign(rows_.size() * row, 0);  // zero rows pad the shorter queries
    for (size_t i = 0; i < rows_.size(); ++i)
        std::copy(rows_[i].begin(), rows_[i].end(), out.tokens.begin() + ptrdiff_t(i * row));
    return out;
}

}  // namespace tms

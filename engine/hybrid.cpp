// Copyright TileMaxSim authors. Hybrid search's fusion (engine/hybrid.h) and the mode names.
#include "engine/hybrid.h"

#include <algorithm>
#include <unordered_map>

#include "tilemaxsim/options.h"

namespace tms {

Status ParseSearchMode(const std::string& word, SearchMode* out) {
    for (SearchMode m : {SearchMode::kMaxSim, SearchMode::kBm25, SearchMode::kHybrid}) {
        if (word == SearchModeName(m)) {
            *out = m;
            return Status::OK();
        }
    }
    return Status::InvalidArgument("mode '" + word + "': expected maxsim, bm25 or hybrid");
}

Status ParseFusion(const std::string& word, Fusion* out) {
    for (Fusion f : {Fusion::kRrf, Fusion::kWeighted}) {
        if (word == FusionName(f)) {
            *out = f;
            return Status::OK();
        }
    }
    return Status::InvalidArgument("fusion '" + word + "': expected rrf or weighted");
}

}  // namespace tms

namespace tms::engine {

namespace {

bool better(const std::pair<int64_t, float>& a, const std::pair<int64_t, float>& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
}

}  // namespace

Scored FuseRankings(const Scored& maxsim, const Scored& bm25, Fusion fusion, double bm25_weight, int k) {
    std::unordered_map<int64_t, double> fused;
    const auto add = [&](Scored r, double weight) {
        if (weight <= 0 || r.empty()) return;
        std::sort(r.begin(), r.end(), better);
        const float hi = r.front().second, lo = r.back().second;
        for (size_t i = 0; i < r.size(); ++i) {
            const double share = fusion == Fusion::kRrf ? 1.0 / (kRrfK + double(i + 1))
                                 : hi > lo              ? double(r[i].second - lo) / double(hi - lo)
                                                        : 1.0;
            fused[r[i].first] += weight * share;
        }
    };
    add(maxsim, 1.0 - bm25_weight);
    add(bm25, bm25_weight);
    Scored out;
    out.reserve(fused.size());
    for (const auto& [id, s] : fused) out.push_back({id, float(s)});
    const size_t top = std::min(out.size(), size_t(std::max(k, 0)));
    std::partial_sort(out.begin(), out.begin() + ptrdiff_t(top), out.end(), better);
    out.resize(top);
    return out;
}

}  // namespace tms::engine

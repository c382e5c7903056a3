// Copyright TileMaxSim authors. Latency percentiles of the benchmarks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace tms {

/// The p-quantile (0..1) of `v`: the sample at rank round((n - 1) p) of the sorted values (0 when
/// empty).
inline double Percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5))];
}

}  // namespace tms

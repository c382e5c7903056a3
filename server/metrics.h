// Copyright TileMaxSim authors. What `tms serve` counts, in Prometheus' text format (/metrics).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace tms::server {

/// A histogram of seconds with fixed bounds (0.5 ms to 10 s), Prometheus style.
class Histogram {
public:
    static constexpr std::array<double, 12> kBounds = {0.0005, 0.001, 0.002, 0.005, 0.01, 0.02,
                                                       0.05,   0.1,   0.25,  0.5,   1.0,  10.0};
    void Observe(double v);
    /// Lines `name_bucket{labels,le="..."}`, `name_sum{labels}`, `name_count{labels}`.
    void Write(const std::string& name, const std::string& labels, std::string* out) const;

private:
    std::array<int64_t, kBounds.size() + 1> counts_{};
    double sum_ = 0;
    int64_t n_ = 0;
};

class Metrics {
public:
    /// One answered request: its route ("/v1/search"; "other" for unknown paths), status, time,
    /// and queries (search and rerank).
    void Request(const std::string& route, int status, double seconds, int queries);
    /// One search's stage times (SearchTimings).
    void Stages(double candidates, double scoring, double rerank);
    /// Every metric, plus the gauges given by the caller (name -> value, already with labels).
    std::string Text(const std::map<std::string, double>& gauges) const;

private:
    mutable std::mutex mu_;
    std::map<std::pair<std::string, int>, int64_t> requests_;
    std::map<std::string, Histogram> latency_;
    std::map<std::string, Histogram> stages_;
    std::map<int, int64_t> batch_queries_;  // queries per search request: 1, 2-16, 17-256, more
};

}  // namespace tms::server

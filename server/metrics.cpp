// Copyright TileMaxSim authors.
#include "server/metrics.h"

#include <cstdio>

namespace tms::server {
namespace {

std::string Num(double v) {
    char b[64];
    snprintf(b, sizeof b, "%.9g", v);
    return b;
}

std::string WithLabel(const std::string& labels, const std::string& more) {
    return "{" + labels + (labels.empty() ? "" : ",") + more + "}";
}

}  // namespace

void Histogram::Observe(double v) {
    size_t i = 0;
    while (i < kBounds.size() && v > kBounds[i]) ++i;
    ++counts_[i];
    sum_ += v;
    ++n_;
}

void Histogram::Write(const std::string& name, const std::string& labels, std::string* out) const {
    int64_t cum = 0;
    for (size_t i = 0; i < kBounds.size(); ++i) {
        cum += counts_[i];
        *out +=
            name + "_bucket" + WithLabel(labels, "le=\"" + Num(kBounds[i]) + "\"") + " " + std::to_string(cum) + "\n";
    }
    *out += name + "_bucket" + WithLabel(labels, "le=\"+Inf\"") + " " + std::to_string(n_) + "\n";
    const std::string l = labels.empty() ? "" : "{" + labels + "}";
    *out += name + "_sum" + l + " " + Num(sum_) + "\n";
    *out += name + "_count" + l + " " + std::to_string(n_) + "\n";
}

void Metrics::Request(const std::string& route, int status, double seconds, int queries) {
    std::lock_guard<std::mutex> lk(mu_);
    ++requests_[{route, status}];
    latency_[route].Observe(seconds);
    if (queries > 0) ++batch_queries_[queries == 1 ? 1 : queries <= 16 ? 16 : queries <= 256 ? 256 : 0];
}

void Metrics::Stages(double candidates, double scoring, double rerank) {
    std::lock_guard<std::mutex> lk(mu_);
    stages_["candidates"].Observe(candidates);
    stages_["scoring"].Observe(scoring);
    stages_["rerank"].Observe(rerank);
}

std::string Metrics::Text(const std::map<std::string, double>& gauges) const {
    std::lock_guard<std::mutex> lk(mu_);
    std::string out;
    out += "# HELP tms_requests_total Requests answered, by route and HTTP status.\n";
    out += "# TYPE tms_requests_total counter\n";
    for (const auto& [k, n] : requests_) {
        out += "tms_requests_total{route=\"" + k.first + "\",code=\"" + std::to_string(k.second) + "\"} " +
               std::to_string(n) + "\n";
    }
    out += "# HELP tms_request_seconds Time from a request's arrival to its answer, by route.\n";
    out += "# TYPE tms_request_seconds histogram\n";
    for (const auto& [route, h] : latency_) h.Write("tms_request_seconds", "route=\"" + route + "\"", &out);
    out += "# HELP tms_search_stage_seconds Time of each stage of the searches the requests ran.\n";
    out += "# TYPE tms_search_stage_seconds histogram\n";
    for (const auto& [stage, h] : stages_) h.Write("tms_search_stage_seconds", "stage=\"" + stage + "\"", &out);
    out += "# HELP tms_search_request_queries Search and rerank requests by their number of queries (le).\n";
    out += "# TYPE tms_search_request_queries counter\n";
    for (const auto& [le, n] : batch_queries_) {
        out += "tms_search_request_queries{le=\"" + (le ? std::to_string(le) : std::string("+Inf")) + "\"} " +
               std::to_string(n) + "\n";
    }
    std::string typed;  // one TYPE line a metric, before its first series (the map keeps them together)
    for (const auto& [name, v] : gauges) {
        const std::string base = name.substr(0, name.find('{'));
        if (base != typed) out += "# TYPE " + base + " gauge\n";
        typed = base;
        out += name + " " + Num(v) + "\n";
    }
    return out;
}

}  // namespace tms::server

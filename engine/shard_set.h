// Copyright TileMaxSim authors. The segments of a Searcher and the devices they run on, as FAISS's
// IndexShards holds its sub-indexes: a search or a stage runs on every device at once (one host
// thread per GPU; a device's segments in turn), and the segments' results are merged.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "engine/cuts.h"
#include "engine/shard_searcher.h"

namespace tms::engine {

class ShardSet {
public:
    /// Appends a segment (its global ids follow the ones before); returns its index.
    size_t Add(std::unique_ptr<ShardSearcher> segment);
    /// Segments (indices) that share one device and run there in turn; one call per device.
    void AddDevice(std::vector<size_t> segments) { by_device_.push_back(std::move(segments)); }

    size_t size() const { return segments_.size(); }
    ShardSearcher& segment(size_t i) { return *segments_[i]; }
    const ShardSearcher& segment(size_t i) const { return *segments_[i]; }
    const std::vector<std::vector<size_t>>& by_device() const { return by_device_; }
    int n_centroids() const { return segments_.empty() ? 0 : segments_[0]->data().model.n_centroids; }
    /// Every segment can score exactly (ShardSearcher::CheckExact's error otherwise).
    Status CheckExact() const;

    /// step(i) for every segment i, the devices at once; each segment's status.
    std::vector<Status> RunOnDevices(const std::function<Status(size_t)>& step) const {
        return run_on_devices(by_device_, segments_.size(), step);
    }

    /// The segments searched as one. Exhaustive: each segment's exact top-k, merged. Otherwise
    /// the approximate pipeline (search_cut) over all of them, and with `cuts` over every
    /// participant's; n_docs, n_centroids: of that whole; st: the caller's error so far, still
    /// taken through the cuts. Options as the caller resolved and capped them.
    Status Search(const QueryBatch& q, const SearchOptions& opts, const Allowed* allowed, int64_t n_docs,
                  int n_centroids, SearchCuts* cuts, Status st, std::vector<std::vector<SearchHit>>* results,
                  SearchTimings* timings) const;

    /// Exact scores of each query's candidates (global ids, ascending and unique; deleted ones
    /// are skipped), each query's best k (every candidate when k is 0), merged across segments.
    Status Rerank(const QueryBatch& q, const std::vector<std::vector<int64_t>>& candidates, int k,
                  std::vector<std::vector<SearchHit>>* results) const;

    /// The segment holding global document `doc` live, and its local id there; null when none.
    const ShardSearcher* Find(int64_t doc, int32_t* local) const;

private:
    std::vector<std::unique_ptr<ShardSearcher>> segments_;
    std::vector<std::vector<size_t>> by_device_;  // segments per device (one group: the CPU)
};

}  // namespace tms::engine

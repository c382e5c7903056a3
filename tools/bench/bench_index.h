// Copyright TileMaxSim authors. `tms bench index` (see bench_index.cpp).
#pragma once

#include <string>
#include <vector>

#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms::bench {

struct IndexBenchOptions {
    int64_t tokens = 5000000;  ///< corpus size
    int dim = 128;
    int centroids = 0;  ///< 0: PLAID's rule
    std::vector<std::string> codecs{"pq16", "res2"};
    Device device = Device::kAuto;
    std::string dir;      ///< keep the corpus and indexes here ("" = temp, removed)
    std::string command;  ///< recorded in the JSON
};

Status RunIndexBench(const IndexBenchOptions& o, std::string* json);

}  // namespace tms::bench

// Copyright TileMaxSim authors. The pseudo-queries an index's recall estimate is measured with.
// Internal to the engine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tilemaxsim/estimate.h"
#include "tilemaxsim/options.h"
#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms {

/// The pseudo-queries EstimateRecall measures with `opts`' recipe, at most `n` (one a live
/// document): [*n_out, opts.query_tokens, dim] fp16 into *q, each one's tokens used into *lens.
Status MakePseudoQueries(const std::string& path, const EstimateOptions& opts, int n, std::vector<uint16_t>* q,
                         std::vector<int32_t>* lens, int* n_out);

}  // namespace tms

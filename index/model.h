// Copyright TileMaxSim authors. The trained model of an index: coarse centroids and the token codec.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tilemaxsim/options.h"
#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms {
struct BuildStats;
}  // namespace tms

namespace tms::index {

/// Trained parameters: coarse centroids and the codec's residual decoder.
struct IndexModel {
    int dim = 0;
    int n_centroids = 0;
    std::string codec;  ///< "pq" or "residual"
    int pq_m = 0, pq_nbits = 0, residual_nbits = 0;
    std::vector<float> centroids;  ///< [n_centroids, dim], unit rows
    int n_code_bytes = 0;          ///< bytes of code per token
    /// [n_code_bytes, 256, dim / n_code_bytes]: the residual block each byte value decodes to
    /// (kernels::CodeMaxSimParams::codebook).
    std::vector<float> codebook;
    std::vector<float> residual_cutoffs;  ///< residual codec: 2^nbits - 1 bucket boundaries
    std::vector<float> residual_weights;  ///< residual codec: 2^nbits bucket values
    /// Every sampled training token was a unit vector (norm within 1% of 1): compressed scores
    /// then normalise each decoded token (kernels::CodeMaxSimParams::token_scales), as PLAID
    /// does. False for indexes written before the flag existed.
    bool unit_norm = false;
};

/// The metadata of a fresh index.
void FillInfo(const IndexModel& m, int64_t n_docs, int64_t n_tokens, const IndexBuildOptions& opts, IndexInfo* info);
/// A finished build's counts (BuildStats' n_docs, n_tokens, n_centroids, dim and bytes per
/// token) from its index's metadata; its phases and times are the builder's.
void FillBuildStats(const IndexInfo& info, BuildStats* stats);
/// A model as bytes and back (a distributed build broadcasts rank 0's).
std::string ModelToBytes(const IndexModel& model);
Status ModelFromBytes(const std::string& bytes, IndexModel* model);
/// CRC-32C of a model's centroids and codec parameters: every shard of an index has the same.
uint32_t ModelCrc(const IndexModel& model);

}  // namespace tms::index

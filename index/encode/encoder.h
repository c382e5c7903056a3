// Copyright TileMaxSim authors. Encoding tokens with a trained model: nearest centroid and residual code.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "index/model.h"
#include "tilemaxsim/options.h"
#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms::index {

/// Assigns tokens to centroids and encodes their residuals, in bounded batches.
/// Not thread-safe (owns scratch buffers); `model` must outlive it.
class Encoder {
public:
    /// `device`: where assignment runs (kAuto: the GPU when present); `gpu`: which one.
    static Status Create(const IndexModel& model, Device device, int gpu, std::unique_ptr<Encoder>* out);
    ~Encoder();
    /// Rows [row0, row0 + n) of `tokens` -> cids [n], codes [n, n_code_bytes]. A non-finite
    /// input value is an InvalidArgument "docs: non-finite value ... at row R" (R within `tokens`).
    /// `known_cids` [n]: the rows' nearest centroids, already computed with this model's
    /// centroids (an earlier build of the same documents on them): copied, not assigned again.
    Status Encode(const EmbeddingView& tokens, int64_t row0, int64_t n, uint32_t* cids, uint8_t* codes,
                  const uint32_t* known_cids = nullptr);

private:
    Encoder();
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

/// Nearest centroid (max inner product; the centroids have unit norm) of each row of x [n, dim].
Status AssignNearest(const float* x, int64_t n, const IndexModel& m, uint32_t* out);
/// Rows [row0, row0 + n) of `v` as float32 into out [n, dim] (OpenMP).
void RowsToFloat(const EmbeddingView& v, int64_t row0, int64_t n, float* out);

class GpuAssigner;
/// A GPU assigner on GPU `gpu` for `device` (kCpu: none; kAuto: one if a GPU is present; kGpu:
/// required).
Status MaybeGpuAssigner(Device device, int gpu, std::unique_ptr<GpuAssigner>* out);

/// Squared norms [pq_m, 256] of a PQ codebook's codes, summed in dimension order: the CPU and
/// GPU encoders use the same values, so that they pick the same codes.
std::vector<float> PqCodeNorms(const IndexModel& model);

/// The codebook of PLAID residual codes [n_code_bytes, 256, 8 / nbits]: every block equal,
/// entry v holding at position j the bucket weight (v >> (nbits * j)) & (2^nbits - 1) (a code
/// byte packs 8 / nbits dimensions, dimension j at bits nbits * j, as residual_encode writes).
std::vector<float> ResidualCodebook(const std::vector<float>& weights, int nbits, int n_code_bytes);

/// Rows [row0, row0 + n) as fp16 (on the calling thread alone unless `parallel`: an OpenMP team).
void ToHalf(const EmbeddingView& tokens, int64_t row0, int64_t n, uint16_t* out, bool parallel = true);

}  // namespace tms::index

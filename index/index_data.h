// Copyright TileMaxSim authors. The in-memory form of an index, as written and as loaded.
// Internal to the library (not installed).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tilemaxsim/options.h"
#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms::index {

/// Trained parameters: coarse centroids and the codec's residual decoder.
struct IndexModel {
    int dim = 0;
    int n_centroids = 0;
    std::string codec;       ///< "pq" or "residual"
    int pq_m = 0, pq_nbits = 0, residual_nbits = 0;
    std::vector<float> centroids;  ///< [n_centroids, dim], unit rows
    int n_code_bytes = 0;          ///< bytes of code per token
    /// [n_code_bytes, 256, dim / n_code_bytes]: the residual block each byte value decodes to
    /// (kernels::CodeMaxSimParams::codebook).
    std::vector<float> codebook;
    std::vector<float> residual_cutoffs;  ///< residual codec: 2^nbits - 1 bucket boundaries
    std::vector<float> residual_weights;  ///< residual codec: 2^nbits bucket values
};

/// A whole index in host memory, internal ids 0..n_docs-1.
struct IndexData {
    IndexInfo info;
    IndexModel model;
    std::vector<int64_t> doc_offsets;       ///< [n_docs + 1] token offsets
    std::vector<uint32_t> token_centroids;  ///< [n_tokens]
    std::vector<uint8_t> codes;             ///< [n_tokens, n_code_bytes]
    std::vector<uint16_t> vectors;          ///< fp16 [n_tokens, dim], empty unless kept/loaded
    std::vector<int64_t> ivf_offsets;       ///< [n_centroids + 1]
    std::vector<int32_t> ivf_docs;          ///< doc ids per centroid, sorted, unique
    std::vector<std::string> doc_ids;       ///< external ids [n_docs]
};

/// Write `data` as a RocksDB index at `path`. The index is built in a sibling temporary
/// directory and renamed into place only when complete; an existing index at `path` is
/// replaced only with `overwrite` (and only after the new one is complete).
Status WriteIndex(const std::string& path, const IndexData& data, const IndexBuildOptions& opts);

/// Read an index. Fails with a one-line message on anything that is not a complete index
/// of a supported format, or on a checksum mismatch.
Status ReadIndex(const std::string& path, bool load_vectors, bool progress, IndexData* data);

/// Read only the metadata.
Status ReadIndexInfo(const std::string& path, IndexInfo* info);

/// Build `IndexData` from embeddings: sample, k-means, assign, encode, IVF. Validates input.
Status BuildIndexData(const EmbeddingView& tokens, const std::vector<int64_t>& doclens,
                      std::vector<std::string> doc_ids, const IndexBuildOptions& opts, IndexData* out,
                      std::vector<std::pair<std::string, double>>* phase_seconds);

/// <q, centroid_k> for every query token: out [n, n_centroids] (BLAS sgemm via FAISS's BLAS).
void CentroidScores(const float* x, int64_t n, const IndexModel& model, float* out);

/// Make BLAS single-threaded (OpenBLAS's own threads fight OpenMP); no-op for other BLAS.
void SingleThreadedBlas();

/// CRC-32 (IEEE) of a byte range, used to check stored chunks.
uint32_t Crc32(const void* data, size_t n, uint32_t seed = 0);

}  // namespace tms::index

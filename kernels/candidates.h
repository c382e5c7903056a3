// Copyright TileMaxSim authors. Candidate-generation ops of the query pipeline, on memory the
// caller owns (kernels/maxsim.h's conventions):
//   IVF union: the documents of every IVF list probed by a query's tokens, each once, ascending;
//   TF32x3 split: fp32 rows as three TF32-exact parts, so that one TF32 tensor-core GEMM over
//   them is accurate to fp32 (the centroid scores of probing).
// ref (kernels/ref/candidates_ref.cpp, the spec), cpu (kernels/cpu/candidates_cpu.cpp), cuda
// (kernels/cuda/candidates_cuda.h: the same steps as device kernels on a stream).
#pragma once

#include <cstdint>
#include <vector>

#include "tilemaxsim/status.h"

namespace tms::kernels {

/// The union of the probed IVF lists of each query.
struct IvfUnionParams {
    /// [n_queries, q_stride, nprobe] centroid ids probed by each token slot; < 0: none.
    const int32_t* probe = nullptr;
    int n_queries = 0;
    int q_stride = 0;
    int nprobe = 0;
    /// [n_queries] token slots used per query (<= q_stride); nullptr: all q_stride.
    const int32_t* query_lens = nullptr;
    /// [n_centroids + 1] offsets into ivf_docs; list c holds document ids in [0, n_docs).
    const int64_t* ivf_offsets = nullptr;
    const int32_t* ivf_docs = nullptr;
    int n_centroids = 0;
    int64_t n_docs = 0;
};

/// Sizes non-negative, inputs present when anything is probed (shared by every path).
Status ivf_union_validate(const IvfUnionParams& p);
/// Query q's documents into docs[off[q] .. off[q + 1]), ascending, each once.
Status ivf_union_ref(const IvfUnionParams& p, std::vector<int64_t>* off, std::vector<int32_t>* docs);
/// The same, queries in parallel (OpenMP), a bitmap of n_docs bits per thread.
Status ivf_union_cpu(const IvfUnionParams& p, std::vector<int64_t>* off, std::vector<int32_t>* docs);

/// dst [rows, 3 * dim]: row r of src [rows, dim] as three parts of dim each, part s being lo when
/// bit s of lo_parts is set, else hi; hi = x with its low 13 mantissa bits cleared (exact in
/// TF32), lo = x - hi (exact in fp32). Centroids as (hi, lo, hi) and query rows as (hi, hi, lo):
/// their product over 3 * dim is hi.hi + lo.hi + hi.lo, all but lo.lo (2^-20 of the product).
void split_tf32x3_ref(const float* src, int64_t rows, int dim, unsigned lo_parts, float* dst);

}  // namespace tms::kernels

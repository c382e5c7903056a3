// Copyright TileMaxSim authors.
// MaxSim kernels: score(q, d) = sum_i max_j <q_i, d_j>, on memory the caller owns.
// Three implementations of each op share these parameter structs:
//   ref  (kernels/ref/)  scalar, fp64 accumulation: THE SPEC
//   cpu  (kernels/cpu/)  OpenMP production path
//   cuda (kernels/cuda/) the TileMaxSim kernels (see kernels/cuda/maxsim_cuda.h)
// Conventions shared by every path:
//   * a document with 0 tokens scores 0; a query with 0 tokens scores 0 against anything;
//   * candidate lists are ragged: query q scores cand_docs[cand_offsets[q] .. cand_offsets[q+1]);
//     with cand_offsets == nullptr every query scores every document (dense [n_queries, n_docs]).
#pragma once

#include <cstdint>

#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms::kernels {

/// Exact MaxSim on full-precision token vectors.
struct MaxSimParams {
    /// Query tokens [n_queries, q_stride, dim], row-major, element type q_dtype.
    const void* queries = nullptr;
    DType q_dtype = DType::kF32;
    int n_queries = 0;
    int q_stride = 0;  ///< token slots per query (padding rows past query_lens[q] are ignored)
    int dim = 0;
    /// [n_queries] tokens used by each query (<= q_stride); nullptr: all q_stride tokens.
    const int32_t* query_lens = nullptr;

    /// Packed document tokens [n_tokens, dim], row-major, element type d_dtype, no padding.
    const void* doc_tokens = nullptr;
    DType d_dtype = DType::kF16;
    /// [n_docs + 1] token offsets: document d owns rows [doc_offsets[d], doc_offsets[d+1]).
    const int64_t* doc_offsets = nullptr;
    int64_t n_docs = 0;
    /// Rows of doc_tokens (>= doc_offsets[n_docs]) when the caller knows it, else -1. The CUDA
    /// path then reads the documents (any dtype, sm_90+) with the bulk tensor copy engine
    /// (TMA), which must know where the buffer ends; without it, it uses per-thread async
    /// copies. Rows past n_tokens read as zeros.
    int64_t n_tokens = -1;

    /// [n_queries + 1] offsets into cand_docs, or nullptr for dense (every query x every doc).
    const int64_t* cand_offsets = nullptr;
    /// Document indices in [0, n_docs); duplicates allowed.
    const int32_t* cand_docs = nullptr;

    /// Output, one score per (query, candidate), laid out like the candidates
    /// (dense: [n_queries, n_docs]).
    float* scores = nullptr;

    /// CUDA only, a promise: doc_tokens and doc_offsets are not written by the kernel that comes
    /// before this call in the stream (documents uploaded once, as a loaded shard's are). Dense
    /// calls then load their first document offsets and start their first document copies
    /// before waiting for that kernel to finish (the call is a programmatic dependent launch),
    /// so that consecutive calls overlap. Queries, candidate lists and outputs are accessed
    /// after the wait in any case. Only the speed depends on it.
    bool docs_static = false;
};

/// Number of scores a call writes.
int64_t maxsim_num_scores(const MaxSimParams& p);
/// Checks shapes and input pointers (does not read data, nor check the output pointer). Dimensions: [1, 4096] for
/// ref/cpu; the CUDA path supports multiples of 32 in [32, 1024].
Status maxsim_validate(const MaxSimParams& p);
/// Scalar reference with fp64 accumulation; writes maxsim_num_scores(p) doubles.
Status maxsim_ref(const MaxSimParams& p, double* scores);
/// OpenMP path (fp32 accumulation), writes p.scores.
Status maxsim_cpu(const MaxSimParams& p);

/// MaxSim on compressed tokens, as a sum of lookups (PQ and PLAID residual codes share it).
/// A token t is decoded as  x_t = centroids[token_centroids[t]] + r_t, where the residual r_t
/// is the concatenation over b in [0, n_code_bytes) of codebook[b][codes[t, b]], a block of
/// dsub = dim / n_code_bytes floats. Hence
///     <q_i, x_t> = centroid_scores[q, i, token_centroids[t]] + sum_b <q_i[b-block], codebook[b][codes[t,b]]>.
/// With n_code_bytes == 0 the residual is dropped: this is PLAID's centroid-interaction score.
struct CodeMaxSimParams {
    /// Query tokens [n_queries, q_stride, dim] (float), as in MaxSimParams.
    const float* queries = nullptr;
    int n_queries = 0;
    int q_stride = 0;
    int dim = 0;
    const int32_t* query_lens = nullptr;

    /// [n_queries, q_stride, n_centroids]: <q_i, centroid_k>, computed by the caller.
    const float* centroid_scores = nullptr;
    int n_centroids = 0;

    /// [n_tokens] coarse centroid of each token.
    const uint32_t* token_centroids = nullptr;
    /// [n_tokens, n_code_bytes] codes (may be nullptr when n_code_bytes == 0).
    const uint8_t* codes = nullptr;
    int n_code_bytes = 0;
    /// [n_code_bytes, 256, dim / n_code_bytes] decoded residual blocks.
    const float* codebook = nullptr;
    /// The caller promises that all n_code_bytes blocks of the codebook are equal (residual
    /// codecs: one set of bucket weights for every dimension). A hint: the CUDA kernel then keeps
    /// one block (replicated against bank conflicts) when dsub is 2, 4 or 8; results are the same.
    bool codebook_shared = false;
    /// Optional, CUDA only: the codebook already in the kernel's fp16 shared-memory layout, as
    /// written by code_codebook_image_cuda for the same dim, n_code_bytes and codebook_shared
    /// (kernels/cuda/code_maxsim_cuda.h). Each CTA then copies it (one round trip) instead of
    /// converting `codebook`, which it no longer reads. Prepare it once per codebook.
    const void* codebook_image = nullptr;
    /// CUDA only: score with the Hopper warpgroup-MMA kernel where it applies (a build for
    /// sm_90a on a compute capability 9.0 device, scores mode, dim 128, every codec:
    /// code_maxsim_cuda_uses_wgmma); false: the mma.sync kernel every GPU runs.
    /// The warpgroup-MMA kernel takes the maximum over a document's tokens in fp16: each query
    /// row's term is within two fp16 roundings (the similarity, then its sum with the fp16
    /// centroid score; with token_scales a third, the product) of the mma.sync kernel's, which
    /// takes it in fp32; the document score is summed in fp32 by both.
    bool allow_wgmma = true;

    /// Optional, with codes: [n_tokens] factors, token t's similarity <q_i, x_t> multiplied by
    /// token_scales[t] before the maximum over the document's tokens. decoded_scales_* write the
    /// 1 / ||x_t|| that scores the decoded tokens as unit vectors (PLAID normalises its
    /// decompressed embeddings). Not read when n_code_bytes == 0.
    const float* token_scales = nullptr;

    const int64_t* doc_offsets = nullptr;
    int64_t n_docs = 0;
    const int64_t* cand_offsets = nullptr;
    const int32_t* cand_docs = nullptr;
    /// Optional, CUDA only, with cand_offsets: cand_offsets[n_queries] (all queries' candidates)
    /// when the caller knows it on the host; 0: not known. The scoring call then sizes its grid
    /// so that few queries' centroid-score tables are in use at once (they stay in L2). Only the
    /// speed depends on it.
    int64_t n_candidates = 0;
    float* scores = nullptr;
};

int64_t code_maxsim_num_scores(const CodeMaxSimParams& p);
Status code_maxsim_validate(const CodeMaxSimParams& p);
/// Spec: decode every token in fp64 (centroid + residual) and take exact MaxSim.
/// Needs `centroids` [n_centroids, dim] since it decodes instead of using centroid_scores.
Status code_maxsim_ref(const CodeMaxSimParams& p, const float* centroids, double* scores);
/// OpenMP path: per-query lookup tables (q_i . codebook block), fp32.
Status code_maxsim_cpu(const CodeMaxSimParams& p);

/// The inverse norms of decoded tokens (CodeMaxSimParams' decoding: x_t = centroids[cid_t] +
/// residual blocks): scales[t] = 1 / ||x_t||, 1 for a zero vector; the token_scales that score
/// the decoded tokens as unit vectors.
struct DecodedScaleParams {
    const float* centroids = nullptr;  ///< [n_centroids, dim]
    int n_centroids = 0;
    int dim = 0;
    const uint32_t* token_centroids = nullptr;  ///< [n_tokens], each below n_centroids
    const uint8_t* codes = nullptr;             ///< [n_tokens, n_code_bytes]
    int n_code_bytes = 0;                       ///< > 0, divides dim
    const float* codebook = nullptr;            ///< [n_code_bytes, 256, dim / n_code_bytes]
    int64_t n_tokens = 0;
    float* scales = nullptr;  ///< [n_tokens], output
};
Status decoded_scales_validate(const DecodedScaleParams& p);
/// Spec: fp64 decode and norm; writes n_tokens doubles (p.scales is not used).
Status decoded_scales_ref(const DecodedScaleParams& p, double* scales);
/// OpenMP path, fp32 accumulation; writes p.scales.
Status decoded_scales_cpu(const DecodedScaleParams& p);

/// Host-side checks of a query batch and its candidate lists, shared by every path that reads
/// them on the host (CPU kernels, GPU scorers before upload): sizes, query lengths in
/// [0, q_stride], non-decreasing offsets from 0, candidate documents in [0, n_docs).
/// `who` prefixes the messages. Sets *n_cand to the number of candidates (0 for dense).
Status validate_host_batch(const char* who, int n_queries, int q_stride, const void* queries, const int32_t* query_lens,
                           const int64_t* cand_offsets, const int32_t* cand_docs, int64_t n_docs, int64_t* n_cand);

/// Checks of a shard before it is uploaded to a device (the GPU scorers' Create): doc_offsets
/// [n_docs + 1] non-null, running from 0 to n_tokens without decreasing; `device` one of the
/// `n_devices` present. InvalidArgument "<who>: ..." otherwise.
Status validate_shard(const char* who, const int64_t* doc_offsets, int64_t n_docs, int64_t n_tokens, int device,
                      int n_devices);

/// Whether all n_code_bytes blocks of a host codebook [n_code_bytes, 256, dim / n_code_bytes]
/// are equal (exact comparison), as CodeMaxSimParams::codebook_shared promises; false for an
/// empty codebook.
bool codebook_blocks_equal(const float* codebook, int dim, int n_code_bytes);

/// Per-segment top-k. Segment s is scores[offsets[s] .. offsets[s+1]) (or, with offsets ==
/// nullptr, the rows of a dense [n_segments, row_len] matrix). Output [n_segments, k]:
/// best first; ties broken by the lower id; ids are ids[pos] (or the position within the
/// segment when ids == nullptr); short segments are padded with id -1 and score -inf.
struct TopKParams {
    const float* scores = nullptr;
    const int64_t* offsets = nullptr;
    int64_t row_len = 0;
    int64_t n_segments = 0;
    const int32_t* ids = nullptr;
    int k = 0;
    int32_t* out_ids = nullptr;
    float* out_scores = nullptr;
};

Status topk_validate(const TopKParams& p);
Status topk_ref(const TopKParams& p);
Status topk_cpu(const TopKParams& p);

/// IEEE half <-> float (round to nearest even), and bfloat16.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bf16_to_float(uint16_t h);
uint16_t float_to_bf16(float f);
/// Element i of an array of dtype t, as float.
float load_as_float(const void* data, DType t, int64_t i);
/// Elements [offset, offset + n) of an array of dtype t, as float, into out (fp16 by the
/// vectorised conversion where the CPU has it).
void load_as_float_n(const void* data, DType t, int64_t offset, int64_t n, float* out);
/// load_as_float_n spread over the OpenMP threads (pieces of 64K values; one thread below that).
void load_as_float_parallel(const void* data, DType t, int64_t offset, int64_t n, float* out);

}  // namespace tms::kernels

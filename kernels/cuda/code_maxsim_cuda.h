// Copyright TileMaxSim authors.
// CUDA compressed MaxSim: PQ-fused and PLAID-residual-fused scoring (host-only header: no CUDA
// includes; a stream is passed as void* and is a cudaStream_t). Both codecs share one decode:
// token t = centroids[token_centroids[t]] + concat_b codebook[b][codes[t, b]] (see
// kernels/maxsim.h, CodeMaxSimParams). The centroid part enters through the centroid scores
// (<q_i, x_t> = centroid_scores[q, i, cid_t] + <q_i, r_t>); the residual is decoded from a
// shared-memory fp16 copy of the codebook straight into tensor-core fragments, so decoded
// vectors never leave the SM.
// Every pointer inside CodeMaxSimParams is a DEVICE pointer (query_lens, doc_offsets,
// cand_offsets and cand_docs too); p.codes must be 4-byte aligned. The calls check only what
// needs no device read; candidate ids outside [0, n_docs) yield a NaN score. Calls enqueue
// work on `stream`, never synchronize or allocate, and can be captured in a CUDA graph.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/maxsim.h"

namespace tms::kernels {

/// Bytes of the centroid-score table: p.centroid_scores re-laid out as fp16
/// [n_queries, ceil(q_stride / 32), n_centroids, 32] (the 32 query rows of a group in the
/// order the kernel's accumulator fragments want them; rows past query_lens[q] are 0).
size_t code_centroid_table_bytes(const CodeMaxSimParams& p);

/// Writes the table (d_table, code_centroid_table_bytes(p) bytes, 16-byte aligned) from
/// p.centroid_scores, fp32 [n_queries, q_stride, n_centroids] on the device. A programmatic
/// dependent launch, as the scoring kernels: it starts while the stream's previous kernel ends
/// and reads nothing before that kernel's writes are visible.
Status code_centroid_table_cuda(const CodeMaxSimParams& p, void* d_table, void* stream);

/// Bytes of the prepared fp16 codebook image of this shape (dim, n_code_bytes and the
/// codebook_shared hint decide its layout): 0 for centroid-only or unsupported shapes.
size_t code_codebook_image_bytes(const CodeMaxSimParams& p);

/// Writes the image (d_image, code_codebook_image_bytes(p) bytes, 16-byte aligned) from
/// p.codebook. Pass it as p.codebook_image to the scoring calls with the same dim,
/// n_code_bytes and codebook_shared: each CTA then copies 64 KB (dim 128, or a shared
/// block) in one round trip instead of converting 128 KB of fp32 in dependent loads.
Status code_codebook_image_cuda(const CodeMaxSimParams& p, void* d_image, void* stream);

/// Fused scoring from a table written by code_centroid_table_cuda (p.centroid_scores is not
/// read). Writes p.scores (layout of code_maxsim_num_scores). p.codebook is fp32
/// [n_code_bytes, 256, dsub] and is converted to fp16 in shared memory by every CTA, unless
/// p.codebook_image holds it prepared (code_codebook_image_cuda).
/// Supports: n_code_bytes == 0 (centroid-only, any dim); otherwise dim a multiple of 32,
/// dsub = dim / n_code_bytes in {2, 4} or a multiple of 8, and the fp16 codebook (dim * 512
/// bytes), 32 query rows and each warp's two 32-token staging buffers within the device's
/// shared memory (on an H200: every dsub up to dim 256, dsub >= 8 up to dim 352).
/// Others: NotSupported (code_maxsim_cuda_supported says so up front).
Status code_maxsim_table_cuda(const CodeMaxSimParams& p, const void* d_table, void* stream);

/// OK when code_maxsim_table_cuda supports this shape on the current device, else
/// NotSupported naming the reason.
Status code_maxsim_cuda_supported(int dim, int n_code_bytes);

/// Whether code_maxsim_cuda / code_maxsim_table_cuda with p score on the current device with the
/// Hopper warpgroup-MMA kernel (p.allow_wgmma, codes, a build with sm_90a code, a compute
/// capability 9.0 device) rather than the mma.sync one. Top-k calls always use mma.sync.
bool code_maxsim_cuda_uses_wgmma(const CodeMaxSimParams& p);

/// Slices a query (grid.x) of a scoring call with p on the current device (the launch's plan,
/// for tests and diagnostics; p.n_candidates changes it for ragged calls of many queries).
Status code_maxsim_cuda_slices(const CodeMaxSimParams& p, int64_t* slices);

/// Whether this build has sm_90a code (CUDA architectures naming 90a).
bool code_maxsim_cuda_built_sm90a();

/// Workspace of code_maxsim_cuda: the table (code_centroid_table_bytes).
size_t code_maxsim_cuda_workspace_bytes(const CodeMaxSimParams& p);

/// code_centroid_table_cuda then code_maxsim_table_cuda. d_workspace holds at least
/// code_maxsim_cuda_workspace_bytes(p) bytes, 256-byte aligned.
Status code_maxsim_cuda(const CodeMaxSimParams& p, void* d_workspace, size_t workspace_bytes, void* stream);

/// Workspace code_maxsim_topk_cuda needs (the table, then the per-slice top-k lists); 0 when
/// the request is invalid or the shape with k is not supported. Depends only on the sizes,
/// dense / ragged, k and the current device: no device reads.
size_t code_maxsim_topk_cuda_workspace_bytes(const CodeMaxSimParams& p, int k);

/// Scores the candidates as code_maxsim_cuda and keeps each query's k best on the device, as
/// maxsim_topk_cuda does for exact scoring: d_out_ids [n_queries, k] (document indices,
/// best first, ties to the lower index, short lists padded with -1) and d_out_scores
/// [n_queries, k] (padding -inf). p.scores is not used. k in [1, kMaxTopKCuda]; each warp's
/// list of k keys takes shared memory (64 KB a CTA at k = 1024), so large k can make a shape
/// NotSupported. d_workspace: code_maxsim_topk_cuda_workspace_bytes(p, k), 256-byte aligned.
Status code_maxsim_topk_cuda(const CodeMaxSimParams& p, int k, int32_t* d_out_ids, float* d_out_scores,
                             void* d_workspace, size_t workspace_bytes, void* stream);

/// decoded_scales on the device (kernels/maxsim.h, DecodedScaleParams): every pointer a device
/// pointer; token centroid ids below n_centroids (not checked: no device reads). Enqueued on
/// `stream`; rsqrt in fp32, within a few ulp of decoded_scales_cpu.
Status decoded_scales_cuda(const DecodedScaleParams& p, void* stream);

}  // namespace tms::kernels

// Copyright TileMaxSim authors.
// Launcher of the compressed (PQ / PLAID residual) fused MaxSim kernels: validate (sizes and
// pointer alignment only: no device reads), pick the decode class with one switch
// (dsub -> kSub) and codebook layout, size the grid from the device's occupancy, launch,
// check. Also the centroid-score table writer and the codebook image writer. Every
// instantiation (decode class x layout x scores / top-k, 19 in all) is in this file.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/code_maxsim_cuda.h"
#include "kernels/cuda/code_maxsim_kernel.cuh"
#include "kernels/cuda/code_maxsim_launch.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch_cache.h"
#include "kernels/cuda/maxsim_cuda.h"
#include "kernels/cuda/topk_merge.h"

namespace tms::kernels {
namespace code_impl {

/// The prepared codebook image (code_codebook_image_cuda): write_codebook of layout `book` for
/// decode class `sub`, across the grid, into global memory.
__global__ void __launch_bounds__(256)
    codebook_image_kernel(const float* codebook, int dim, int sub, int book, unsigned char* dst) {
    const int tid = int(blockIdx.x * blockDim.x + threadIdx.x), n = int(gridDim.x * blockDim.x);
    if (book == kBookPaired) {
        if (sub == 8) write_codebook<8, kBookPaired>(codebook, dim, dst, tid, n);
        if (sub == 4) write_codebook<4, kBookPaired>(codebook, dim, dst, tid, n);
        if (sub == 2) write_codebook<2, kBookPaired>(codebook, dim, dst, tid, n);
    } else if (book == kBookShared) {
        if (sub == 8) write_codebook<8, kBookShared>(codebook, dim, dst, tid, n);
        if (sub == 4) write_codebook<4, kBookShared>(codebook, dim, dst, tid, n);
        if (sub == 2) write_codebook<2, kBookShared>(codebook, dim, dst, tid, n);
    } else {
        write_codebook<8, kBookPerByte>(codebook, dim, dst, tid, n);  // the same for every class
    }
}

/// Centroids per tile of the table writer.
constexpr int kTableTileK = 64;

/// Table writer: one CTA of 256 threads transposes 32 rows x 64 centroids of one (query, group)
/// through shared memory: reads along centroids (16-byte loads when every row is 16-byte
/// aligned), writes each centroid's 32 slots as four 16-byte stores (table 16-byte aligned).
__global__ void __launch_bounds__(256)
    centroid_table_kernel(const float* cs, const int32_t* query_lens, int n_queries, int q_stride, int n_centroids,
                          int n_groups, __half* table) {
    // Rows padded by 4 floats: the 16-byte stores of one phase fill one 128-byte span, and the
    // reads below (4 rows two apart x 8 centroids a warp) hit 32 distinct banks.
    __shared__ __align__(16) float tile[32][kTableTileK + 4];
    // Launched by pdl::launch_pdl: its CTAs may start while the stream's previous kernel (the
    // last call's scoring, still reading the table) finishes; the scoring kernel after it may
    // start its CTAs as these retire (it waits for this grid before it reads the table).
    pdl::grid_dependency_wait();
    pdl::trigger_dependents();
    const int64_t n_ktiles = (n_centroids + kTableTileK - 1) / kTableTileK;
    const int64_t n_tiles = int64_t(n_queries) * n_groups * n_ktiles;
    const bool vec = n_centroids % 4 == 0 && reinterpret_cast<uintptr_t>(cs) % 16 == 0;
    for (int64_t tile_id = blockIdx.x; tile_id < n_tiles; tile_id += gridDim.x) {
        const int64_t kt = tile_id % n_ktiles;
        const int64_t qg = tile_id / n_ktiles;
        const int grp = int(qg % n_groups), q = int(qg / n_groups);
        int ql = query_lens ? query_lens[q] : q_stride;
        ql = max(0, min(ql, q_stride));
        const int k0 = int(kt * kTableTileK);
        __syncthreads();
        // 32 rows x 16 pieces of 4 centroids, two a thread.
        for (int j = threadIdx.x; j < 32 * (kTableTileK / 4); j += blockDim.x) {
            const int r = j / (kTableTileK / 4), kk = (j % (kTableTileK / 4)) * 4;
            const int row = grp * 32 + r, k = k0 + kk;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (row < ql && k < n_centroids) {
                const float* src = cs + (int64_t(q) * q_stride + row) * n_centroids + k;
                if (vec) {
                    v = __ldg(reinterpret_cast<const float4*>(src));
                } else {
                    v.x = src[0];
                    v.y = k + 1 < n_centroids ? src[1] : 0.f;
                    v.z = k + 2 < n_centroids ? src[2] : 0.f;
                    v.w = k + 3 < n_centroids ? src[3] : 0.f;
                }
            }
            *reinterpret_cast<float4*>(&tile[r][kk]) = v;
        }
        __syncthreads();
        // 64 centroids x 4 pieces of 8 slots, one a thread.
        for (int j = threadIdx.x; j < kTableTileK * 4; j += blockDim.x) {
            const int kk = j >> 2, s8 = (j & 3) * 8, k = k0 + kk;
            if (k >= n_centroids) continue;
            uint32_t w[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const __half2 h =
                    __floats2half2_rn(tile[table_row(s8 + 2 * i)][kk], tile[table_row(s8 + 2 * i + 1)][kk]);
                w[i] = *reinterpret_cast<const uint32_t*>(&h);
            }
            *reinterpret_cast<uint4*>(table + (qg * n_centroids + k) * 32 + s8) = make_uint4(w[0], w[1], w[2], w[3]);
        }
    }
}

namespace {

int n_groups(const CodeMaxSimParams& p) { return (p.q_stride + 31) / 32; }

/// Decode class of a codec shape; -1 when unsupported.
int sub_class(const CodeMaxSimParams& p) {
    if (p.n_code_bytes == 0) return 0;
    const int dsub = p.dim / p.n_code_bytes;
    if (dsub == 2 || dsub == 4) return dsub;
    if (dsub % 8 == 0) return 8;
    return -1;
}

/// How the kernel holds the codebook (CodeTraits::kBook) for this shape and the caller's hints.
int book_mode(const CodeMaxSimParams& p, int sub) {
    if (sub == 0) return kBookPerByte;
    const int dsub = p.dim / p.n_code_bytes;
    if (dsub != sub) return kBookPerByte;  // kSub 8 with dsub 16, 24, ...
    if (p.codebook_shared) return kBookShared;
    if (p.dim % 64 == 0) return kBookPaired;  // dsub 2 too: conflict-free gathers (kBookPaired)
    return kBookPerByte;
}

/// fp16 codebook bytes in shared memory: every block (also paired), or 256 entries x 256 bytes
/// replicated.
int codebook_smem_bytes(const CodeMaxSimParams& p, int sub) {
    if (sub == 0) return 0;
    return book_mode(p, sub) == kBookShared ? 256 * kSharedEntryStride : p.dim * 512;
}

/// NotSupported for a codec shape (dim, n_code_bytes) the kernel has no decode for.
Status check_shape(const CodeMaxSimParams& p) {
    if (p.dim <= 0 || p.n_code_bytes < 0 || (p.n_code_bytes > 0 && p.dim % p.n_code_bytes != 0)) {
        return Status::NotSupported("code_maxsim_cuda: n_code_bytes " + std::to_string(p.n_code_bytes) +
                                    " must divide dim " + std::to_string(p.dim));
    }
    if (p.n_code_bytes > 0 && p.dim % 32 != 0) {
        return Status::NotSupported("code_maxsim_cuda: dim " + std::to_string(p.dim) + " (multiples of 32 with codes)");
    }
    if (sub_class(p) < 0) {
        return Status::NotSupported("code_maxsim_cuda: dsub " + std::to_string(p.dim / p.n_code_bytes) +
                                    " (2, 4 or a multiple of 8)");
    }
    return Status::OK();
}

/// Codebook and query rows (with codes), then two stages per warp; top-k mode (k > 0): each
/// warp's list of k keys and the list lengths; the warpgroup-MMA kernel (wg): two sets of 8 step
/// counts.
size_t smem_bytes(const CodeMaxSimParams& p, int sub, int k, bool wg) {
    constexpr int kWarps = CodeTraits<0>::kWarps;
    const size_t stages = size_t(kWarps) * 2 * stage_bytes(p.n_code_bytes);
    const size_t lists = k > 0 ? size_t(kWarps) * k * sizeof(uint64_t) + 16 * ((kWarps * sizeof(int) + 15) / 16) : 0;
    if (sub == 0) return stages + lists;
    const size_t wg_counts = wg ? 2 * kWarps * sizeof(int) : 0;
    return size_t(codebook_smem_bytes(p, sub)) + size_t(32) * p.dim * 2 + stages + lists + wg_counts;
}

/// Whether a scores-mode call with p runs the warpgroup-MMA kernel (code_maxsim_cuda_uses_wgmma):
/// a build with sm_90a code, a compute capability 9.0 device, and its shared memory within the
/// device's limit. Decided once per call; its result goes to smem_bytes, check_smem and dispatch.
bool wg_applies(const CodeMaxSimParams& p) {
#if defined(TMS_CUDA_SM90A)
    // dim 128 only: its steps are straight-line code for 4 chunks (a loop over 128-dim rounds made
    // ptxas serialize the wgmmas); other dims score through mma.sync.
    if (!p.allow_wgmma || p.n_code_bytes <= 0 || p.dim != 128 || !check_shape(p).ok()) return false;
    const int sub = sub_class(p);
    if (!wg_class(sub, book_mode(p, sub))) return false;
    launch_cache::DeviceFacts dev;
    if (!launch_cache::current_device(&dev).ok() || dev.cc_major != 9 || dev.cc_minor != 0) return false;
    return smem_bytes(p, sub, 0, true) <= size_t(dev.smem_optin);
#else
    return false;
#endif
}

Status validate_sizes(const CodeMaxSimParams& p) {
    if (p.n_queries < 0 || p.q_stride < 0 || p.n_docs < 0 || p.dim <= 0 || p.n_candidates < 0) {
        return Status::InvalidArgument("code_maxsim_cuda: bad size");
    }
    if (p.n_centroids <= 0) return Status::InvalidArgument("code_maxsim_cuda: n_centroids must be positive");
    TMS_RETURN_IF_ERROR(check_shape(p));
    if (p.n_code_bytes > 0) {
        if (p.codebook == nullptr && p.codebook_image == nullptr) {
            return Status::InvalidArgument("code_maxsim_cuda: codebook is null");
        }
        if (reinterpret_cast<uintptr_t>(p.codebook) % 16 != 0 ||
            reinterpret_cast<uintptr_t>(p.codebook_image) % 16 != 0) {
            return Status::InvalidArgument("code_maxsim_cuda: codebook and codebook_image must be 16-byte aligned");
        }
        if (reinterpret_cast<uintptr_t>(p.codes) % 4 != 0) {
            return Status::InvalidArgument("code_maxsim_cuda: codes must be 4-byte aligned");
        }
    }
    if (p.n_docs > INT32_MAX - 1) return Status::NotSupported("code_maxsim_cuda: more than 2^31 - 2 documents");
    if (p.n_queries > 0 && p.q_stride > 0 && p.queries == nullptr && p.n_code_bytes > 0) {
        return Status::InvalidArgument("code_maxsim_cuda: queries is null");
    }
    if (p.n_docs > 0 && (p.doc_offsets == nullptr || p.token_centroids == nullptr)) {
        return Status::InvalidArgument("code_maxsim_cuda: doc_offsets or token_centroids is null");
    }
    if (p.n_docs > 0 && p.n_code_bytes > 0 && p.codes == nullptr) {
        return Status::InvalidArgument("code_maxsim_cuda: codes is null");
    }
    if (p.cand_offsets != nullptr && p.n_queries > 0 && p.cand_docs == nullptr) {
        return Status::InvalidArgument("code_maxsim_cuda: cand_docs is null");
    }
    return Status::OK();
}

/// NotSupported when the shape's shared memory (top-k lists of k keys when k > 0; the
/// warpgroup-MMA kernel's when wg) exceeds the current device's opt-in limit.
Status check_smem(const CodeMaxSimParams& p, int k, bool wg) {
    const size_t smem = smem_bytes(p, sub_class(p), k, wg);
    launch_cache::DeviceFacts dev;
    TMS_RETURN_IF_ERROR(launch_cache::current_device(&dev));
    const int smem_optin = dev.smem_optin;
    if (smem > size_t(smem_optin)) {
        return Status::NotSupported(
            "code_maxsim_cuda: dim " + std::to_string(p.dim) + " with " + std::to_string(p.n_code_bytes) +
            " code bytes" + (k > 0 ? " and top-" + std::to_string(k) : std::string()) + " needs " +
            std::to_string(smem) +
            " bytes of shared memory (codebook, query rows, staging, top-k lists); the device has " +
            std::to_string(smem_optin));
    }
    return Status::OK();
}

/// launch_as of the scoring instantiation, or the top-k one when a.k > 0; 2-dim sub-vectors in
/// the per-byte layout (dim 32 or 96) score with the query fragments in registers
/// (CodeTraits::kQReg).
template <int kSub, int kBook>
Status launch(const CodeArgs& a, size_t smem, const GridShape& gs, cudaStream_t st, bool plan_only, dim3* grid_out) {
    if (a.k > 0) return launch_as<CodeTraits<kSub, kBook, true>>(a, smem, gs, st, plan_only, grid_out);
    if constexpr (kSub == 2 && kBook == kBookPerByte) {
        using TQ = CodeTraits<kSub, kBook, false, true>;
        if (a.dim <= 32 * TQ::kQChunks) return launch_as<TQ>(a, smem, gs, st, plan_only, grid_out);
    }
    return launch_as<CodeTraits<kSub, kBook, false>>(a, smem, gs, st, plan_only, grid_out);
}

/// One switch on (decode class, codebook mode); default NotSupported. wg: the warpgroup-MMA
/// instantiation (launch_wg; wg_applies said so). plan_only / grid: as launch.
Status dispatch(int sub, bool wg, const CodeArgs& a, size_t smem, const CodeMaxSimParams& p, cudaStream_t st,
                bool plan_only = false, dim3* grid = nullptr) {
    const bool ragged = p.cand_offsets != nullptr;
    const GridShape gs{ragged ? p.n_candidates : p.n_docs, ragged, p.n_queries};
    const int book = book_mode(p, sub);
    if (wg) return launch_wg(sub, book, a, smem, gs, st, plan_only, grid);
    switch (sub * 4 + book) {
        case 0: return launch<0, kBookPerByte>(a, smem, gs, st, plan_only, grid);
        case 2 * 4 + kBookPerByte: return launch<2, kBookPerByte>(a, smem, gs, st, plan_only, grid);
        case 2 * 4 + kBookShared: return launch<2, kBookShared>(a, smem, gs, st, plan_only, grid);
        case 2 * 4 + kBookPaired: return launch<2, kBookPaired>(a, smem, gs, st, plan_only, grid);
        case 4 * 4 + kBookPerByte: return launch<4, kBookPerByte>(a, smem, gs, st, plan_only, grid);
        case 4 * 4 + kBookShared: return launch<4, kBookShared>(a, smem, gs, st, plan_only, grid);
        case 4 * 4 + kBookPaired: return launch<4, kBookPaired>(a, smem, gs, st, plan_only, grid);
        case 8 * 4 + kBookPerByte: return launch<8, kBookPerByte>(a, smem, gs, st, plan_only, grid);
        case 8 * 4 + kBookShared: return launch<8, kBookShared>(a, smem, gs, st, plan_only, grid);
        case 8 * 4 + kBookPaired: return launch<8, kBookPaired>(a, smem, gs, st, plan_only, grid);
        default:
            return Status::NotSupported("code_maxsim_cuda: decode class " + std::to_string(sub) + ", codebook mode " +
                                        std::to_string(book));
    }
}

}  // namespace
}  // namespace code_impl

size_t code_centroid_table_bytes(const CodeMaxSimParams& p) {
    if (p.n_queries <= 0 || p.q_stride <= 0 || p.n_centroids <= 0) return 0;
    return size_t(p.n_queries) * code_impl::n_groups(p) * size_t(p.n_centroids) * 32 * sizeof(uint16_t);
}

Status code_centroid_table_cuda(const CodeMaxSimParams& p, void* d_table, void* stream) {
    if (p.n_queries < 0 || p.q_stride < 0) return Status::InvalidArgument("code_centroid_table_cuda: bad size");
    if (p.n_centroids <= 0) return Status::InvalidArgument("code_centroid_table_cuda: n_centroids must be positive");
    const size_t bytes = code_centroid_table_bytes(p);
    if (bytes == 0) return Status::OK();
    if (p.centroid_scores == nullptr || d_table == nullptr) {
        return Status::InvalidArgument("code_centroid_table_cuda: null centroid_scores or table");
    }
    if (reinterpret_cast<uintptr_t>(d_table) % 16 != 0) {
        return Status::InvalidArgument("code_centroid_table_cuda: table must be 16-byte aligned");
    }
    const int64_t tiles = int64_t(p.n_queries) * code_impl::n_groups(p) *
                          ((p.n_centroids + code_impl::kTableTileK - 1) / code_impl::kTableTileK);
    const unsigned grid = unsigned(std::min<int64_t>(tiles, 1 << 16));
    return pdl::launch_pdl(code_impl::centroid_table_kernel, dim3(grid), dim3(256), 0,
                           static_cast<cudaStream_t>(stream), p.centroid_scores, p.query_lens, p.n_queries, p.q_stride,
                           p.n_centroids, code_impl::n_groups(p), static_cast<__half*>(d_table));
}

size_t code_codebook_image_bytes(const CodeMaxSimParams& p) {
    if (p.n_code_bytes <= 0 || !code_impl::check_shape(p).ok()) return 0;
    return size_t(code_impl::codebook_smem_bytes(p, code_impl::sub_class(p)));
}

Status code_codebook_image_cuda(const CodeMaxSimParams& p, void* d_image, void* stream) {
    TMS_RETURN_IF_ERROR(code_impl::check_shape(p));
    if (p.n_code_bytes == 0) return Status::OK();
    if (p.codebook == nullptr || d_image == nullptr) {
        return Status::InvalidArgument("code_codebook_image_cuda: null codebook or image");
    }
    if (reinterpret_cast<uintptr_t>(p.codebook) % 16 != 0 || reinterpret_cast<uintptr_t>(d_image) % 16 != 0) {
        return Status::InvalidArgument("code_codebook_image_cuda: codebook and image must be 16-byte aligned");
    }
    const int sub = code_impl::sub_class(p);
    code_impl::codebook_image_kernel<<<64, 256, 0, static_cast<cudaStream_t>(stream)>>>(
        p.codebook, p.dim, sub, code_impl::book_mode(p, sub), static_cast<unsigned char*>(d_image));
    TMS_CUDA_CHECK_LAUNCH();
    return Status::OK();
}

namespace code_impl {
namespace {

/// Kernel arguments of p with its table; scores mode (topk_partial null).
CodeArgs make_args(const CodeMaxSimParams& p, const void* d_table, int sub) {
    CodeArgs a{};
    a.queries = p.queries;
    a.n_queries = p.n_queries;
    a.q_stride = p.q_stride;
    a.dim = p.dim;
    a.query_lens = p.query_lens;
    a.table = static_cast<const __half*>(d_table);
    a.n_groups = n_groups(p);
    a.n_centroids = p.n_centroids;
    a.token_centroids = p.token_centroids;
    a.codes = p.codes;
    a.n_code_bytes = p.n_code_bytes;
    a.codes_aligned16 = p.n_code_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(p.codes) % 16 == 0;
    a.dsub = p.n_code_bytes ? p.dim / p.n_code_bytes : 0;
    a.dsub_magic = a.dsub ? uint32_t(((uint64_t(1) << 32) + a.dsub - 1) / a.dsub) : 0;
    a.codebook = p.codebook;
    a.token_scales = p.n_code_bytes > 0 ? p.token_scales : nullptr;
    a.doc_offsets = p.doc_offsets;
    a.n_docs = p.n_docs;
    a.cand_offsets = p.cand_offsets;
    a.cand_docs = p.cand_docs;
    a.scores = p.scores;
    a.topk_partial = nullptr;
    a.k = 0;
    a.cb_smem_bytes = codebook_smem_bytes(p, sub);
    a.cb_image = sub == 0 ? nullptr : static_cast<const unsigned char*>(p.codebook_image);
    return a;
}

/// The top-k call's workspace for a launch of `slices` slices: the centroid-score table, then,
/// from partial_offset, the partial lists (topk_dev::partial_bytes).
size_t partial_offset(const CodeMaxSimParams& p) { return align256(code_centroid_table_bytes(p)); }
size_t topk_workspace_bytes(const CodeMaxSimParams& p, int slices, int k) {
    return partial_offset(p) + topk_dev::partial_bytes(p.n_queries, slices, k);
}

/// The scores-mode launch of p from table d_table (the warpgroup-MMA kernel where wg_applies),
/// after the shared-memory check; plan_only / grid: as dispatch.
Status dispatch_scores(const CodeMaxSimParams& p, const void* d_table, cudaStream_t st, bool plan_only = false,
                       dim3* grid = nullptr) {
    const bool wg = wg_applies(p);
    TMS_RETURN_IF_ERROR(check_smem(p, 0, wg));
    const int sub = sub_class(p);
    return dispatch(sub, wg, make_args(p, d_table, sub), smem_bytes(p, sub, 0, wg), p, st, plan_only, grid);
}

/// Slices of the top-k launch (grid.x): the partial lists' count.
Status topk_slices(const CodeMaxSimParams& p, int k, int* slices) {
    const int sub = sub_class(p);
    CodeArgs a = make_args(p, nullptr, sub);
    a.k = k;
    dim3 grid;
    TMS_RETURN_IF_ERROR(dispatch(sub, false, a, smem_bytes(p, sub, k, false), p, nullptr, /*plan_only=*/true, &grid));
    *slices = int(grid.x);
    return Status::OK();
}

}  // namespace
}  // namespace code_impl

Status code_maxsim_table_cuda(const CodeMaxSimParams& p, const void* d_table, void* stream) {
    TMS_RETURN_IF_ERROR(code_impl::validate_sizes(p));
    if (p.n_queries == 0) return Status::OK();
    if (p.scores == nullptr && (p.cand_offsets != nullptr || p.n_docs > 0)) {
        return Status::InvalidArgument("code_maxsim_cuda: scores is null");
    }
    if (p.cand_offsets == nullptr && p.n_docs == 0) return Status::OK();
    if (d_table == nullptr && p.q_stride > 0) return Status::InvalidArgument("code_maxsim_cuda: table is null");
    return code_impl::dispatch_scores(p, d_table, static_cast<cudaStream_t>(stream));
}

size_t code_maxsim_topk_cuda_workspace_bytes(const CodeMaxSimParams& p, int k) {
    if (k < 1 || k > kMaxTopKCuda || p.n_queries <= 0) return 0;
    if (!code_impl::validate_sizes(p).ok() || !code_impl::check_smem(p, k, false).ok()) return 0;
    int slices = 0;
    if (!code_impl::topk_slices(p, k, &slices).ok()) return 0;
    return code_impl::topk_workspace_bytes(p, slices, k);
}

Status code_maxsim_topk_cuda(const CodeMaxSimParams& p, int k, int32_t* d_out_ids, float* d_out_scores,
                             void* d_workspace, size_t workspace_bytes, void* stream) {
    TMS_RETURN_IF_ERROR(code_impl::validate_sizes(p));
    if (k < 1 || k > kMaxTopKCuda) {
        return Status::InvalidArgument("code_maxsim_topk_cuda: k = " + std::to_string(k) + " outside [1, " +
                                       std::to_string(kMaxTopKCuda) + "]");
    }
    if (p.n_queries == 0) return Status::OK();
    if (d_out_ids == nullptr || d_out_scores == nullptr) {
        return Status::InvalidArgument("code_maxsim_topk_cuda: null output");
    }
    TMS_RETURN_IF_ERROR(code_impl::check_smem(p, k, false));
    int slices = 0;
    TMS_RETURN_IF_ERROR(code_impl::topk_slices(p, k, &slices));
    const size_t need = code_impl::topk_workspace_bytes(p, slices, k);
    if (d_workspace == nullptr || workspace_bytes < need || reinterpret_cast<uintptr_t>(d_workspace) % 256 != 0) {
        return Status::InvalidArgument("code_maxsim_topk_cuda: workspace needs " + std::to_string(need) +
                                       " bytes, 256-byte aligned; got " + std::to_string(workspace_bytes));
    }
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    TMS_RETURN_IF_ERROR(code_centroid_table_cuda(p, d_workspace, stream));
    void* partial = static_cast<char*>(d_workspace) + code_impl::partial_offset(p);
    const int sub = code_impl::sub_class(p);
    code_impl::CodeArgs a = code_impl::make_args(p, d_workspace, sub);
    a.scores = nullptr;
    a.topk_partial = static_cast<uint64_t*>(partial);
    a.k = k;
    dim3 grid;
    TMS_RETURN_IF_ERROR(
        code_impl::dispatch(sub, false, a, code_impl::smem_bytes(p, sub, k, false), p, st, /*plan_only=*/false, &grid));
    return topk_dev::merge_partials(partial, int(grid.x), p.n_queries, k, d_out_ids, d_out_scores, st);
}

bool code_maxsim_cuda_uses_wgmma(const CodeMaxSimParams& p) { return code_impl::wg_applies(p); }

Status code_maxsim_cuda_slices(const CodeMaxSimParams& p, int64_t* slices) {
    TMS_RETURN_IF_ERROR(code_impl::validate_sizes(p));
    dim3 grid;
    TMS_RETURN_IF_ERROR(code_impl::dispatch_scores(p, nullptr, nullptr, /*plan_only=*/true, &grid));
    *slices = grid.x;
    return Status::OK();
}

bool code_maxsim_cuda_built_sm90a() {
#if defined(TMS_CUDA_SM90A)
    return true;
#else
    return false;
#endif
}

Status code_maxsim_cuda_supported(int dim, int n_code_bytes) {
    CodeMaxSimParams p{};
    p.dim = dim;
    p.n_code_bytes = n_code_bytes;
    TMS_RETURN_IF_ERROR(code_impl::check_shape(p));
    return code_impl::check_smem(p, 0, false);  // the wgmma kernel is used only where it fits
}

size_t code_maxsim_cuda_workspace_bytes(const CodeMaxSimParams& p) { return align256(code_centroid_table_bytes(p)); }

Status code_maxsim_cuda(const CodeMaxSimParams& p, void* d_workspace, size_t workspace_bytes, void* stream) {
    TMS_RETURN_IF_ERROR(code_impl::validate_sizes(p));
    const size_t need = code_maxsim_cuda_workspace_bytes(p);
    if (need > 0 &&
        (d_workspace == nullptr || workspace_bytes < need || reinterpret_cast<uintptr_t>(d_workspace) % 256 != 0)) {
        return Status::InvalidArgument("code_maxsim_cuda: workspace needs " + std::to_string(need) +
                                       " bytes, 256-byte aligned; got " + std::to_string(workspace_bytes));
    }
    TMS_RETURN_IF_ERROR(code_centroid_table_cuda(p, d_workspace, stream));
    return code_maxsim_table_cuda(p, d_workspace, stream);
}

}  // namespace tms::kernels

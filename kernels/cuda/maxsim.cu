// Copyright TileMaxSim authors.
// Launcher of the TileMaxSim CUDA kernels: validate (sizes only: no device reads), choose the
// instantiation with one switch per axis (doc dtype -> split query -> query-row tile), size
// the grid from the device's occupancy, launch, check. Also the top-k merge rounds.
#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/launch_cache.h"
#include "kernels/cuda/maxsim_cuda.h"
#include "kernels/cuda/maxsim_kernel.cuh"
#include "kernels/cuda/topk_merge.h"

namespace tms::kernels {
namespace cuda_impl {

TMS_MAXSIM_FOR_EACH_INSTANCE(TMS_MAXSIM_EXTERN)

namespace {

constexpr int kMergeFanIn = 8;
constexpr int kMergeThreads = 256;
constexpr int kMaxGridY = 65535;

/// What one call runs: the instantiation's axes, shared memory, grid.
struct Plan {
    DType d_dtype = DType::kF16;
    bool split = false;
    int m_tiles = 2;
    int n_stages = 2;  // per-warp copy ring
    size_t smem = 0;
    int slices = 1;  // grid.x
    int grid_y = 1;
    bool balance = false;  // MaxSimArgs::balance
    bool tma = false;      // the TMA instantiation, reading doc_tokens through tmap
    bool pair = false;  // (TMA) its 256-byte units (MaxSimTraits::kPair: rows of a multiple of 256 bytes; fp32 at two
                        // CTAs an SM)
    bool docs_early = false;  // MaxSimArgs::docs_early
    CUtensorMap tmap{};

    /// The copy unit of the instantiation (MaxSimTraits::kStepTokens x kTileDims): 64 / m_tiles
    /// tokens x 128 bytes, or (pair) 32 / m_tiles tokens x 256 bytes.
    int unit_tokens() const { return (pair ? 32 : 64) / m_tiles; }
    int unit_dims() const { return (pair ? 256 : 128) / DTypeSize(d_dtype); }
};

/// Query rows, top-k lists (k > 0) and counts, (TMA) the stage barriers and the slack to a
/// 1024-byte boundary, then n_stages copy stages per warp, slot-major (the kernel's layout;
/// kStageBytes = (64 / m_tiles) tokens x 128 bytes).
size_t smem_bytes(int m_tiles, int terms, int dim, int k, int n_stages, bool tma) {
    size_t b = size_t(16 * m_tiles) * dim * 2 * terms;
    b += size_t(8) * k * sizeof(uint64_t) + 32;
    if (tma) b += size_t(8) * kMaxStages * sizeof(uint64_t) + 1024;
    b += size_t(8) * n_stages * (64 / m_tiles) * 128;
    return b;
}

/// p.doc_tokens as a 2-D tensor map [n_tokens, dim] for units of `rows` tokens x 128 bytes
/// (64 16-bit or 32 fp32 elements, 128-byte swizzle; columns past dim read as zeros), or (pair:
/// rows of a multiple of 256 bytes) a 3-D one [n_tokens, row / 128 bytes, 128 bytes] for units of
/// `rows` tokens x two 128-byte pieces (256 bytes: whole rows at 16-bit dim 128); false when the
/// driver has no encoder or rejects the shape. L2 promotion: a unit of 128-byte pieces has each
/// promoted to 256 bytes, which brings the next piece into L2 for the next unit; units of
/// 256-byte pieces or whole rows take none (for them promotion fetches lines no unit reads).
bool encode_doc_map(const MaxSimParams& p, int rows, bool pair, CUtensorMap* map) {
    using Encode = PFN_cuTensorMapEncodeTiled_v12000;
    static const Encode encode = [] {
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult q{};
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) !=
                cudaSuccess ||
            q != cudaDriverEntryPointSuccess) {
            (void)cudaGetLastError();
            return Encode(nullptr);
        }
        return reinterpret_cast<Encode>(fn);
    }();
    if (encode == nullptr) return false;
    const int esize = DTypeSize(p.d_dtype);
    const cuuint64_t row_bytes = cuuint64_t(p.dim) * esize;
    const cuuint32_t piece_elems = cuuint32_t(128 / esize);
    const cuuint64_t dims3[3] = {piece_elems, row_bytes / 128, cuuint64_t(p.n_tokens)};
    const cuuint64_t strides3[2] = {128, row_bytes};
    const cuuint32_t box3[3] = {piece_elems, 2, cuuint32_t(rows)};
    const cuuint64_t dims2[2] = {cuuint64_t(p.dim), cuuint64_t(p.n_tokens)};
    const cuuint64_t strides2[1] = {row_bytes};
    const cuuint32_t box2[2] = {piece_elems, cuuint32_t(rows)};
    const bool no_promotion = pair || row_bytes == 128;
    const cuuint32_t elem_strides[3] = {1, 1, 1};
    const CUtensorMapDataType type = p.d_dtype == DType::kBF16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                     : p.d_dtype == DType::kF32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                                                : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    return encode(map, type, pair ? 3 : 2, const_cast<void*>(p.doc_tokens), pair ? dims3 : dims2,
                  pair ? strides3 : strides2, pair ? box3 : box2, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_128B,
                  no_promotion ? CU_TENSOR_MAP_L2_PROMOTION_NONE : CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/// One switch per axis; every default is NotSupported.
template <typename TD, bool kSplit, bool kTma, bool kPair>
Status dispatch_mtiles(int m_tiles, bool occupancy, const MaxSimArgs& a, const CUtensorMap& tm, dim3 grid, size_t smem,
                       cudaStream_t st, int* blocks) {
    switch (m_tiles) {
        case 2:
            return occupancy ? MaxSimKernel<MaxSimTraits<TD, kSplit, 2, kTma, kPair>>::Occupancy(smem, blocks)
                             : MaxSimKernel<MaxSimTraits<TD, kSplit, 2, kTma, kPair>>::Launch(a, tm, grid, smem, st);
        case 4:
            return occupancy ? MaxSimKernel<MaxSimTraits<TD, kSplit, 4, kTma, kPair>>::Occupancy(smem, blocks)
                             : MaxSimKernel<MaxSimTraits<TD, kSplit, 4, kTma, kPair>>::Launch(a, tm, grid, smem, st);
        default: return Status::NotSupported("maxsim_cuda: query-row tile " + std::to_string(16 * m_tiles));
    }
}

template <typename TD, bool kSplit>
Status dispatch_tma(const Plan& plan, bool occupancy, const MaxSimArgs& a, dim3 grid, cudaStream_t st, int* blocks) {
    const auto go = [&](auto tma, auto pair) {
        return dispatch_mtiles<TD, kSplit, decltype(tma)::value, decltype(pair)::value>(
            plan.m_tiles, occupancy, a, plan.tmap, grid, plan.smem, st, blocks);
    };
    using False = std::false_type;
    using True = std::true_type;
    if (!plan.tma) return go(False{}, False{});
    if (plan.pair) return go(True{}, True{});
    return go(True{}, False{});
}

template <typename TD>
Status dispatch_split(const Plan& plan, bool occupancy, const MaxSimArgs& a, dim3 grid, cudaStream_t st, int* blocks) {
    switch (int(plan.split)) {
        case 0:
            if constexpr (std::is_same_v<TD, float>) {
                return Status::NotSupported("maxsim_cuda: fp32 documents always use the split query");
            } else {
                return dispatch_tma<TD, false>(plan, occupancy, a, grid, st, blocks);
            }
        case 1: return dispatch_tma<TD, true>(plan, occupancy, a, grid, st, blocks);
        default: return Status::NotSupported("maxsim_cuda: split flag");
    }
}

Status dispatch(const Plan& plan, bool occupancy, const MaxSimArgs& a, cudaStream_t st, int* blocks) {
    const dim3 grid(plan.slices, plan.grid_y);
    switch (plan.d_dtype) {
        case DType::kF16: return dispatch_split<__half>(plan, occupancy, a, grid, st, blocks);
        case DType::kBF16: return dispatch_split<__nv_bfloat16>(plan, occupancy, a, grid, st, blocks);
        case DType::kF32: return dispatch_split<float>(plan, occupancy, a, grid, st, blocks);
        default: return Status::NotSupported("maxsim_cuda: document dtype " + std::to_string(int(plan.d_dtype)));
    }
}

/// Checks that need no device memory.
Status validate_sizes(const MaxSimParams& p) {
    if (p.n_queries < 0 || p.q_stride < 0 || p.n_docs < 0) {
        return Status::InvalidArgument("maxsim_cuda: negative size");
    }
    if (p.dim % 32 != 0 || p.dim < 32 || p.dim > 1024) {
        return Status::NotSupported("maxsim_cuda: dim " + std::to_string(p.dim) +
                                    " not supported (multiples of 32 in [32, 1024])");
    }
    if (p.q_stride > 256) {
        return Status::NotSupported("maxsim_cuda: q_stride " + std::to_string(p.q_stride) + " > 256");
    }
    if (p.n_docs > INT32_MAX - 1) return Status::NotSupported("maxsim_cuda: more than 2^31 - 2 documents");
    if (int(p.q_dtype) > 2 || int(p.d_dtype) > 2) return Status::InvalidArgument("maxsim_cuda: unknown dtype");
    if (p.n_queries > 0 && p.q_stride > 0 && p.queries == nullptr) {
        return Status::InvalidArgument("maxsim_cuda: queries is null");
    }
    if (p.n_docs > 0 && p.doc_offsets == nullptr) return Status::InvalidArgument("maxsim_cuda: doc_offsets is null");
    if (p.cand_offsets != nullptr && p.n_queries > 0 && p.cand_docs == nullptr) {
        return Status::InvalidArgument("maxsim_cuda: cand_docs is null");
    }
    return Status::OK();
}

/// The plan of one call. launch: also encode the tensor map of a TMA plan (when the driver
/// refuses it, the call keeps the plan's shape and reads with per-thread copies, which need
/// less shared memory and no more registers); without, the shape only (workspace sizing).
Status make_plan(const MaxSimParams& p, int k, Plan* plan, bool launch) {
    plan->d_dtype = p.d_dtype;
    plan->split = p.d_dtype == DType::kF32 || p.q_dtype != p.d_dtype;
    const int terms = plan->split ? 2 : 1;
    launch_cache::DeviceFacts dev;
    TMS_RETURN_IF_ERROR(launch_cache::current_device(&dev));
    const int sms = dev.sms, smem_optin = dev.smem_optin, smem_sm = dev.smem_sm, smem_reserved = dev.smem_reserved;
    // Documents in a buffer of known length, 16-byte aligned, on sm_90+: bulk tensor copies.
    plan->tma = dev.cc_major >= 9 && p.n_tokens > 0 && p.n_tokens <= INT32_MAX &&
                reinterpret_cast<uintptr_t>(p.doc_tokens) % 16 == 0;
    // Rows of a multiple of 256 bytes (16-bit dim % 128 == 0, fp32 dim % 64 == 0): units of
    // 256-byte pieces (MaxSimTraits::kPair).
    plan->pair = plan->tma && p.dim * DTypeSize(p.d_dtype) % 256 == 0;
    const auto bytes = [&](int m_tiles, int stages) { return smem_bytes(m_tiles, terms, p.dim, k, stages, plan->tma); };
    plan->m_tiles = p.q_stride <= 32 ? 2 : 4;
    if (plan->m_tiles == 4 && bytes(4, 2) > size_t(smem_optin)) plan->m_tiles = 2;
    // The deepest ring (up to 6 stages) that keeps two CTAs per SM; else the deepest that fits
    // one (1: no copy ahead, for the largest dim x k x split shapes).
    plan->n_stages = 0;
    for (int st = 6; st >= 2 && plan->n_stages == 0; --st) {
        if (2 * (bytes(plan->m_tiles, st) + smem_reserved) <= size_t(smem_sm)) plan->n_stages = st;
    }
    // fp32 documents in 256-byte units load each query fragment for 16 tokens instead of 32:
    // with two CTAs an SM the other CTA hides that, with one (a large split query: fp32 dim >=
    // 384 at Nq=32) it does not, and 128-byte units are faster.
    if (plan->d_dtype == DType::kF32 && plan->n_stages == 0) plan->pair = false;
    for (int st = 6; st >= 1 && plan->n_stages == 0; --st) {
        if (bytes(plan->m_tiles, st) <= size_t(smem_optin)) plan->n_stages = st;
    }
    plan->smem = bytes(plan->m_tiles, std::max(1, plan->n_stages));
    if (plan->n_stages == 0) {
        return Status::NotSupported("maxsim_cuda: needs " + std::to_string(plan->smem) +
                                    " bytes of shared memory (dim, k too large)");
    }
    int blocks = 0;
    TMS_RETURN_IF_ERROR(dispatch(*plan, true, MaxSimArgs{}, nullptr, &blocks));
    const int64_t resident = int64_t(std::max(1, blocks)) * sms;
    const int nq = std::max(1, p.n_queries);
    int64_t slices;
    if (p.cand_offsets == nullptr) {
        // Equal work per slice: one wave. At least 8 documents per CTA.
        slices = (resident + nq - 1) / nq;
        slices = std::min<int64_t>(slices, (p.n_docs + 7) / 8);
    } else {
        // Unknown, uneven list lengths: oversubscribe so the block scheduler balances.
        slices = (4 * resident + nq - 1) / nq;
    }
    plan->slices = int(std::clamp<int64_t>(slices, 1, 1 << 20));
    plan->grid_y = std::min(nq, kMaxGridY);
    // Dense lists long enough that a search of the offsets at the start pays for itself, and
    // one query group (no block-wide barrier inside the batch loop): balance warps by tokens.
    // Not for fp32 documents, whose instantiation compiles the balanced walk out (spills).
    plan->balance = p.cand_offsets == nullptr && p.q_stride <= 16 * plan->m_tiles &&
                    p.n_docs >= int64_t(16) * 8 * plan->slices && p.d_dtype != DType::kF32;
    // Static documents, dense: the first document loads go out before the wait for the previous
    // kernel where they cannot slow it down: when the grid fills every resident slot (its CTAs
    // start as that kernel's leave, in its tail), or when they are a warp's whole work (at most
    // n_stages - 1 units: only the query rows are left after the wait). Otherwise, with the
    // previous kernel's CTAs still running beside ours, the early copies slow both down.
    if (p.docs_static && p.cand_offsets == nullptr) {
        const bool full_wave = int64_t(plan->slices) * plan->grid_y >= resident;
        bool whole = false;
        if (p.n_tokens > 0 && p.n_docs > 0) {
            const int64_t warps = int64_t(plan->slices) * 8, step = plan->unit_tokens();
            const int64_t tile_dims = plan->unit_dims();
            const int64_t per_warp = (p.n_docs + warps - 1) / warps;
            const int64_t len = (p.n_tokens + p.n_docs - 1) / p.n_docs;
            const int64_t units = per_warp * ((len + step - 1) / step) * ((p.dim + tile_dims - 1) / tile_dims);
            whole = units <= plan->n_stages - 1;
        }
        plan->docs_early = full_wave || whole;
    }
    // Last, so that a refused map changes nothing the workspace size was planned from.
    if (launch && plan->tma) {
        plan->tma = encode_doc_map(p, plan->unit_tokens(), plan->pair, &plan->tmap);
        plan->pair = plan->pair && plan->tma;
    }
    return Status::OK();
}

/// The kernel's arguments for p under plan (scores mode; top-k callers set the top-k fields).
MaxSimArgs make_args(const MaxSimParams& p, const Plan& plan) {
    MaxSimArgs a{};
    a.n_stages = plan.n_stages;
    a.balance = plan.balance ? 1 : 0;
    a.n_tokens = p.n_tokens > 0 ? p.n_tokens : 0;
    a.docs_early = plan.docs_early ? 1 : 0;

    a.queries = p.queries;
    a.q_dtype = int(p.q_dtype);
    a.n_queries = p.n_queries;
    a.q_stride = p.q_stride;
    a.dim = p.dim;
    a.query_lens = p.query_lens;
    a.doc_tokens = p.doc_tokens;
    a.doc_offsets = p.doc_offsets;
    a.n_docs = p.n_docs;
    a.cand_offsets = p.cand_offsets;
    a.cand_docs = p.cand_docs;
    a.scores = p.scores;
    a.topk_partial = nullptr;
    a.k = 0;
    return a;
}

/// Round of the top-k tree: out list j of query q merges in lists [j*8, j*8+8).
__global__ void __launch_bounds__(kMergeThreads)
    topk_merge_kernel(const uint64_t* in, int n_in, uint64_t* out, int n_out, int k, int n_queries, int32_t* out_ids,
                      float* out_scores) {
    for (int q = blockIdx.y; q < n_queries; q += gridDim.y) {
        const int j = blockIdx.x;
        const int first = j * kMergeFanIn;
        const int n_lists = min(kMergeFanIn, n_in - first);
        const uint64_t* lists = in + (int64_t(q) * n_in + first) * k;
        if (out) {
            block_merge_topk(lists, k, nullptr, n_lists, k, out + (int64_t(q) * n_out + j) * k, nullptr, nullptr);
        } else {
            block_merge_topk(lists, k, nullptr, n_lists, k, nullptr, out_ids + int64_t(q) * k,
                             out_scores + int64_t(q) * k);
        }
    }
}

}  // namespace
}  // namespace cuda_impl

using cuda_impl::Plan;

namespace {
Status maxsim_cuda_mode(const MaxSimParams& p, bool copy_only, void* stream) {
    TMS_RETURN_IF_ERROR(cuda_impl::validate_sizes(p));
    if (p.n_queries == 0) return Status::OK();
    if (p.scores == nullptr && (p.cand_offsets != nullptr || p.n_docs > 0)) {
        return Status::InvalidArgument("maxsim_cuda: scores is null");
    }
    if (p.cand_offsets == nullptr && p.n_docs == 0) return Status::OK();
    Plan plan;
    TMS_RETURN_IF_ERROR(cuda_impl::make_plan(p, 0, &plan, /*launch=*/true));
    cuda_impl::MaxSimArgs a = cuda_impl::make_args(p, plan);
    a.copy_only = copy_only ? 1 : 0;
    return cuda_impl::dispatch(plan, false, a, static_cast<cudaStream_t>(stream), nullptr);
}
}  // namespace

Status maxsim_cuda(const MaxSimParams& p, void* stream) { return maxsim_cuda_mode(p, false, stream); }

Status maxsim_cuda_copy_only(const MaxSimParams& p, void* stream) { return maxsim_cuda_mode(p, true, stream); }

namespace topk_dev {

size_t partial_bytes(int n_queries, int n_slices, int k) {
    const size_t per = size_t(n_queries) * k * sizeof(uint64_t);
    const size_t second = (size_t(n_slices) + cuda_impl::kMergeFanIn - 1) / cuda_impl::kMergeFanIn;
    return align256(per * n_slices) + align256(per * second);
}

Status merge_partials(void* d_workspace, int n_slices, int n_queries, int k, int32_t* d_out_ids, float* d_out_scores,
                      cudaStream_t stream) {
    const size_t per = size_t(n_queries) * k;
    uint64_t* buf[2];
    buf[0] = static_cast<uint64_t*>(d_workspace);
    buf[1] = reinterpret_cast<uint64_t*>(static_cast<char*>(d_workspace) + align256(per * n_slices * sizeof(uint64_t)));
    int n = n_slices, cur = 0;
    while (true) {
        const int n_out = (n + cuda_impl::kMergeFanIn - 1) / cuda_impl::kMergeFanIn;
        const dim3 grid(n_out, std::min(n_queries, cuda_impl::kMaxGridY));
        const bool last = n_out == 1;
        cuda_impl::topk_merge_kernel<<<grid, cuda_impl::kMergeThreads, 0, stream>>>(
            buf[cur], n, last ? nullptr : buf[1 - cur], n_out, k, n_queries, d_out_ids, d_out_scores);
        TMS_CUDA_CHECK_LAUNCH();
        if (last) break;
        n = n_out;
        cur = 1 - cur;
    }
    return Status::OK();
}

}  // namespace topk_dev

size_t maxsim_topk_cuda_workspace_bytes(const MaxSimParams& p, int k) {
    if (k < 1 || k > kMaxTopKCuda || p.n_queries <= 0) return 0;
    if (!cuda_impl::validate_sizes(p).ok()) return 0;
    Plan plan;
    if (!cuda_impl::make_plan(p, k, &plan, /*launch=*/false).ok()) return 0;
    return topk_dev::partial_bytes(p.n_queries, plan.slices, k);
}

Status maxsim_topk_cuda(const MaxSimParams& p, int k, int32_t* d_out_ids, float* d_out_scores, void* d_workspace,
                        size_t workspace_bytes, void* stream) {
    TMS_RETURN_IF_ERROR(cuda_impl::validate_sizes(p));
    if (k < 1 || k > kMaxTopKCuda) {
        return Status::InvalidArgument("maxsim_topk_cuda: k = " + std::to_string(k) + " outside [1, 1024]");
    }
    if (p.n_queries == 0) return Status::OK();
    if (d_out_ids == nullptr || d_out_scores == nullptr) {
        return Status::InvalidArgument("maxsim_topk_cuda: null output");
    }
    Plan plan;
    TMS_RETURN_IF_ERROR(cuda_impl::make_plan(p, k, &plan, /*launch=*/true));
    const size_t need = topk_dev::partial_bytes(p.n_queries, plan.slices, k);  // as the _workspace_bytes call
    if (d_workspace == nullptr || workspace_bytes < need || reinterpret_cast<uintptr_t>(d_workspace) % 256 != 0) {
        return Status::InvalidArgument("maxsim_topk_cuda: workspace needs " + std::to_string(need) +
                                       " bytes, 256-byte aligned; got " + std::to_string(workspace_bytes));
    }
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    cuda_impl::MaxSimArgs a = cuda_impl::make_args(p, plan);
    a.scores = nullptr;
    a.topk_partial = static_cast<uint64_t*>(d_workspace);
    a.k = k;
    TMS_RETURN_IF_ERROR(cuda_impl::dispatch(plan, false, a, st, nullptr));
    return topk_dev::merge_partials(d_workspace, plan.slices, p.n_queries, k, d_out_ids, d_out_scores, st);
}

Status cuda_free_memory(int device, int64_t* free_bytes) { return cuda_memory_info(device, free_bytes, nullptr); }

Status cuda_device_count(int* n) {
    *n = 0;
    int c = 0;
    if (cudaGetDeviceCount(&c) != cudaSuccess) {
        (void)cudaGetLastError();  // clear the non-sticky "no driver / no device" error
        return Status::OK();
    }
    *n = c;
    return Status::OK();
}

}  // namespace tms::kernels

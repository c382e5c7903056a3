// Copyright TileMaxSim authors. Launch of one compressed-kernel instantiation (host code shared
// by code_maxsim.cu and code_maxsim_wg.cu, which instantiate them), and the warpgroup-MMA
// dispatch that code_maxsim_wg.cu defines.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/code_maxsim_kernel.cuh"
#include "kernels/cuda/launch_cache.h"
#include "kernels/cuda/pdl.cuh"
#include "tilemaxsim/status.h"

namespace tms::kernels::code_impl {

constexpr int kMaxGridY = 65535;

/// What the grid is sized for: the queries and their items (dense: n_docs, the same for every
/// query; ragged: all queries' candidates together, CodeMaxSimParams::n_candidates, 0 when the
/// caller did not say).
struct GridShape {
    int64_t n_items;
    bool ragged;
    int n_queries;
};

/// Ragged scores calls with a known candidate count: slices enough that the resident CTAs work on
/// about this many queries at a time (the grid runs query by query), so that their centroid-score
/// tables (n_centroids x 64 bytes a query group) are read from L2 rather than HBM, with at least
/// kMinSliceItems candidates a slice (each CTA copies the 64 KB codebook first).
/// Top-k calls keep 4 CTAs a query in all: each slice is a partial list of k keys.
constexpr int kLiveQueries = 4;
constexpr int kMinSliceItems = 64;

/// Sizes the grid (slices x queries) of instantiation T from the device's occupancy and
/// launches it; plan_only: only the grid (*grid_out), for sizing the top-k workspace.
template <class T>
inline Status launch_as(const CodeArgs& a, size_t smem, const GridShape& gs, cudaStream_t st, bool plan_only,
                        dim3* grid_out) {
    int blocks = 0;
    TMS_RETURN_IF_ERROR(
        launch_cache::occupancy(reinterpret_cast<const void*>(code_maxsim_kernel<T>), T::kThreads, smem, &blocks));
    if (blocks == 0) return Status::NotSupported("code_maxsim_cuda: kernel does not fit on an SM");
    launch_cache::DeviceFacts dev;
    TMS_RETURN_IF_ERROR(launch_cache::current_device(&dev));
    const int64_t resident = int64_t(blocks) * dev.sms;
    const int nq = std::max(1, gs.n_queries);
    int64_t slices;
    if (!gs.ragged) {
        slices = (resident + nq - 1) / nq;
        slices = std::min<int64_t>(slices, (gs.n_items + 7) / 8);
    } else {
        slices = (4 * resident + nq - 1) / nq;
        if (!T::kTopK && gs.n_items > 0) {
            const int64_t live = (resident + kLiveQueries - 1) / kLiveQueries;
            slices = std::max(slices, std::min(live, gs.n_items / nq / kMinSliceItems));
        }
    }
    const dim3 grid(unsigned(std::clamp<int64_t>(slices, 1, 1 << 20)), unsigned(std::min(nq, kMaxGridY)));
    if (grid_out) *grid_out = grid;
    if (plan_only) return Status::OK();
    return pdl::launch_pdl(code_maxsim_kernel<T>, grid, dim3(T::kThreads), smem, st, a);
}

/// Whether decode class sub with codebook layout book has a warpgroup-MMA instantiation: every
/// class that occurs at dim 128 (each faster than its mma.sync form on Hopper).
bool wg_class(int sub, int book);

/// launch_as of the warpgroup-MMA instantiation (CodeTraits::kWg) of decode class sub and codebook
/// layout book, scores mode. Only for calls wg_applies (code_maxsim.cu) accepts: this build has
/// sm_90a code and the device is a compute capability 9.0 one.
Status launch_wg(int sub, int book, const CodeArgs& a, size_t smem, const GridShape& gs, cudaStream_t st,
                 bool plan_only, dim3* grid_out);

}  // namespace tms::kernels::code_impl

// Copyright TileMaxSim authors. The compressed kernel's warpgroup-MMA instantiations
// (CodeTraits::kWg, sm_90a; scores mode, dim 128, the decode classes of wg_class): a file of
// their own so that a 2-core build compiles them beside code_maxsim.cu.
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/code_maxsim_launch.cuh"

namespace tms::kernels::code_impl {

bool wg_class(int sub, int book) {
    switch (sub * 4 + book) {
        case 2 * 4 + kBookShared:  // 4-bit residual
        case 4 * 4 + kBookShared:  // 2-bit residual
        case 4 * 4 + kBookPaired:  // PQ-32
        case 8 * 4 + kBookPerByte:  // PQ-8 (16-dim sub-vectors)
        case 8 * 4 + kBookPaired:  // PQ-16
        case 2 * 4 + kBookPerByte:  // PQ-64 (+3-8% over mma.sync since the fp16 fold; 0.99-1.05x before)
        case 8 * 4 + kBookShared:   // 1-bit residual (+3-10%; 0.89-0.98x before)
            return true;
        default:
            return false;
    }
}

Status launch_wg(int sub, int book, const CodeArgs& a, size_t smem, int nd, bool ragged, int nq, cudaStream_t st,
                 bool plan_only, dim3* grid) {
#if defined(TMS_CUDA_SM90A)
    switch (sub * 4 + book) {
        case 2 * 4 + kBookShared:
            return launch_as<CodeTraits<2, kBookShared, false, false, true>>(a, smem, nd, ragged, nq, st, plan_only, grid);
        case 4 * 4 + kBookShared:
            return launch_as<CodeTraits<4, kBookShared, false, false, true>>(a, smem, nd, ragged, nq, st, plan_only, grid);
        case 4 * 4 + kBookPaired:
            return launch_as<CodeTraits<4, kBookPaired, false, false, true>>(a, smem, nd, ragged, nq, st, plan_only, grid);
        case 8 * 4 + kBookPerByte:
            return launch_as<CodeTraits<8, kBookPerByte, false, false, true>>(a, smem, nd, ragged, nq, st, plan_only, grid);
        case 8 * 4 + kBookPaired:
            return launch_as<CodeTraits<8, kBookPaired, false, false, true>>(a, smem, nd, ragged, nq, st, plan_only, grid);
        case 2 * 4 + kBookPerByte:
            return launch_as<CodeTraits<2, kBookPerByte, false, false, true>>(a, smem, nd, ragged, nq, st, plan_only, grid);
        case 8 * 4 + kBookShared:
            return launch_as<CodeTraits<8, kBookShared, false, false, true>>(a, smem, nd, ragged, nq, st, plan_only, grid);
        default:
            return Status::NotSupported("code_maxsim_cuda: no warpgroup-MMA kernel for decode class " +
                                        std::to_string(sub) + ", codebook mode " + std::to_string(book));
    }
#else
    return Status::NotSupported("code_maxsim_cuda: this build has no sm_90a code for the warpgroup-MMA kernel");
#endif
}

}  // namespace tms::kernels::code_impl

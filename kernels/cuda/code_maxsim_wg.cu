// Copyright TileMaxSim authors. The compressed kernel's warpgroup-MMA instantiations
// (CodeTraits::kWg, sm_90a; scores mode, dim 128, the decode classes of wg_class): a file of
// their own so that a 2-core build compiles them beside code_maxsim.cu.
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/code_maxsim_launch.cuh"

namespace tms::kernels::code_impl {

namespace {

/// f(T{}) for the warpgroup-MMA instantiation T (CodeTraits::kWg) of decode class sub and
/// codebook layout book; NotSupported when there is none. The one list of those classes:
/// wg_class and launch_wg both read it.
template <class F>
Status with_wg_traits(int sub, int book, F&& f) {
    switch (sub * 4 + book) {
        case 2 * 4 + kBookShared:  // 4-bit residual
            return f(CodeTraits<2, kBookShared, false, false, true>{});
        case 4 * 4 + kBookShared:  // 2-bit residual
            return f(CodeTraits<4, kBookShared, false, false, true>{});
        case 8 * 4 + kBookShared:  // 1-bit residual
            return f(CodeTraits<8, kBookShared, false, false, true>{});
        case 2 * 4 + kBookPaired:  // PQ-64
            return f(CodeTraits<2, kBookPaired, false, false, true>{});
        case 4 * 4 + kBookPaired:  // PQ-32
            return f(CodeTraits<4, kBookPaired, false, false, true>{});
        case 8 * 4 + kBookPaired:  // PQ-16
            return f(CodeTraits<8, kBookPaired, false, false, true>{});
        case 8 * 4 + kBookPerByte:  // PQ-8 (16-dim sub-vectors)
            return f(CodeTraits<8, kBookPerByte, false, false, true>{});
        default:
            return Status::NotSupported("code_maxsim_cuda: no warpgroup-MMA kernel for decode class " +
                                        std::to_string(sub) + ", codebook mode " + std::to_string(book));
    }
}

}  // namespace

bool wg_class(int sub, int book) {
    return with_wg_traits(sub, book, [](auto) { return Status::OK(); }).ok();
}

Status launch_wg(int sub, int book, const CodeArgs& a, size_t smem, const GridShape& gs, cudaStream_t st,
                 bool plan_only, dim3* grid) {
#if defined(TMS_CUDA_SM90A)
    return with_wg_traits(sub, book,
                          [&](auto traits) { return launch_as<decltype(traits)>(a, smem, gs, st, plan_only, grid); });
#else
    return Status::NotSupported("code_maxsim_cuda: this build has no sm_90a code for the warpgroup-MMA kernel");
#endif
}

}  // namespace tms::kernels::code_impl

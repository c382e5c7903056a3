// Copyright TileMaxSim authors. Hopper warpgroup MMA (wgmma, sm_90a) with the A operand in
// registers and B in shared memory, as the compressed kernel uses it (device code).
//
// wgmma.mma_async m64nNk16 (fp16 in, fp32 accumulators) is issued by the 4 warps of a warpgroup
// together: warp w of the group supplies rows 16w .. 16w + 15 of A in the mma.m16n8k16 A-fragment
// layout (lane g*4+t: a0 row g, k 2t..2t+1; a1 row g+8, same k; a2 / a3 the same rows, k 2t+8..
// 2t+9) and gets the same rows of D (for each n8 block j: d[4j], d[4j+1] row g, columns
// 8j+2t, 8j+2t+1; d[4j+2], d[4j+3] row g+8). The tensor cores read B (K x N) from shared memory
// through a matrix descriptor; here without swizzle, "K-major": 8 x 8 core matrices of 8 columns
// (n) x 16 bytes (8 consecutive k), 128 contiguous bytes each, core matrix (k group kg, n group
// ng) at kg * lbo + ng * sbo.
//
// Only compiled for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL); elsewhere the functions trap, and the
// host never launches a kernel that calls them (code_maxsim.cu checks the build and the device).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/async_copy.cuh"

namespace tms::kernels::wgmma {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TMS_WGMMA_DEVICE 1
#else
#define TMS_WGMMA_DEVICE 0
#endif

/// Descriptor of a no-swizzle K-major B operand at shared-memory byte address `addr` (16-byte
/// aligned): k groups `lbo` bytes apart, n groups `sbo` bytes apart.
__device__ __forceinline__ uint64_t desc_b(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    const uint64_t lo = uint64_t((addr & 0x3ffffu) >> 4) | (uint64_t((lbo & 0x3ffffu) >> 4) << 16);
    const uint64_t hi = uint64_t((sbo & 0x3ffffu) >> 4);  // base offset 0, swizzle mode 0 (none)
    return lo | (hi << 32);
}

/// Orders this thread's earlier register writes (A fragments, accumulators) before the next
/// wgmma of its warpgroup.
__device__ __forceinline__ void fence() {
#if TMS_WGMMA_DEVICE
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#else
    __trap();
#endif
}

/// Closes the group of wgmmas issued since the last commit.
__device__ __forceinline__ void commit() {
#if TMS_WGMMA_DEVICE
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}

/// Waits until at most N committed groups are pending (N = 0: all complete, accumulators
/// readable and A registers free; N = 1: all but the last).
template <int N>
__device__ __forceinline__ void wait() {
#if TMS_WGMMA_DEVICE
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}

/// Makes this thread's generic-proxy shared-memory writes (the B operand) visible to the tensor
/// cores' async-proxy reads; a barrier must follow before another warp's wgmma reads them.
__device__ __forceinline__ void fence_smem_for_async() { async_copy::fence_proxy_async_smem(); }

/// d (64 x 32 over the warpgroup, this warp's 16 rows) += A (registers a0..a3) x B (descriptor
/// with low word b_lo, high word b_hi: desc_b's halves; a caller that steps through the B
/// operand adds to the low word, which holds the address, without a 64-bit carry).
/// kAccumulate false: d = A x B (d is only written). kSite: a number distinct for each call site
/// of a kernel (an unused immediate operand), so that the compiler cannot merge two call sites into
/// one instruction fed by register moves (which ptxas then serializes).
template <int kSite, bool kAccumulate = true>
__device__ __forceinline__ void mma_m64n32k16(float (&d)[16], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b_lo, uint32_t b_hi) {
#if TMS_WGMMA_DEVICE
#define TMS_WGMMA_M64N32K16(ACC, SCALE_D)                                                                            \
    asm volatile(                                                                                                    \
        "{\n.reg .b64 desc;\nmov.b64 desc, {%20, %21};\n"                                                            \
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "                                                        \
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, desc, " SCALE_D ", 1, 1, 0;\n}" \
        : ACC(d[0]), ACC(d[1]), ACC(d[2]), ACC(d[3]), ACC(d[4]), ACC(d[5]), ACC(d[6]), ACC(d[7]), ACC(d[8]),         \
          ACC(d[9]), ACC(d[10]), ACC(d[11]), ACC(d[12]), ACC(d[13]), ACC(d[14]), ACC(d[15])                          \
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b_lo), "r"(b_hi), "n"(kSite)                                       \
        : "memory")
#define TMS_WGMMA_RW(x) "+f"(x)
#define TMS_WGMMA_WO(x) "=f"(x)
    if constexpr (kAccumulate) {
        TMS_WGMMA_M64N32K16(TMS_WGMMA_RW, "1");
    } else {
        TMS_WGMMA_M64N32K16(TMS_WGMMA_WO, "0");
    }
#undef TMS_WGMMA_WO
#undef TMS_WGMMA_RW
#undef TMS_WGMMA_M64N32K16
#else
    __trap();
#endif
}

/// An empty use of registers that an in-flight wgmma reads (its A fragments): placed after the
/// wait that ends that wgmma, it keeps the compiler from giving those registers to other values
/// before then (which would make ptxas serialize the wgmmas).
__device__ __forceinline__ void keep_until_here(const uint4 (&v)[4]) {
    asm volatile("" ::"r"(v[0].x), "r"(v[0].y), "r"(v[0].z), "r"(v[0].w), "r"(v[1].x), "r"(v[1].y), "r"(v[1].z),
                 "r"(v[1].w), "r"(v[2].x), "r"(v[2].y), "r"(v[2].z), "r"(v[2].w), "r"(v[3].x), "r"(v[3].y), "r"(v[3].z),
                 "r"(v[3].w));
}

/// Synchronises the 128 threads of warpgroup `wg` (0 or 1) of the CTA: named barrier 1 + wg
/// (immediate ids, so that the kernel reserves 3 barriers rather than all 16).
__device__ __forceinline__ void warpgroup_barrier(int wg) {
    if (wg == 0) {
        asm volatile("bar.sync 1, 128;" ::: "memory");
    } else {
        asm volatile("bar.sync 2, 128;" ::: "memory");
    }
}

}  // namespace tms::kernels::wgmma

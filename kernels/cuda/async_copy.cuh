// Copyright TileMaxSim authors. cp.async (global -> shared, no registers held) helpers shared by
// the exact and the compressed MaxSim kernels: each warp keeps a ring of stages in shared memory
// and copies the next units of its documents while it scores the current one.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tms::kernels::async_copy {

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

/// 4 bytes through L1 (cp.async.ca; 4-byte aligned).
__device__ __forceinline__ void cp4(void* dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
/// 16 bytes around L1 (cp.async.cg; 16-byte aligned).
__device__ __forceinline__ void cp16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
/// 16 bytes around L1, with a hint to fetch the whole 256-byte L2 block (streamed rows).
__device__ __forceinline__ void cp16_stream(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

/// Waits until at most n (0..7) of this thread's committed groups are still in flight.
__device__ __forceinline__ void wait_pending(int n) {
    switch (n) {
        case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
        case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
        case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
        case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
        case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
        case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
        case 6: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
        default: asm volatile("cp.async.wait_group 7;" ::: "memory"); break;
    }
}

}  // namespace tms::kernels::async_copy

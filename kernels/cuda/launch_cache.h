// Copyright TileMaxSim authors. What a kernel launch asks the runtime about the device and
// the kernel, asked once per device and remembered (host code): the device's SM count and
// shared-memory limits, a kernel's occupancy at a shared-memory size, and its raised
// dynamic shared-memory limit. A small batch is a few microseconds of GPU work; planning it
// with fresh queries each call (5 device attributes, 2 function attributes, 1 occupancy
// query) costs host time of the same order. Thread-safe; the entries of device d are used
// whenever d is the calling thread's current device. cudaDeviceReset forgets a raised limit
// and this cache does not notice (nothing in the engine resets a device).
#pragma once

#include <cstddef>

#include "tilemaxsim/status.h"

namespace tms::kernels::launch_cache {

struct DeviceFacts {
    int device = -1;
    int sms = 0;
    int smem_optin = 0;     // cudaDevAttrMaxSharedMemoryPerBlockOptin
    int smem_sm = 0;        // cudaDevAttrMaxSharedMemoryPerMultiprocessor
    int smem_reserved = 0;  // cudaDevAttrReservedSharedMemoryPerBlock
    int cc_major = 0;
    int cc_minor = 0;
};

/// The current device's facts (queried on the first call for that device).
Status current_device(DeviceFacts* facts);

/// Raises `kernel`'s dynamic shared-memory limit on the current device to at least
/// smem_bytes (a runtime call only when it grows).
Status ensure_smem(const void* kernel, size_t smem_bytes);

/// Blocks of `kernel` (`threads` a block, smem_bytes of dynamic shared memory) that fit on one
/// SM of the current device, after ensure_smem (remembered per device, kernel and size).
Status occupancy(const void* kernel, int threads, size_t smem_bytes, int* blocks_per_sm);

}  // namespace tms::kernels::launch_cache

// Copyright TileMaxSim authors. The host memory a process may still take.
#pragma once

#include <cstdint>
#include <string>

#include "tilemaxsim/status.h"

namespace tms {

/// The host memory this process may still take: MemAvailable of /proc/meminfo (without it, the
/// physical pages sysconf reports free), less where a container's memory limit (cgroup v2 or
/// v1) or the process's address-space limit (RLIMIT_AS) leaves less.
int64_t HostAvailableMemory();

/// This process's mappings, reserved or touched alike (VmSize; -1 when unknown).
int64_t MappedBytes();

/// What the process's address-space limit (RLIMIT_AS, ulimit -v) leaves above its mappings;
/// INT64_MAX without a limit.
int64_t AddressSpaceRoom();

/// ResourceExhausted, "WHAT: " first unless `what` is empty, naming the room and `need`, when the
/// address-space limit leaves less than `need` bytes for work on `threads` threads.
Status CheckAddressSpace(int64_t need, int threads, const std::string& what);

}  // namespace tms

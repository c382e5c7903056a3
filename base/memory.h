// Copyright TileMaxSim authors. The host memory a process may still take.
#pragma once

#include <cstdint>

namespace tms {

/// The host memory this process may still take: MemAvailable of /proc/meminfo (without it, the
/// physical pages sysconf reports free), less where a container's memory limit (cgroup v2 or
/// v1) or the process's address-space limit (RLIMIT_AS) leaves less.
int64_t HostAvailableMemory();

/// What the process's address-space limit (RLIMIT_AS, ulimit -v) leaves above its mappings
/// (VmSize), reserved or touched alike; INT64_MAX without a limit.
int64_t AddressSpaceRoom();

}  // namespace tms

// Copyright TileMaxSim authors.
#include "base/memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace tms {

namespace {

// The first integer in `file` (-1 when it is missing or holds none, e.g. cgroup v2's "max").
int64_t read_number(const char* file) {
    long long v = -1;
    if (std::FILE* f = std::fopen(file, "r")) {
        if (std::fscanf(f, "%lld", &v) != 1) v = -1;
        std::fclose(f);
    }
    return v;
}

// `key` of a /proc file such as "MemAvailable:" or "VmSize:", in bytes (-1 when absent).
int64_t proc_kb(const char* file, const char* key) {
    long long kb = -1;
    if (std::FILE* f = std::fopen(file, "r")) {
        char line[256];
        const size_t n = std::strlen(key);
        while (std::fgets(line, sizeof line, f)) {
            if (std::strncmp(line, key, n) == 0 && std::sscanf(line + n, "%lld", &kb) == 1) break;
        }
        std::fclose(f);
    }
    return kb < 0 ? -1 : int64_t(kb) * 1024;
}

}  // namespace

int64_t HostAvailableMemory() {
    int64_t avail = proc_kb("/proc/meminfo", "MemAvailable:");
    if (avail < 0) avail = int64_t(sysconf(_SC_AVPHYS_PAGES)) * int64_t(sysconf(_SC_PAGESIZE));
    // A container's memory limit (cgroup v2, else v1): what it leaves the processes in it.
    int64_t limit = read_number("/sys/fs/cgroup/memory.max"), used = read_number("/sys/fs/cgroup/memory.current");
    if (limit < 0) {
        limit = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
        used = read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes");
    }
    if (limit > 0 && used >= 0 && limit < (int64_t(1) << 60))
        avail = std::min(avail, std::max<int64_t>(0, limit - used));
    return std::min(avail, AddressSpaceRoom());
}

int64_t MappedBytes() { return proc_kb("/proc/self/status", "VmSize:"); }

int64_t AddressSpaceRoom() {
    struct rlimit as {};
    if (::getrlimit(RLIMIT_AS, &as) != 0 || as.rlim_cur == RLIM_INFINITY) return INT64_MAX;
    const int64_t mapped = MappedBytes();
    return mapped < 0 ? INT64_MAX : std::max<int64_t>(0, int64_t(as.rlim_cur) - mapped);
}

Status CheckAddressSpace(int64_t need, int threads, const std::string& what) {
    const int64_t room = AddressSpaceRoom();
    if (room >= need) return Status::OK();
    const auto mib = [](int64_t b) { return std::to_string(b >> 20) + " MiB"; };
    return Status::ResourceExhausted((what.empty() ? "" : what + ": ") +
                                     "the process's address-space limit (ulimit -v) leaves " + mib(room) + "; " +
                                     std::to_string(threads) + " threads need " + mib(need) +
                                     " (raise the limit, or fewer threads: OMP_NUM_THREADS)");
}

}  // namespace tms

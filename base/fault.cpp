// Copyright TileMaxSim authors.
#include "base/fault.h"

#include <atomic>
#include <map>
#include <mutex>
#include <string>

namespace tms::fault {
namespace {

std::atomic<int> g_armed{0};  // points armed: the fast path's test
std::mutex g_mu;
std::map<std::string, int>& points() {
    static std::map<std::string, int> m;
    return m;
}

}  // namespace

bool Fire(const char* name) {
    if (g_armed.load(std::memory_order_relaxed) == 0) return false;
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = points().find(name);
    if (it == points().end()) return false;
    if (--it->second == 0) {
        points().erase(it);
        --g_armed;
    }
    return true;
}

void Arm(const char* name, int times) {
    std::lock_guard<std::mutex> lock(g_mu);
    const bool was = points().erase(name) > 0;
    if (was) --g_armed;
    if (times > 0) {
        points()[name] = times;
        ++g_armed;
    }
}

}  // namespace tms::fault

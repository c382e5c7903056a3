// Copyright TileMaxSim authors. The first failure among work spread over threads.
#pragma once

#include <atomic>
#include <mutex>
#include <utility>

#include "tilemaxsim/status.h"

namespace tms {

/// Keeps the first non-OK status that any thread reports; the others stop early by checking
/// failed(). Thread-safe.
class FirstError {
public:
    void Set(Status st) {
        if (st.ok()) return;
        std::lock_guard<std::mutex> g(mu_);
        if (!failed_.exchange(true)) std::swap(first_, st);
    }
    bool failed() const { return failed_.load(std::memory_order_acquire); }
    /// The first failure, or OK; read once the threads have finished.
    Status status() const { return first_; }

private:
    std::mutex mu_;
    std::atomic<bool> failed_{false};
    Status first_;
};

}  // namespace tms

// Copyright TileMaxSim authors. The server's workers: a fixed set of threads and a bounded queue.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tms::server {

/// Runs posted tasks on `threads` threads. At most `queue_max` tasks wait: TryPost refuses the
/// next one at once (the server answers 503), so an overload never becomes an unbounded backlog.
class WorkerPool {
public:
    WorkerPool(int threads, int queue_max);
    ~WorkerPool();  ///< Stop()
    WorkerPool(const WorkerPool&) = delete;
    WorkerPool& operator=(const WorkerPool&) = delete;

    /// Queues `task`; false (and `task` not run) when queue_max tasks are waiting or after Stop.
    bool TryPost(std::function<void()> task);
    /// Tasks waiting, and tasks running.
    int queued() const;
    int running() const;
    /// Refuses new tasks, runs those queued, joins the threads.
    void Stop();

private:
    void Loop();
    const size_t queue_max_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> queue_;
    int running_ = 0;
    bool stopping_ = false;
    std::vector<std::thread> threads_;
};

}  // namespace tms::server

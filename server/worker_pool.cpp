// Copyright TileMaxSim authors.
#include "server/worker_pool.h"

namespace tms::server {

WorkerPool::WorkerPool(int threads, int queue_max) : queue_max_(size_t(queue_max > 0 ? queue_max : 0)) {
    for (int i = 0; i < (threads > 0 ? threads : 1); ++i) threads_.emplace_back([this] { Loop(); });
}

WorkerPool::~WorkerPool() { Stop(); }

bool WorkerPool::TryPost(std::function<void()> task) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (stopping_ || queue_.size() >= queue_max_) return false;
        queue_.push_back(std::move(task));
    }
    cv_.notify_one();
    return true;
}

int WorkerPool::queued() const {
    std::lock_guard<std::mutex> lk(mu_);
    return int(queue_.size());
}

int WorkerPool::running() const {
    std::lock_guard<std::mutex> lk(mu_);
    return running_;
}

void WorkerPool::Stop() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (stopping_ && threads_.empty()) return;
        stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
}

void WorkerPool::Loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
        cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and everything queued has run
        std::function<void()> task = std::move(queue_.front());
        queue_.pop_front();
        ++running_;
        lk.unlock();
        task();
        lk.lock();
        --running_;
    }
}

}  // namespace tms::server

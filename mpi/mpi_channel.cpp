// Copyright TileMaxSim authors. The MPI plumbing of the distributed search and build: bounded
// waits on non-blocking collectives, and agreement on every rank's status.
#include "mpi/mpi_channel.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

namespace tms::mpi {

using Clock = std::chrono::steady_clock;

Channel::Channel(MPI_Comm comm, double timeout_s) : timeout_s_(timeout_s) {
    MPI_Comm_dup(comm, &comm_);  // our messages never meet the application's
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
}

Channel::~Channel() { MPI_Comm_free(&comm_); }

Status Channel::Broadcast(std::string* bytes) {
    int64_t n = rank_ == 0 ? int64_t(bytes->size()) : 0;
    MPI_Request r;
    MPI_Ibcast(&n, 1, MPI_INT64_T, 0, comm_, &r);
    Wait(&r, "broadcasting from rank 0");
    if (n > INT32_MAX) return Status::ResourceExhausted("a broadcast of more than 2 GB");
    bytes->resize(size_t(n));
    MPI_Ibcast(bytes->data(), int(n), MPI_CHAR, 0, comm_, &r);
    Wait(&r, "broadcasting from rank 0");
    return Status::OK();
}

void Channel::Wait(MPI_Request* req, const char* what) {
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration<double>(timeout_s_);
    // Non-blocking collectives progress only inside MPI_Test: poll (yielding the core) for the
    // first 20 ms, which moves a message of megabytes through its many pipeline steps at full
    // speed, and only then sleep between polls (a rank waiting for a slower one).
    const auto poll_until = start + std::chrono::milliseconds(20);
    for (int spins = 0;; ++spins) {
        int done = 0;
        MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (done) return;
        if (Clock::now() > deadline) {
            std::fprintf(stderr,
                         "tms: rank %d: %s: no answer from the other ranks within %g s (a rank died or hangs); "
                         "ending the job\n",
                         rank_, what, timeout_s_);
            std::fflush(stderr);
            MPI_Abort(comm_, 1);
        }
        if (spins % 64 == 63 && Clock::now() > poll_until) {
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        } else {
            std::this_thread::yield();
        }
    }
}

Status Channel::Gather(const std::string& mine, std::vector<std::string>* all) {
    if (mine.size() > size_t(INT32_MAX)) return Status::ResourceExhausted("a rank's message over 2 GB");
    int len = int(mine.size());
    // Every rank learns every length, so that all of them see whether the whole fits in 2 GB.
    std::vector<int> lens(size_t(size_), 0), displs(size_t(size_), 0);
    MPI_Request r;
    MPI_Iallgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_, &r);
    Wait(&r, "gathering from every rank");
    int64_t total = 0;
    for (int i = 0; i < size_; ++i) {
        displs[size_t(i)] = int(std::min<int64_t>(total, INT32_MAX));
        total += lens[size_t(i)];
    }
    const bool fits = total <= INT32_MAX;
    if (!fits) return Status::ResourceExhausted("the ranks' messages to rank 0 are over 2 GB in all");
    std::string buf(rank_ == 0 ? size_t(total) : 0, '\0');
    MPI_Igatherv(mine.data(), len, MPI_CHAR, buf.data(), lens.data(), displs.data(), MPI_CHAR, 0, comm_, &r);
    Wait(&r, "gathering from every rank");
    all->clear();
    if (rank_ != 0) return Status::OK();
    for (int i = 0; i < size_; ++i) all->push_back(buf.substr(size_t(displs[size_t(i)]), size_t(lens[size_t(i)])));
    return Status::OK();
}

void Channel::AllReduce(int64_t* v, int n, MPI_Op op, const char* what) {
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, v, n, MPI_INT64_T, op, comm_, &r);
    Wait(&r, what);
}

Status Channel::Agree(const Status& mine) {
    // Each rank sends its code (one byte) and message; empty: ok.
    const std::string msg = mine.ok() ? std::string() : char(int(mine.code())) + mine.message();
    std::vector<std::string> all;
    Status verdict = Gather(msg, &all);
    // Rank 0 words the verdict: the failed ranks and their messages, in rank order, with the
    // first one's code.
    if (rank_ == 0 && verdict.ok()) {
        std::string text;
        Status::Code code = Status::Code::kOk;
        for (int i = 0; i < size_; ++i) {
            const std::string& m = all[size_t(i)];
            if (m.empty()) continue;
            if (code == Status::Code::kOk) code = Status::Code(int(m[0]));
            text += (text.empty() ? "" : "; ") + std::string("rank ") + std::to_string(i) + ": " + m.substr(1);
        }
        if (code != Status::Code::kOk) verdict = Status(code, text);
    }
    return ShareRoot(verdict);
}

Status Channel::ShareRoot(const Status& st) {
    std::string msg = st.message();
    int64_t head[2] = {int64_t(st.code()), int64_t(msg.size())};
    MPI_Request r;
    MPI_Ibcast(head, 2, MPI_INT64_T, 0, comm_, &r);
    Wait(&r, "broadcasting the outcome");
    msg.resize(size_t(head[1]));
    MPI_Ibcast(msg.data(), int(head[1]), MPI_CHAR, 0, comm_, &r);
    Wait(&r, "broadcasting the outcome");
    return head[0] == 0 ? Status::OK() : Status(Status::Code(head[0]), msg);
}

}  // namespace tms::mpi

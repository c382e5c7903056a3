// Copyright TileMaxSim authors. The MPI plumbing of the distributed search and build: bounded
// waits on non-blocking collectives, and agreement on every rank's status.
#include "dist/mpi_channel.h"

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

namespace tms::dist {

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
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
    for (int spins = 0;; ++spins) {
        int done = 0;
        MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (done) return;
        if (Clock::now() > deadline) {
            std::fprintf(stderr, "tms: rank %d: %s: no answer from the other ranks within %g s (a rank died or hangs); "
                         "ending the job\n", rank_, what, timeout_s_);
            std::fflush(stderr);
            MPI_Abort(comm_, 1);
        }
        if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

Status Channel::Agree(const Status& mine) {
    // Each rank sends its code (one byte) and message; empty: ok.
    const std::string msg = mine.ok() ? std::string() : char(int(mine.code())) + mine.message();
    int len = int(msg.size());
    std::vector<int> lens(size_t(size_), 0);
    MPI_Request r;
    MPI_Igather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, comm_, &r);
    Wait(&r, "gathering each rank's status");
    std::vector<int> displs(size_t(size_), 0);
    for (int i = 1; i < size_; ++i) displs[size_t(i)] = displs[size_t(i - 1)] + lens[size_t(i - 1)];
    std::string all(rank_ == 0 ? size_t(displs.back() + lens.back()) : 0, '\0');
    MPI_Igatherv(msg.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0, comm_, &r);
    Wait(&r, "gathering each rank's status");
    // Rank 0 words the verdict: the failed ranks and their messages, in rank order, with the
    // first one's code.
    Status verdict;
    if (rank_ == 0) {
        std::string text;
        Status::Code code = Status::Code::kOk;
        for (int i = 0; i < size_; ++i) {
            if (lens[size_t(i)] == 0) continue;
            const std::string m = all.substr(size_t(displs[size_t(i)]), size_t(lens[size_t(i)]));
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

}  // namespace tms::dist

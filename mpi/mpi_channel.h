// Copyright TileMaxSim authors. The MPI plumbing of the distributed search and build.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "tilemaxsim/status.h"

namespace tms::mpi {

/// A duplicate of a communicator whose every wait has a deadline: a rank that stops answering
/// ends the job (MPI_Abort) with a message naming what did not arrive. Every call collective.
class Channel {
public:
    Channel(MPI_Comm comm, double timeout_s);
    ~Channel();
    Channel(const Channel&) = delete;
    Channel& operator=(const Channel&) = delete;
    MPI_Comm comm() const { return comm_; }
    int rank() const { return rank_; }
    int size() const { return size_; }
    /// Waits for `req` at most timeout_s; past it, aborts the job naming `what`.
    void Wait(MPI_Request* req, const char* what);
    /// OK when every rank's `mine` is; else, on every rank, the failed ranks' messages (in
    /// rank order, with the first one's code).
    Status Agree(const Status& mine);
    /// Rank 0's `st` on every rank.
    Status ShareRoot(const Status& st);
    /// Rank 0's bytes on every rank.
    Status Broadcast(std::string* bytes);
    /// Every rank's bytes on rank 0, in rank order (*all is empty elsewhere).
    Status Gather(const std::string& mine, std::vector<std::string>* all);
    /// v[0 .. n) reduced by `op` over every rank, on every rank.
    void AllReduce(int64_t* v, int n, MPI_Op op, const char* what);

private:
    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = 0, size_ = 1;
    double timeout_s_;
};

}  // namespace tms::mpi

// Copyright TileMaxSim authors. Progress bars on a terminal (stderr), silent otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace tms {

/// Prints "\r<label> [=====>    ]  45%  1.2M/s  ETA 3s" to stderr at most 10 times a second,
/// only when enabled and stderr is a terminal. Thread-compatible (call from one thread).
class Progress {
public:
    Progress(std::string label, int64_t total, bool enabled, std::string unit = "");
    ~Progress();
    void Add(int64_t n);
    void Done();

private:
    void Print(bool final);
    std::string label_, unit_;
    int64_t total_, done_ = 0;
    bool enabled_, finished_ = false;
    std::chrono::steady_clock::time_point start_, last_;
};

/// With TMS_TRACE_LOAD set in the environment: "load <phase>: <seconds>" on stderr at each
/// Mark (time since the previous one). A developer diagnostic of index loading; silent otherwise.
class PhaseTrace {
public:
    PhaseTrace();
    void Mark(const char* phase);

private:
    bool on_;
    std::chrono::steady_clock::time_point last_;
};

/// True when stderr is a terminal.
bool StderrIsTerminal();

}  // namespace tms

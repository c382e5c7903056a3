// Copyright TileMaxSim authors. Progress bars on a terminal (stderr), timers and traces.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace tms {

/// Prints "\r<label> [=====>    ]  45%  1.2M/s  ETA 3s" to stderr at most 10 times a second,
/// only when enabled, stderr is a terminal and the log level is info or debug. Thread-compatible
/// (call from one thread).
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

/// Seconds since `t0` on the steady clock.
inline double SecondsSince(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// A developer diagnostic: with the environment variable `env` set, each Mark prints
/// "<prefix> <phase>: <time since the previous Mark>" on stderr, in seconds or milliseconds;
/// silent (and free) otherwise. TMS_TRACE_LOAD times index loading and build ends ("load ...",
/// seconds), TMS_TRACE_SEARCH the steps of a search batch ("search ...", "candidates ...", ms).
class Trace {
public:
    enum class Unit { kSeconds, kMilliseconds };
    Trace(const char* env, const char* prefix, Unit unit);
    bool on() const { return on_; }
    void Mark(const char* phase);

private:
    bool on_;
    const char* prefix_;
    Unit unit_;
    std::chrono::steady_clock::time_point last_;
};

/// The load trace (TMS_TRACE_LOAD, "load <phase>: <seconds> s").
inline Trace LoadTrace() { return Trace("TMS_TRACE_LOAD", "load", Trace::Unit::kSeconds); }

/// True when stderr is a terminal.
bool StderrIsTerminal();

}  // namespace tms

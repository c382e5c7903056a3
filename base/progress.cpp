// Copyright TileMaxSim authors.
#include "base/progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "base/log.h"

namespace tms {

bool StderrIsTerminal() { return isatty(STDERR_FILENO) == 1; }

Progress::Progress(std::string label, int64_t total, bool enabled, std::string unit)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      enabled_(enabled && StderrIsTerminal() && LogEnabled(LogLevel::kInfo)) {
    start_ = last_ = std::chrono::steady_clock::now();
}

Progress::~Progress() { Done(); }

void Progress::Add(int64_t n) {
    done_ += n;
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    Print(false);
}

void Progress::Done() {
    if (finished_) return;
    finished_ = true;
    if (enabled_) Print(true);
}

namespace {
std::string human(double v) {
    char buf[32];
    if (v >= 1e9)
        std::snprintf(buf, sizeof buf, "%.1fG", v / 1e9);
    else if (v >= 1e6)
        std::snprintf(buf, sizeof buf, "%.1fM", v / 1e6);
    else if (v >= 1e3)
        std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
    else if (v >= 100)
        std::snprintf(buf, sizeof buf, "%.0f", v);
    else
        std::snprintf(buf, sizeof buf, v >= 10 ? "%.1f" : "%.2f", v);  // k-means: under 1 it/s
    return buf;
}
}  // namespace

void Progress::Print(bool final) {
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double frac = total_ > 0 ? std::min(1.0, double(done_) / double(total_)) : 1.0;
    const int width = 30, filled = static_cast<int>(frac * width);
    std::string bar(filled, '=');
    if (filled < width) bar += '>' + std::string(width - filled - 1, ' ');
    const double rate = secs > 0 ? done_ / secs : 0;
    std::string eta = final ? human(secs) + "s" : (rate > 0 ? "ETA " + human((total_ - done_) / rate) + "s" : "");
    std::fprintf(stderr, "\r%-18s [%s] %3d%%  %s%s/s  %-12s", label_.c_str(), bar.c_str(), int(frac * 100),
                 human(rate).c_str(), unit_.c_str(), eta.c_str());
    if (final) std::fputc('\n', stderr);
    std::fflush(stderr);
}

Trace::Trace(const char* env, const char* prefix, Unit unit)
    : on_(std::getenv(env) != nullptr), prefix_(prefix), unit_(unit), last_(std::chrono::steady_clock::now()) {}

void Trace::Mark(const char* phase) {
    if (!on_) return;
    const double s = SecondsSince(last_);
    if (unit_ == Unit::kSeconds)
        std::fprintf(stderr, "%s %s: %.3f s\n", prefix_, phase, s);
    else
        std::fprintf(stderr, "%s %s: %.3f ms\n", prefix_, phase, s * 1e3);
    last_ = std::chrono::steady_clock::now();
}

}  // namespace tms

// Copyright TileMaxSim authors.
#include "base/log.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace tms {
namespace {

LogLevel from_environment() {
    LogLevel level = LogLevel::kInfo;
    if (const char* e = std::getenv("TMS_LOG_LEVEL"); e != nullptr && *e != '\0') {
        if (!ParseLogLevel(e, &level).ok()) {
            std::fprintf(stderr, "tilemaxsim: TMS_LOG_LEVEL=%s is not error, warning, info or debug: info\n", e);
        }
    }
    return level;
}

std::atomic<int>& level_store() {
    static std::atomic<int> level{int(from_environment())};
    return level;
}

}  // namespace

void SetLogLevel(LogLevel level) { level_store().store(int(level), std::memory_order_relaxed); }

LogLevel GetLogLevel() { return LogLevel(level_store().load(std::memory_order_relaxed)); }

Status ParseLogLevel(const std::string& name, LogLevel* out) {
    if (name == "error")
        *out = LogLevel::kError;
    else if (name == "warning" || name == "warn")
        *out = LogLevel::kWarning;
    else if (name == "info")
        *out = LogLevel::kInfo;
    else if (name == "debug")
        *out = LogLevel::kDebug;
    else
        return Status::InvalidArgument("log level must be error, warning, info or debug, got '" + name + "'");
    return Status::OK();
}

bool LogEnabled(LogLevel level) { return int(level) <= level_store().load(std::memory_order_relaxed); }

#define TMS_VLOG(level)                      \
    do {                                     \
        if (!LogEnabled(level)) return;      \
        va_list args;                        \
        va_start(args, format);              \
        std::vfprintf(stderr, format, args); \
        va_end(args);                        \
    } while (0)

void Logf(LogLevel level, const char* format, ...) { TMS_VLOG(level); }
void LogInfo(const char* format, ...) { TMS_VLOG(LogLevel::kInfo); }
void LogWarning(const char* format, ...) { TMS_VLOG(LogLevel::kWarning); }

}  // namespace tms

// Copyright TileMaxSim authors. How much the engine (and `tms`) prints on stderr.
#pragma once

#include <string>

#include "tilemaxsim/status.h"

namespace tms {

/// What is printed on stderr. Failures always reach the caller as a Status (and `tms` prints them
/// at every level); kWarning adds what the engine recovered from or ignored (a leftover of an
/// interrupted build removed, ids not in the index); kInfo (the default) adds summaries and,
/// on a terminal, progress bars; kDebug adds where the time went (a build's phases).
enum class LogLevel { kError = 0, kWarning = 1, kInfo = 2, kDebug = 3 };

/// Process-wide. Initially the environment's TMS_LOG_LEVEL (error, warning, info, debug), else kInfo.
void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
/// "error", "warning" (or "warn"), "info", "debug"; InvalidArgument naming the choices otherwise.
Status ParseLogLevel(const std::string& name, LogLevel* out);

}  // namespace tms

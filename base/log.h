// Copyright TileMaxSim authors. Messages on stderr by level (tilemaxsim/log.h sets the level).
#pragma once

#include "tilemaxsim/log.h"

namespace tms {

/// True when messages of `level` are printed.
bool LogEnabled(LogLevel level);

/// printf to stderr when `level` is enabled (one message a call; the caller ends it with '\n').
void Logf(LogLevel level, const char* format, ...) __attribute__((format(printf, 2, 3)));
/// Logf at kInfo (summaries) and kWarning (what was recovered from or ignored).
void LogInfo(const char* format, ...) __attribute__((format(printf, 1, 2)));
void LogWarning(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace tms

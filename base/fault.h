// Copyright TileMaxSim authors. Named fault points for tests: a test arms a point for its next
// n hits; code at the point then fails as the real fault would (for example a GPU allocation
// that cannot succeed), so that the error path itself is exercised. Disarmed, a hit costs one
// relaxed atomic load.
#pragma once

namespace tms::fault {

/// Whether the point `name` fires now (armed: counts one of its hits down). Thread-safe.
bool Fire(const char* name);

/// Arms `name` for its next `times` hits (0 disarms it). For tests.
void Arm(const char* name, int times);

}  // namespace tms::fault

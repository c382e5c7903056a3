// Copyright TileMaxSim authors. Must not compile: index/ may not include engine/ (the module
// boundary test builds this with tms_index's include roots and expects the include to fail).
#include "engine/backend.h"

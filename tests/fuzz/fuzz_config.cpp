// Copyright TileMaxSim authors. Build presets (configs/*.json).
#include <string>

#include "tilemaxsim/options.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    tms::IndexBuildOptions o;
    (void)tms::ParseBuildOptionsJson(std::string(reinterpret_cast<const char*>(data), size), &o);
    return 0;
}

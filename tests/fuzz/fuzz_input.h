// Copyright TileMaxSim authors. libFuzzer targets of the input parsers: each input is written
// to a file (the parsers read files, as `tms` does) and parsed; any crash, sanitizer report or
// hang is a finding. Built by scripts/fuzz.sh (clang, -DTMS_FUZZ=ON).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace tms::fuzz {

/// The input as a file named `name` in the fuzzer's scratch directory ($TMPDIR or /tmp).
inline std::string AsFile(const uint8_t* data, size_t size, const std::string& name) {
    const char* tmp = std::getenv("TMPDIR");
    const std::string path = std::string(tmp ? tmp : "/tmp") + "/tms-fuzz-" + std::to_string(::getpid()) + "-" + name;
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f) {
        if (size) std::fwrite(data, 1, size, f);
        std::fclose(f);
    }
    return path;
}

}  // namespace tms::fuzz

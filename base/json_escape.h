// Copyright TileMaxSim authors. A string as the inside of a JSON string literal (host-only
// header: the evaluation's reports and the benchmarks' "command" fields).
#pragma once

#include <cstdio>
#include <string>

namespace tms {

/// s with '"' and '\' escaped and control characters as \u00XX.
inline std::string json_escape(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (static_cast<unsigned char>(c) < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
            out += buf;
        } else {
            out += c;
        }
    }
    return out;
}

}  // namespace tms

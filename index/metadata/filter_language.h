// Copyright TileMaxSim authors. The filter language: its keywords, functions and limits.
#pragma once

#include <cstddef>

namespace tms::index {

inline constexpr size_t kMaxFilterChars = 100000;
inline constexpr int kMaxFilterParams = 10000;

inline const char* const kFilterKeywords[] = {"AND",  "OR",   "NOT",     "IN",     "IS",   "NULL",
                                              "LIKE", "GLOB", "BETWEEN", "ESCAPE", "TRUE", "FALSE"};
inline const char* const kFilterFunctions[] = {"abs",    "coalesce", "ifnull", "instr",  "json_extract",
                                               "length", "lower",    "round",  "substr", "upper"};

}  // namespace tms::index

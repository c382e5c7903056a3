// Copyright TileMaxSim authors. The filter language's string functions with bounded cost: LIKE,
// GLOB and instr() as SQLite defines them, but never slower than linear in the text per
// pattern character and interruptible by a deadline. SQLite's own LIKE takes O(text x pattern)
// steps with no way to stop it (44 s for one 10 MB value and a 2,000-character pattern), and a
// progress handler only runs between virtual-machine steps. Internal (not installed).
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

struct sqlite3;

namespace tms::index {

/// A point in time a filter's evaluation must not pass; checked every few thousand steps.
struct FilterDeadline {
    std::chrono::steady_clock::time_point at = std::chrono::steady_clock::time_point::max();
    bool passed = false;  ///< set once a check found `at` behind
    bool Check() {
        if (!passed && std::chrono::steady_clock::now() >= at) passed = true;
        return passed;
    }
};

/// The result of a match: the text matches, does not, or the deadline passed first.
enum class Match : uint8_t { kNo, kYes, kTimedOut };

/// SQLite's `text LIKE pattern [ESCAPE esc]` (esc 0: none; case folded for ASCII only, as
/// SQLite does by default) or, with `glob`, `text GLOB pattern` (case-sensitive, * ? and
/// [...] classes). Both compare UTF-8 characters; an invalid byte is a character of its own.
Match WildcardMatch(std::string_view pattern, std::string_view text, bool glob, uint32_t esc, FilterDeadline* d);

/// Registers like() (2 and 3 arguments), glob() and instr() on `db`, replacing SQLite's: they
/// read *deadline at each call (and set its `passed` when they stop for it). No statement of
/// `db` may be active (SQLite refuses then); false on failure (sqlite3_errmsg says why).
bool RegisterFilterFunctions(sqlite3* db, FilterDeadline* deadline);

}  // namespace tms::index

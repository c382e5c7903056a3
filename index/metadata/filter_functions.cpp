// Copyright TileMaxSim authors. LIKE, GLOB and instr() for filters, with bounded cost.
#include "index/metadata/filter_functions.h"

#include <sqlite3.h>

#include <cstring>
#include <string_view>
#include <tuple>

namespace tms::index {
namespace {

constexpr size_t kNone = std::string_view::npos;

// The UTF-8 character at s[*i] (SQLite's lenient reading: a lead byte takes every continuation
// byte after it; a stray byte is a character of its own); *i moves past it.
uint32_t next_char(std::string_view s, size_t* i) {
    uint32_t c = static_cast<unsigned char>(s[(*i)++]);
    if (c < 0xc0) return c;
    c &= c >= 0xf0 ? 0x07 : c >= 0xe0 ? 0x0f : 0x1f;
    while (*i < s.size() && (static_cast<unsigned char>(s[*i]) & 0xc0) == 0x80) {
        c = (c << 6) | (static_cast<unsigned char>(s[(*i)++]) & 0x3f);
    }
    return c;
}

uint32_t fold(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c; }

// A GLOB class "[...]" whose '[' ends at pattern[*p]: whether `c` is in it; *p moves past the
// closing ']'. False with *p = kNone when the class is not closed (it matches nothing).
bool class_match(std::string_view pattern, size_t* p, uint32_t c) {
    size_t i = *p;
    const auto more = [&] { return i < pattern.size(); };
    if (!more()) return *p = kNone, false;
    bool invert = false, seen = false;
    uint32_t c2 = next_char(pattern, &i), prior = 0;
    if (c2 == '^') {
        invert = true;
        if (!more()) return *p = kNone, false;
        c2 = next_char(pattern, &i);
    }
    if (c2 == ']') {
        seen = c == ']';
        if (!more()) return *p = kNone, false;
        c2 = next_char(pattern, &i);
    }
    while (c2 != ']') {
        if (c2 == '-' && more() && pattern[i] != ']' && prior > 0) {
            c2 = next_char(pattern, &i);
            seen = seen || (c >= prior && c <= c2);
            prior = 0;
        } else {
            seen = seen || c == c2;
            prior = c2;
        }
        if (!more()) return *p = kNone, false;
        c2 = next_char(pattern, &i);
    }
    *p = i;
    return seen != invert;
}

std::string_view arg_text(sqlite3_value* v) {
    const char* s = reinterpret_cast<const char*>(sqlite3_value_text(v));
    return s ? std::string_view(s) : std::string_view();  // as SQLite's: up to the first NUL
}

// like(pattern, text[, escape]) and glob(pattern, text).
void match_fn(sqlite3_context* ctx, int argc, sqlite3_value** argv, bool glob) {
    for (int a = 0; a < argc; ++a)
        if (sqlite3_value_type(argv[a]) == SQLITE_NULL) return;  // NULL
    uint32_t esc = 0;
    if (argc == 3) {
        const std::string_view e = arg_text(argv[2]);
        size_t i = 0;
        if (!e.empty()) esc = next_char(e, &i);
        if (e.empty() || i != e.size()) {
            sqlite3_result_error(ctx, "ESCAPE expression must be a single character", -1);
            return;
        }
    }
    auto* d = static_cast<FilterDeadline*>(sqlite3_user_data(ctx));
    const Match m = WildcardMatch(arg_text(argv[0]), arg_text(argv[1]), glob, esc, d);
    if (m == Match::kTimedOut) {
        sqlite3_result_error(ctx, "the filter's time limit passed", -1);
        return;
    }
    sqlite3_result_int(ctx, m == Match::kYes);
}

// instr(haystack, needle): the 1-based position of the first needle (characters for text,
// bytes when both are blobs), 0 when absent, NULL with a NULL argument. A linear search.
void instr_fn(sqlite3_context* ctx, int, sqlite3_value** argv) {
    const int th = sqlite3_value_type(argv[0]), tn = sqlite3_value_type(argv[1]);
    if (th == SQLITE_NULL || tn == SQLITE_NULL) return;
    const bool blobs = th == SQLITE_BLOB && tn == SQLITE_BLOB;
    const auto view = [&](sqlite3_value* v) {
        const void* p = blobs ? sqlite3_value_blob(v) : static_cast<const void*>(sqlite3_value_text(v));
        return std::string_view(static_cast<const char*>(p), p ? size_t(sqlite3_value_bytes(v)) : 0);
    };
    const std::string_view h = view(argv[0]), n = view(argv[1]);
    if (n.empty()) return sqlite3_result_int64(ctx, 1);
    size_t at = 0;
    for (;;) {
        const void* f = ::memmem(h.data() + at, h.size() - at, n.data(), n.size());
        if (!f) return sqlite3_result_int64(ctx, 0);
        at = size_t(static_cast<const char*>(f) - h.data());
        // Text positions count characters, and only character starts are tried (as SQLite).
        if (blobs || (static_cast<unsigned char>(h[at]) & 0xc0) != 0x80) break;
        ++at;
    }
    int64_t pos = 1;
    if (blobs) {
        pos += int64_t(at);
    } else {
        for (size_t i = 0; i < at; ++i) pos += (static_cast<unsigned char>(h[i]) & 0xc0) != 0x80;
    }
    sqlite3_result_int64(ctx, pos);
}

}  // namespace

Match WildcardMatch(std::string_view pattern, std::string_view text, bool glob, uint32_t esc, FilterDeadline* d) {
    // The classic single-backtrack matcher: on a mismatch the last star absorbs one more
    // character of the text and matching resumes after it. Stars match any sequence, so no
    // earlier star needs revisiting: at most text x pattern steps, none of them recursive.
    const uint32_t star = glob ? '*' : '%', one = glob ? '?' : '_';
    size_t p = 0, t = 0, star_p = kNone, star_t = 0;
    for (uint64_t steps = 1;; ++steps) {
        if ((steps & 4095) == 0 && d != nullptr && d->Check()) return Match::kTimedOut;
        if (p < pattern.size()) {
            size_t pe = p;
            const uint32_t pc = next_char(pattern, &pe);
            if (pc == star) {
                star_p = p = pe;
                star_t = t;
                continue;
            }
            if (t < text.size()) {
                size_t te = t;
                const uint32_t tc = next_char(text, &te);
                bool ok;
                if (!glob && esc != 0 && pc == esc) {  // the next pattern character, literally
                    if (pe >= pattern.size()) return Match::kNo;
                    ok = fold(next_char(pattern, &pe)) == fold(tc);
                } else if (pc == one) {
                    ok = true;
                } else if (glob && pc == '[') {
                    ok = class_match(pattern, &pe, tc);
                    if (pe == kNone) return Match::kNo;
                } else {
                    ok = glob ? pc == tc : fold(pc) == fold(tc);
                }
                if (ok) {
                    p = pe;
                    t = te;
                    continue;
                }
            }
        } else if (t >= text.size()) {
            return Match::kYes;
        }
        if (star_p == kNone || star_t >= text.size()) return Match::kNo;
        next_char(text, &star_t);
        t = star_t;
        p = star_p;
    }
}

bool RegisterFilterFunctions(sqlite3* db, FilterDeadline* deadline) {
    constexpr int kFlags = SQLITE_UTF8 | SQLITE_DETERMINISTIC;
    using Fn = void (*)(sqlite3_context*, int, sqlite3_value**);
    const Fn like = [](sqlite3_context* c, int n, sqlite3_value** v) { match_fn(c, n, v, false); };
    const Fn glob = [](sqlite3_context* c, int n, sqlite3_value** v) { match_fn(c, n, v, true); };
    const std::tuple<const char*, int, Fn> fns[] = {
        {"like", 2, like}, {"like", 3, like}, {"glob", 2, glob}, {"instr", 2, instr_fn}};
    for (const auto& [name, n, fn] : fns) {
        if (sqlite3_create_function_v2(db, name, n, kFlags, deadline, fn, nullptr, nullptr, nullptr) != SQLITE_OK) {
            return false;
        }
    }
    return true;
}

}  // namespace tms::index

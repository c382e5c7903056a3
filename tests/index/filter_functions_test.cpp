// Copyright TileMaxSim authors. The filter's LIKE, GLOB and instr(): the same answers as SQLite's
// own on one table of random cases, bounded time on hostile ones, and the snapshot's limits.
#include "index/metadata/filter_functions.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <random>
#include <string>

#include "index/metadata/metadata.h"
#include "tests/scratch_dir.h"

namespace tms::index {
namespace {

namespace fs = std::filesystem;

struct Db {
    sqlite3* db = nullptr;
    Db() { sqlite3_open(":memory:", &db); }
    ~Db() { sqlite3_close(db); }
    // The one-row, one-column answer of `sql` over text parameters: "NULL", or the integer.
    std::string Eval(const std::string& sql, const std::vector<std::string>& params) {
        sqlite3_stmt* s = nullptr;
        if (sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr) != SQLITE_OK) return "prepare error";
        for (size_t i = 0; i < params.size(); ++i) {
            sqlite3_bind_text(s, int(i) + 1, params[i].data(), int(params[i].size()), SQLITE_TRANSIENT);
        }
        std::string out;
        const int rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
            out = sqlite3_column_type(s, 0) == SQLITE_NULL ? "NULL" : std::to_string(sqlite3_column_int64(s, 0));
        } else {
            out = std::string("error: ") + sqlite3_errmsg(db);
        }
        sqlite3_finalize(s);
        return out;
    }
};

// Random strings over an alphabet with every special character of both languages, a capital
// (LIKE folds ASCII case), and multi-byte characters ('é' folds in neither).
std::string random_string(std::mt19937& rng, int max_len) {
    static const char* const kAlphabet[] = {"a", "b", "A", "%", "_", "*", "?", "[", "]", "^", "-", "\\", "é", "É", "x"};
    std::uniform_int_distribution<int> len(0, max_len), pick(0, int(std::size(kAlphabet)) - 1);
    std::string s;
    for (int i = len(rng); i > 0; --i) s += kAlphabet[pick(rng)];
    return s;
}

TEST(FilterFunctionsCpu, MatchSqlitesOwnOnRandomCases) {
    Db builtin, ours;
    FilterDeadline deadline;
    RegisterFilterFunctions(ours.db, &deadline);
    const uint32_t seed = 20261206;
    std::mt19937 rng(seed);
    const char* const kQueries[] = {"SELECT ?2 LIKE ?1", "SELECT ?2 LIKE ?1 ESCAPE '\\'", "SELECT ?2 GLOB ?1",
                                    "SELECT instr(?2, ?1)"};
    int differ = 0;
    for (int i = 0; i < 20000; ++i) {
        // Patterns often made from the text, so that matches are common too.
        const std::string text = random_string(rng, 10);
        std::string pattern = random_string(rng, 6);
        if (i % 3 == 0 && !text.empty()) pattern = text.substr(0, text.size() / 2) + "%" + pattern;
        for (const char* q : kQueries) {
            const std::string want = builtin.Eval(q, {pattern, text}), got = ours.Eval(q, {pattern, text});
            if (want != got && ++differ < 10) {
                ADD_FAILURE() << q << " with ?1 '" << pattern << "', ?2 '" << text << "': SQLite " << want << ", ours "
                              << got << " (seed " << seed << ", case " << i << ")";
            }
        }
    }
    EXPECT_EQ(differ, 0);
    // NULLs, an ESCAPE of two characters, non-text arguments, blobs and empty needles.
    for (const char* q : {"SELECT NULL LIKE 'a'", "SELECT 'a' LIKE NULL", "SELECT 'a' LIKE 'a' ESCAPE NULL",
                          "SELECT 'a' LIKE 'a' ESCAPE 'xy'", "SELECT 12 LIKE '1%'", "SELECT 3.5 GLOB '3.*'",
                          "SELECT instr(x'00616263', x'6263')", "SELECT instr('abc', '')", "SELECT instr(NULL, 'a')",
                          "SELECT instr('aéb', 'b')", "SELECT instr(123, 23)", "SELECT 'ab' GLOB '[a'"}) {
        EXPECT_EQ(builtin.Eval(q, {}), ours.Eval(q, {})) << q;
    }
}

// A pattern that costs text x pattern steps stops at the deadline instead of running for
// minutes (SQLite's own LIKE took 44 s on this case at 10 MB).
TEST(FilterFunctionsCpu, HostilePatternStopsAtTheDeadline) {
    const std::string text(4 << 20, 'a');
    const std::string pattern = "%" + std::string(2000, 'a') + "b%";
    FilterDeadline d{std::chrono::steady_clock::now() + std::chrono::milliseconds(50)};
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(WildcardMatch(pattern, text, false, 0, &d), Match::kTimedOut);
    EXPECT_TRUE(d.passed);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
    EXPECT_EQ(WildcardMatch("%b%", text, false, 0, nullptr), Match::kNo);  // linear
    EXPECT_EQ(WildcardMatch("*a", text, true, 0, nullptr), Match::kYes);
}

// The snapshot applies its limits to every filter: a slow one fails naming the time limit, one
// that builds a long value names the memory limit, and both leave the snapshot usable.
TEST(FilterFunctionsCpu, SnapshotFiltersAreBounded) {
    const fs::path dir = testing::ScratchDir("tms_filter_limits");
    std::unique_ptr<MetadataWriter> w;
    ASSERT_TRUE(MetadataWriter::Create((dir / kMetadataFile).string(), {{"v", MetaType::kText}}, &w).ok());
    const std::string big(2 << 20, 'a');
    for (int d = 0; d < 4; ++d) {
        ASSERT_TRUE(w->Insert(d, "d" + std::to_string(d), {{0, MetaValue{MetaValue::Kind::kText, 0, 0, big}}}).ok());
    }
    ASSERT_TRUE(w->Commit().ok());
    std::unique_ptr<MetadataSnapshot> snap;
    ASSERT_TRUE(MetadataSnapshot::Load(dir.string(), 4, &snap).ok());
    snap->SetLimits(200, 8 << 20);
    std::vector<uint32_t> bits;
    int64_t count = 0;
    const auto t0 = std::chrono::steady_clock::now();
    const Status slow = snap->Filter("v LIKE '%" + std::string(3000, 'a') + "b%'", &bits, &count);
    EXPECT_EQ(slow.message(), "filter: ran longer than 200 ms (the filter's time limit, --filter-time-ms)");
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3.0);
    const Status big_value = snap->Filter("length(v || v || v || v || v) > 0", &bits, &count);
    EXPECT_EQ(big_value.message(),
              "filter: a value longer than 8388608 bytes (the filter's memory limit, --filter-max-bytes)");
    // A function's result beyond the limit is refused too; within it, filters work as before.
    snap->SetLimits(5000, 1 << 20);
    EXPECT_EQ(snap->Filter("lower(v) = 'x'", &bits, &count).message(),
              "filter: a value longer than 1048576 bytes (the filter's memory limit, --filter-max-bytes)");
    snap->SetLimits(5000, 16 << 20);
    ASSERT_TRUE(snap->Filter("instr(v, 'ab') = 0 AND v LIKE 'A%'", &bits, &count).ok());
    EXPECT_EQ(count, 4);
}

}  // namespace
}  // namespace tms::index

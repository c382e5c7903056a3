// Copyright TileMaxSim authors. Document metadata: JSONL input, the filter language, the
// snapshot's filters against a brute-force evaluation, and the metadata file following its
// documents through build, add, replace, delete and compaction (sharded too).
#include "index/ingest/metadata_jsonl.h"
#include "index/metadata/metadata.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "index/index_data.h"
#include "index/store/index_reader.h"
#include "tests/scratch_dir.h"
#include "tilemaxsim/tilemaxsim.h"

namespace tms {
namespace {

namespace fs = std::filesystem;
using index::MetaCells;
using index::MetaRows;
using index::MetaValue;

fs::path meta_dir(const std::string& name) { return testing::ScratchDir("tms_meta_" + name); }

std::string write_file(const fs::path& p, const std::string& text) {
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
}

// A value as the tests compare it: "i:5", "r:0.5", "t:text".
std::string repr(const MetaValue& v) {
    switch (v.kind) {
        case MetaValue::Kind::kInteger: return "i:" + std::to_string(v.i);
        case MetaValue::Kind::kReal: return "r:" + std::to_string(v.r);
        case MetaValue::Kind::kText: return "t:" + v.s;
        case MetaValue::Kind::kNull: break;
    }
    return "null";
}

// A document's cells as "col=value;..." in column order.
std::string repr(const MetaCells& cells, const std::vector<MetaColumn>& cols) {
    std::map<int, std::string> by;
    for (const auto& [c, v] : cells) by[c] = repr(v);
    std::string s;
    for (const auto& [c, v] : by) s += cols[size_t(c)].name + "=" + v + ";";
    return s;
}

std::vector<std::string> names_types(const std::vector<MetaColumn>& cols) {
    std::vector<std::string> out;
    for (const auto& c : cols) out.push_back(c.name + ":" + MetaTypeName(c.type));
    return out;
}

// ---- JSONL ---------------------------------------------------------------------------------

TEST(MetadataCpu, OrderModeInfersTypes) {
    DocMetadata md;
    md.objects = {R"({"tenant": 3, "score": 1, "lang": "en", "ok": true, "tags": [1, {"a": [2]}], "n": null})",
                  R"({"tenant": 4, "score": 2.5, "lang": 7, "ok": false})", R"({})"};
    MetaRows rows;
    const Status st = index::ResolveMetadata(md, {"a", "b", "c"}, {}, &rows);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(names_types(rows.columns), (std::vector<std::string>{"tenant:integer", "score:real", "lang:text",
                                                                   "ok:integer", "tags:text", "n:text"}));
    EXPECT_EQ(repr(rows.cells[0], rows.columns), "tenant=i:3;score=i:1;lang=t:en;ok=i:1;tags=t:[1,{\"a\":[2]}];");
    EXPECT_EQ(repr(rows.cells[1], rows.columns), "tenant=i:4;score=r:2.500000;lang=i:7;ok=i:0;");
    EXPECT_EQ(repr(rows.cells[2], rows.columns), "");
}

TEST(MetadataCpu, KeyedModeAnyOrderMissingDocumentsNull) {
    DocMetadata md;
    md.objects = {R"({"id": "b", "year": 2001})", R"({"id": 17, "year": 1999, "lang": "fr"})"};
    MetaRows rows;
    const Status st = index::ResolveMetadata(md, {"a", "b", "17"}, {}, &rows);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(names_types(rows.columns), (std::vector<std::string>{"year:integer", "lang:text"}));
    EXPECT_EQ(repr(rows.cells[0], rows.columns), "");
    EXPECT_EQ(repr(rows.cells[1], rows.columns), "year=i:2001;");
    EXPECT_EQ(repr(rows.cells[2], rows.columns), "year=i:1999;lang=t:fr;");
}

TEST(MetadataCpu, DeclaredAndExistingTypes) {
    DocMetadata md;
    md.objects = {R"({"year": 1, "YEAR2": "x", "Lang": "en"})"};
    ASSERT_TRUE(ParseMetaColumns(" year : REAL, flag:int ,note:str", &md.declared).ok());
    MetaRows rows;
    // Existing columns keep their types and spelling; names match ignoring case.
    const Status st = index::ResolveMetadata(md, {"a"}, {{"lang", MetaType::kText}}, &rows);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(names_types(rows.columns),
              (std::vector<std::string>{"lang:text", "year:real", "flag:integer", "note:text", "YEAR2:text"}));
    EXPECT_EQ(rows.n_existing, 1u);
    EXPECT_EQ(repr(rows.cells[0], rows.columns), "lang=t:en;year=i:1;YEAR2=t:x;");
    md.declared = {{"lang", MetaType::kInteger}};
    const Status bad = index::ResolveMetadata(md, {"a"}, {{"lang", MetaType::kText}}, &rows);
    EXPECT_EQ(bad.message(), "metadata: column 'lang' is text in the index, declared integer");
}

// A value of the wrong kind for an existing or declared column is refused with its line (SQLite
// would store it: text in an integer column compares above every number, so a filter such as
// "tenant > 1000000" would let it through).
TEST(MetadataCpu, ValuesMustFitTheirColumnsType) {
    const std::vector<MetaColumn> existing = {
        {"tenant", MetaType::kInteger}, {"score", MetaType::kReal}, {"lang", MetaType::kText}};
    MetaRows rows;
    DocMetadata md;
    md.source = "add.jsonl";
    // What fits: integers (booleans too) in integer columns, numbers in real ones, anything in text.
    md.objects = {R"({"id": "a", "tenant": 3, "score": 2, "lang": 7})", R"({"id": "b", "tenant": true, "score": 0.5})",
                  R"({"id": "c", "tenant": null, "lang": [1, 2]})"};
    ASSERT_TRUE(index::ResolveMetadata(md, {"a", "b", "c"}, existing, &rows).ok());
    const struct {
        const char* object;
        const char* message;
    } cases[] = {
        {R"({"id": "a", "tenant": "abc"})",
         "add.jsonl: line 2: column 'tenant' is integer in the index, got a string \"abc\""},
        {R"({"id": "a", "tenant": 1.5})",
         "add.jsonl: line 2: column 'tenant' is integer in the index, got a real number"},
        {R"({"id": "a", "Score": "9"})", "add.jsonl: line 2: column 'score' is real in the index, got a string \"9\""},
        {R"({"id": "a", "tenant": [7]})",
         "add.jsonl: line 2: column 'tenant' is integer in the index, got an array \"[7]\""},
        {R"({"id": "a", "score": {"x": 1}})",
         "add.jsonl: line 2: column 'score' is real in the index, got an object \"{\"x\":1}\""},
    };
    for (const auto& c : cases) {
        md.objects = {R"({"id": "b"})", c.object};
        const Status st = index::ResolveMetadata(md, {"a", "b"}, existing, &rows);
        EXPECT_EQ(st.message(), c.message) << c.object;
    }
    // A declared type binds the same way.
    md.objects = {R"({"year": "2024"})"};
    ASSERT_TRUE(ParseMetaColumns("year:integer", &md.declared).ok());
    EXPECT_EQ(index::ResolveMetadata(md, {"a"}, {}, &rows).message(),
              "add.jsonl: line 1: column 'year' is integer as declared, got a string \"2024\"");
}

TEST(MetadataCpu, JsonlLinesAndEveryError) {
    const fs::path dir = meta_dir("jsonl");
    DocMetadata md;
    const std::string good =
        write_file(dir / "good.jsonl", "\xef\xbb\xbf{\"a\": 1}\r\n\n   \n{\"a\": \"\\u00e9\\ud83d\\ude00\"}\n");
    ASSERT_TRUE(LoadMetadataJsonl(good, &md).ok());
    EXPECT_EQ(md.objects.size(), 2u);
    EXPECT_EQ(md.lines, (std::vector<int64_t>{1, 4}));
    EXPECT_EQ(md.source, good);
    MetaRows rows;
    ASSERT_TRUE(index::ResolveMetadata(md, {"x", "y"}, {}, &rows).ok());
    EXPECT_EQ(repr(rows.cells[1], rows.columns), "a=t:\xc3\xa9\xf0\x9f\x98\x80;");

    // Each bad line: one line naming the file and the line.
    const std::vector<std::pair<std::string, std::string>> bad_lines = {
        {"[1, 2]", "line 2: expected a JSON object"},
        {"{\"a\": 1",
         "line 2: bad JSON: syntax error while parsing object - unexpected end of input; expected '}' "
         "at character 8"},
        {"{\"a\": 01}",
         "line 2: bad JSON: syntax error while parsing object - unexpected number literal; "
         "expected '}' at character 8"},
        {"{\"a\": tru}", "line 2: bad JSON: syntax error while parsing value - invalid literal at character 10"},
        {"{\"a\": \"x\\q\"}",
         "line 2: bad JSON: syntax error while parsing value - invalid string: forbidden "
         "character after backslash at character 10"},
        {"{\"a\": \"\xff\"}",
         "line 2: bad JSON: syntax error while parsing value - invalid string: ill-formed "
         "UTF-8 byte at character 8"},
        {"{\"a\": \"\\ud800\"}",
         "line 2: bad JSON: syntax error while parsing value - invalid string: surrogate "
         "U+D800..U+DBFF must be followed by U+DC00..U+DFFF at character 14"},
        {"{\"a\": 1e999}", "line 2: bad JSON: number overflow parsing '1e999' at character 11"},
        {"{\"a\": 1} x",
         "line 2: bad JSON: syntax error while parsing value - invalid literal; expected end of "
         "input at character 10"},
        {"{\"a\": " + std::string(100, '[') + std::string(100, ']') + "}",
         "line 2: bad JSON: nested more than 64 deep"},
        {"{a: 1}",
         "line 2: bad JSON: syntax error while parsing object key - invalid literal; expected string "
         "literal at character 2"},
    };
    for (const auto& [line, want] : bad_lines) {
        const std::string f = write_file(dir / "bad.jsonl", "{\"a\": 1}\n" + line + "\n");
        const Status st = LoadMetadataJsonl(f, &md);
        EXPECT_FALSE(st.ok()) << line;
        EXPECT_EQ(st.message().find('\n'), std::string::npos);
        EXPECT_EQ(st.message().rfind(f + ": " + want, 0), 0u) << st.message();
    }
    EXPECT_EQ(LoadMetadataJsonl((dir / "none.jsonl").string(), &md).code(), Status::Code::kNotFound);

    // Resolution errors against the batch's documents, with the file's line numbers.
    const auto resolve = [&](const std::string& text, const std::vector<std::string>& ids) {
        const std::string f = write_file(dir / "m.jsonl", text);
        DocMetadata m;
        Status st = LoadMetadataJsonl(f, &m);
        if (st.ok()) st = index::ResolveMetadata(m, ids, {}, &rows);
        EXPECT_EQ(st.message().find('\n'), std::string::npos);
        return st.ok() ? std::string("OK") : st.message().substr(f.size() + 2);
    };
    EXPECT_EQ(resolve("{\"id\": \"a\"}\n\n{\"id\": \"zz\"}\n", {"a", "b"}), "line 3: unknown document id 'zz'");
    EXPECT_EQ(resolve("{\"id\": \"a\"}\n{\"id\": \"a\"}\n", {"a", "b"}),
              "line 2: document 'a' already has an object (line 1)");
    EXPECT_EQ(resolve("{\"id\": \"a\"}\n{\"x\": 1}\n", {"a", "b"}),
              "line 2: no \"id\" (the first object names its document by \"id\", so every object must)");
    EXPECT_EQ(resolve("{\"id\": 1.5}\n", {"a"}), "line 1: \"id\" must be a string or an integer");
    EXPECT_EQ(resolve("{\"id\": true}\n", {"1"}), "line 1: \"id\" must be a string or an integer");
    EXPECT_EQ(resolve("{\"id\": [\"a\"]}\n", {"a"}), "line 1: \"id\" must be a string or an integer");
    EXPECT_EQ(resolve("{\"id\": \"[a\"}\n", {"[a"}), "OK");
    EXPECT_EQ(resolve("{\"id\": \"a\", \"id\": \"b\"}\n", {"a", "b"}), "line 1: \"id\" given twice");
    EXPECT_EQ(resolve("{\"x\": 1}\n{\"id\": \"b\"}\n", {"a", "b"}),
              "line 2: \"id\" names a document only when the first object has one too");
    EXPECT_EQ(
        resolve("{\"x\": 1}\n{\"x\": 2}\n{\"x\": 3}\n", {"a", "b"}),
        "line 3: more objects than documents (2; one per document, in order, or each naming its document by \"id\")");
    EXPECT_EQ(resolve("{\"x\": 1}\n", {"a", "b"}),
              "1 object for 2 documents (one per document, in order, or each naming its document by \"id\")");
    EXPECT_EQ(
        resolve("{\"x\": 1, \"a-b\": 2}\n", {"a"}),
        "line 1: bad column name 'a-b' (letters, digits and _, not starting with a digit, at most 64 characters)");
    EXPECT_EQ(resolve("{\"" + std::string(65, 'c') + "\": 2}\n", {"a"}).rfind("line 1: bad column name", 0), 0u);
    EXPECT_EQ(resolve("{\"doc\": 2}\n", {"a"}), "line 1: column name 'doc' is reserved");
    EXPECT_EQ(resolve("{\"ID\": 2}\n", {"a"}), "line 1: column name 'ID' is reserved");
    EXPECT_EQ(resolve("{\"like\": 2}\n", {"a"}), "line 1: column name 'like' is reserved");
    EXPECT_EQ(resolve("{\"x\": 1, \"X\": 2}\n", {"a"}), "line 1: column 'x' given twice");
    std::string wide = "{";
    for (int c = 0; c <= index::kMaxMetaColumns; ++c) wide += (c ? ", \"c" : "\"c") + std::to_string(c) + "\": 1";
    EXPECT_EQ(resolve(wide + "}\n", {"a"}), "line 1: more than 1000 columns");
}

TEST(MetadataCpu, ParseMetaColumnsRefusesBadSpecs) {
    std::vector<MetaColumn> cols;
    ASSERT_TRUE(ParseMetaColumns("", &cols).ok());
    EXPECT_TRUE(cols.empty());
    ASSERT_TRUE(ParseMetaColumns("a:integer,b:float,c:TEXT", &cols).ok());
    EXPECT_EQ(names_types(cols), (std::vector<std::string>{"a:integer", "b:real", "c:text"}));
    EXPECT_EQ(ParseMetaColumns("a", &cols).message(),
              "metadata types: 'a' is not NAME:TYPE (types integer, real or text)");
    EXPECT_EQ(ParseMetaColumns("a:blob", &cols).message(),
              "metadata types: bad type 'blob' for column 'a' (integer, real or text)");
    EXPECT_EQ(ParseMetaColumns("a:int,A:real", &cols).message(), "metadata types: column 'A' given twice");
    EXPECT_EQ(ParseMetaColumns("id:text", &cols).message(), "metadata types: column name 'id' is reserved");
    EXPECT_EQ(ParseMetaColumns("a:int,", &cols).message(), "metadata types: trailing ','");
}

// ---- the filter language -------------------------------------------------------------------

const std::vector<MetaColumn> kCols = {
    {"tenant", MetaType::kText}, {"year", MetaType::kInteger}, {"score", MetaType::kReal}, {"lang", MetaType::kText}};

TEST(MetadataCpu, CompileFilterBindsLiterals) {
    std::string sql;
    std::vector<index::FilterParam> params;
    ASSERT_TRUE(index::CompileFilter("Year >= 2020 and \"LANG\" in ('en', 'it''s') or score<.5e1 OR id = 0x1F "
                                     "AND lower(tenant) LIKE 'a%' ESCAPE '!' and year is not null",
                                     kCols, &sql, &params)
                    .ok());
    EXPECT_EQ(sql,
              "\"year\" >= ?1 AND \"lang\" IN ( ?2 , ?3 ) OR \"score\" < ?4 OR \"id\" = ?5 AND lower ( \"tenant\" ) "
              "LIKE ?6 ESCAPE ?7 AND \"year\" IS NOT NULL");
    ASSERT_EQ(params.size(), 7u);
    EXPECT_EQ(repr(params[0]), "i:2020");
    EXPECT_EQ(repr(params[2]), "t:it's");
    EXPECT_EQ(repr(params[3]), "r:5.000000");
    EXPECT_EQ(repr(params[4]), "i:31");
    ASSERT_TRUE(index::CompileFilter("year = 99999999999999999999", kCols, &sql, &params).ok());
    EXPECT_EQ(params[0].kind, MetaValue::Kind::kReal);
    // Data, never SQL.
    ASSERT_TRUE(index::CompileFilter("tenant = 'a''; DROP TABLE docs; --'", kCols, &sql, &params).ok());
    EXPECT_EQ(sql, "\"tenant\" = ?1");
    EXPECT_EQ(repr(params[0]), "t:a'; DROP TABLE docs; --");
}

TEST(MetadataCpu, CompileFilterRefusesAnythingElseInOneLine) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"year = 1; DROP TABLE docs", "filter: unexpected ';' at character 9"},
        {"year = 1 -- x", "filter: unexpected '--' at character 10"},
        {"year = 1 /* x */", "filter: unexpected '/*' at character 10"},
        {"year = ?", "filter: unexpected '?' at character 8"},
        {"year = :y", "filter: unexpected ':' at character 8"},
        {"year = @y", "filter: unexpected '@' at character 8"},
        {"year = $y", "filter: unexpected '$' at character 8"},
        {"`year` = 1", "filter: unexpected '`' at character 1"},
        {"[year] = 1", "filter: unexpected '[' at character 1"},
        {"docs.year = 1", "filter: unknown column 'docs' (columns: id, tenant, year, score, lang)"},
        {"yeer = 2020", "filter: unknown column 'yeer' (columns: id, tenant, year, score, lang)"},
        {"\"doc\" = 1", "filter: unknown column 'doc' (columns: id, tenant, year, score, lang)"},
        {"year IN (SELECT 1)", "filter: unknown column 'SELECT' (columns: id, tenant, year, score, lang)"},
        {"load_extension('x')",
         "filter: function 'load_extension' is not allowed (allowed: abs, coalesce, ifnull, "
         "instr, json_extract, length, lower, round, substr, upper)"},
        {"random() > 0", "filter: function 'random' is not allowed"},
        {"tenant = 'abc", "filter: unterminated string at character 10"},
        {"\"year = 1", "filter: unterminated quoted name at character 1"},
        {"year = 12abc", "filter: bad number '12a' at character 8"},
        {"year = 0x", "filter: bad hex number '0x' at character 8"},
        {"year = 1e999", "filter: number out of range '1e999' at character 8"},
        {"year = 1\xc3\xa9", "filter: unexpected '\\xc3' at character 9"},
        {"   ", "filter: empty expression"},
        {"", "filter: empty expression"},
    };
    for (const auto& [expr, want] : cases) {
        std::string sql;
        std::vector<index::FilterParam> params;
        const Status st = index::CompileFilter(expr, kCols, &sql, &params);
        EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << expr;
        EXPECT_EQ(st.message().rfind(want, 0), 0u) << expr << " -> " << st.message();
        EXPECT_EQ(st.message().find('\n'), std::string::npos);
    }
}

// ---- the snapshot's filters against a brute-force evaluation -------------------------------

struct Row {
    std::string id;
    std::optional<std::string> tenant, lang;
    std::optional<int64_t> year;
    std::optional<double> score;
};
using Tri = std::optional<bool>;  // SQL's three-valued logic (nullopt: NULL)
Tri tand(Tri a, Tri b) {
    if (a == false || b == false) return false;
    if (!a || !b) return std::nullopt;
    return true;
}
Tri tor(Tri a, Tri b) {
    if (a == true || b == true) return true;
    if (!a || !b) return std::nullopt;
    return false;
}
Tri tnot(Tri a) { return a ? Tri(!*a) : std::nullopt; }
template <class T, class F>
Tri cmp(const std::optional<T>& v, F f) {
    return v ? Tri(f(*v)) : std::nullopt;
}
// SQLite's LIKE: ASCII case-insensitive, % any run, _ one character.
bool like(const std::string& s, const std::string& p, size_t i = 0, size_t j = 0) {
    if (j == p.size()) return i == s.size();
    if (p[j] == '%') return like(s, p, i, j + 1) || (i < s.size() && like(s, p, i + 1, j));
    if (i == s.size()) return false;
    if (p[j] == '_' ||
        std::tolower(static_cast<unsigned char>(p[j])) == std::tolower(static_cast<unsigned char>(s[i]))) {
        return like(s, p, i + 1, j + 1);
    }
    return false;
}

// Writes `rows` (doc = position) as a metadata file in `dir`.
void write_rows(const fs::path& dir, const std::vector<Row>& rows) {
    std::unique_ptr<index::MetadataWriter> w;
    ASSERT_TRUE(index::MetadataWriter::Create((dir / index::kMetadataFile).string(), kCols, &w).ok());
    for (size_t d = 0; d < rows.size(); ++d) {
        MetaCells cells;
        const Row& r = rows[d];
        if (r.tenant) cells.push_back({0, MetaValue{MetaValue::Kind::kText, 0, 0, *r.tenant}});
        if (r.year) cells.push_back({1, MetaValue{MetaValue::Kind::kInteger, *r.year, 0, ""}});
        if (r.score) cells.push_back({2, MetaValue{MetaValue::Kind::kReal, 0, *r.score, ""}});
        if (r.lang) cells.push_back({3, MetaValue{MetaValue::Kind::kText, 0, 0, *r.lang}});
        ASSERT_TRUE(w->Insert(int64_t(d), r.id, cells).ok());
    }
    ASSERT_TRUE(w->Commit().ok());
}

TEST(MetadataCpu, SnapshotFilterMatchesBruteForce) {
    const uint64_t seed = 20240611;
    std::mt19937_64 rng(seed);
    const fs::path dir = meta_dir("brute");
    const int n_docs = 400, n_rows = 430;  // rows past n_docs: a commit the stores never made
    std::vector<Row> rows(n_rows);
    const char* tenants[] = {"acme", "Beta", "gamma", "a_c", "a'; DROP TABLE docs; --"};
    const char* langs[] = {"en", "EN", "fr", "de", "es"};
    for (int d = 0; d < n_rows; ++d) {
        Row& r = rows[size_t(d)];
        r.id = "d" + std::to_string(d);
        if (rng() % 6) r.tenant = tenants[rng() % 5];
        if (rng() % 5) r.year = 1990 + int64_t(rng() % 40);
        if (rng() % 4) r.score = double(rng() % 1000) / 1000.0;
        if (rng() % 5) r.lang = langs[rng() % 5];
    }
    write_rows(dir, rows);
    std::unique_ptr<index::MetadataSnapshot> snap;
    ASSERT_TRUE(index::MetadataSnapshot::Load(dir.string(), n_docs, &snap).ok());
    ASSERT_TRUE(snap);
    EXPECT_EQ(snap->rows(), n_docs);
    EXPECT_EQ(names_types(snap->columns()), names_types(kCols));
    const std::vector<std::pair<std::string, std::function<Tri(const Row&)>>> exprs = {
        {"year = 2005", [](const Row& r) { return cmp(r.year, [](int64_t y) { return y == 2005; }); }},
        {"score < 0.25", [](const Row& r) { return cmp(r.score, [](double s) { return s < 0.25; }); }},
        {"year BETWEEN 2000 AND 2010",
         [](const Row& r) { return cmp(r.year, [](int64_t y) { return y >= 2000 && y <= 2010; }); }},
        {"tenant IN ('acme', 'gamma')",
         [](const Row& r) { return cmp(r.tenant, [](const std::string& t) { return t == "acme" || t == "gamma"; }); }},
        {"lang LIKE 'e%'",
         [](const Row& r) { return cmp(r.lang, [](const std::string& l) { return like(l, "e%"); }); }},
        {"tenant LIKE 'a_c%'",
         [](const Row& r) { return cmp(r.tenant, [](const std::string& t) { return like(t, "a_c%"); }); }},
        {"year >= 2010 AND lang = 'en' OR score > 0.9",
         [](const Row& r) {
             return tor(tand(cmp(r.year, [](int64_t y) { return y >= 2010; }),
                             cmp(r.lang, [](const std::string& l) { return l == "en"; })),
                        cmp(r.score, [](double s) { return s > 0.9; }));
         }},
        {"NOT (year < 2010)", [](const Row& r) { return tnot(cmp(r.year, [](int64_t y) { return y < 2010; })); }},
        {"lang IS NULL", [](const Row& r) { return Tri(!r.lang); }},
        {"score IS NOT NULL AND NOT tenant = 'Beta'",
         [](const Row& r) {
             return tand(Tri(bool(r.score)), tnot(cmp(r.tenant, [](const std::string& t) { return t == "Beta"; })));
         }},
        {"id = 'd17' OR id IN ('d3', 'd399', 'd405')",
         [](const Row& r) { return Tri(r.id == "d17" || r.id == "d3" || r.id == "d399" || r.id == "d405"); }},
        {"tenant = 'a''; DROP TABLE docs; --'",
         [](const Row& r) {
             return cmp(r.tenant, [](const std::string& t) { return t == "a'; DROP TABLE docs; --"; });
         }},
        {"lower(tenant) = 'beta' OR coalesce(year, 0) = 0",
         [](const Row& r) {
             return tor(cmp(r.tenant, [](const std::string& t) { return t == "Beta"; }), Tri(!r.year));
         }},
        {"length(lang) = 2 AND upper(substr(lang, 1, 1)) = 'E'",
         [](const Row& r) { return cmp(r.lang, [](const std::string& l) { return l[0] == 'e' || l[0] == 'E'; }); }},
    };
    const auto check_all = [&]() {
        for (const auto& [expr, eval] : exprs) {
            std::vector<uint32_t> bits;
            int64_t count = -1;
            const Status st = snap->Filter(expr, &bits, &count);
            ASSERT_TRUE(st.ok()) << expr << ": " << st.ToString();
            ASSERT_EQ(bits.size(), size_t((n_docs + 31) / 32));
            int64_t want = 0;
            for (int d = 0; d < n_docs; ++d) {
                const bool in = eval(rows[size_t(d)]) == true;
                want += in;
                EXPECT_EQ(bool(bits[size_t(d / 32)] >> (d % 32) & 1), in) << expr << " doc " << d << " seed " << seed;
            }
            EXPECT_EQ(count, want) << expr;
        }
    };
    check_all();
    // The filter's text is data: the table is still there.
    std::vector<uint32_t> bits;
    int64_t count = 0;
    ASSERT_TRUE(snap->Filter("id IS NOT NULL", &bits, &count).ok());
    EXPECT_EQ(count, n_docs);
    // More expressions than the cache holds, then the first ones again; and from several threads.
    for (int y = 0; y < 40; ++y) ASSERT_TRUE(snap->Filter("year = " + std::to_string(1990 + y), &bits, &count).ok());
    check_all();
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) threads.emplace_back(check_all);
    for (auto& t : threads) t.join();
    // Errors SQLite finds are one line too; the snapshot stays usable.
    const Status st = snap->Filter("year = = 1", &bits, &count);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
    EXPECT_EQ(st.message().rfind("filter: ", 0), 0u) << st.message();
    EXPECT_EQ(snap->Filter("yeer = 1", &bits, &count).message(),
              "filter: unknown column 'yeer' (columns: id, tenant, year, score, lang)");
    // The snapshot is a copy: a writer changing the file later changes nothing it sees.
    std::unique_ptr<index::MetadataWriter> w;
    ASSERT_TRUE(index::MetadataWriter::Open((dir / index::kMetadataFile).string(), &w).ok());
    ASSERT_TRUE(w->DeleteFrom(0).ok());
    ASSERT_TRUE(w->Commit().ok());
    ASSERT_TRUE(snap->Filter("id IS NOT NULL", &bits, &count).ok());
    EXPECT_EQ(count, n_docs);
}

TEST(MetadataCpu, SnapshotFunctionsOnJsonAndNumbers) {
    const fs::path dir = meta_dir("functions");
    std::unique_ptr<index::MetadataWriter> w;
    const std::vector<MetaColumn> cols = {{"tags", MetaType::kText}, {"x", MetaType::kInteger}, {"r", MetaType::kReal}};
    ASSERT_TRUE(index::MetadataWriter::Create((dir / index::kMetadataFile).string(), cols, &w).ok());
    const MetaValue json{MetaValue::Kind::kText, 0, 0, R"({"a": [1, 2], "b": "x"})"};
    ASSERT_TRUE(w->Insert(0, "p",
                          {{0, json},
                           {1, MetaValue{MetaValue::Kind::kInteger, -3, 0, ""}},
                           {2, MetaValue{MetaValue::Kind::kReal, 0, 1.6, ""}}})
                    .ok());
    ASSERT_TRUE(w->Insert(1, "q", {}).ok());
    ASSERT_TRUE(w->Commit().ok());
    std::unique_ptr<index::MetadataSnapshot> snap;
    ASSERT_TRUE(index::MetadataSnapshot::Load(dir.string(), 2, &snap).ok());
    for (const auto& [expr, want] :
         std::vector<std::pair<std::string, int64_t>>{{"json_extract(tags, '$.a[1]') = 2", 1},
                                                      {"json_extract(tags, '$.b') = 'x'", 1},
                                                      {"abs(x) = 3", 1},
                                                      {"round(r) = 2", 1},
                                                      {"ifnull(x, 7) = 7", 1},
                                                      {"instr(tags, '\"b\"') > 0", 1},
                                                      {"x IS NULL", 1},
                                                      {"TRUE", 2},
                                                      {"NOT FALSE AND id GLOB '[pq]'", 2}}) {
        std::vector<uint32_t> bits;
        int64_t count = -1;
        const Status st = snap->Filter(expr, &bits, &count);
        ASSERT_TRUE(st.ok()) << expr << ": " << st.ToString();
        EXPECT_EQ(count, want) << expr;
    }
}

TEST(MetadataCpu, NoFileNoSnapshot) {
    const fs::path dir = meta_dir("nofile");
    std::unique_ptr<index::MetadataSnapshot> snap;
    ASSERT_TRUE(index::MetadataSnapshot::Load(dir.string(), 10, &snap).ok());
    EXPECT_FALSE(snap);
    std::vector<MetaColumn> cols;
    int64_t rows = 0;
    ASSERT_TRUE(index::ReadMetadataInfo((dir / index::kMetadataFile).string(), 10, &cols, &rows).ok());
    EXPECT_EQ(rows, -1);
}

// ---- the metadata file through the index's life ---------------------------------------------

// Random documents "d0".."d<n-1>" (dim 32, 2-6 tokens each).
struct MetadataCorpus {
    std::vector<float> tokens;
    std::vector<int64_t> lens, offsets{0};
    std::vector<std::string> ids;
    static constexpr int kDim = 32;
    explicit MetadataCorpus(int n) {
        std::mt19937 rng(7);
        std::normal_distribution<float> g;
        for (int d = 0; d < n; ++d) {
            lens.push_back(2 + int64_t(rng() % 5));
            offsets.push_back(offsets.back() + lens.back());
            ids.push_back("d" + std::to_string(d));
        }
        tokens.resize(size_t(offsets.back()) * kDim);
        for (float& x : tokens) x = g(rng);
    }
    // Documents [a, b) as a view (into `tokens`), their lengths and ids.
    EmbeddingView view(int a, int b) const {
        return {tokens.data() + offsets[a] * kDim, DType::kF32, offsets[b] - offsets[a], kDim};
    }
    std::vector<int64_t> lens_of(int a, int b) const { return {lens.begin() + a, lens.begin() + b}; }
    std::vector<std::string> ids_of(int a, int b) const { return {ids.begin() + a, ids.begin() + b}; }
};

// The rows of the index at `path`: each row's document holds the row's id in the index, every
// live document has exactly one row, and its attributes are `want[id]` ("" for none).
void expect_rows(const std::string& path, const std::map<std::string, std::string>& want) {
    IndexInfo info;
    ASSERT_TRUE(ReadIndexInfo(path, &info).ok());
    index::IndexData data;
    ASSERT_TRUE(index::ReadIndex(path, false, false, &data).ok());
    ASSERT_EQ(info.metadata_rows, info.n_docs);  // every document has a row, deleted ones until compaction
    std::vector<MetaColumn> cols;
    std::map<std::string, std::string> got;
    int64_t rows = 0;
    ASSERT_TRUE(index::ForEachMetadataRow((fs::path(path) / index::kMetadataFile).string(), info.n_docs, &cols,
                                          [&](int64_t doc, const std::string& id, const MetaCells& cells) {
                                              ++rows;
                                              EXPECT_EQ(data.doc_ids[size_t(doc)], id) << "doc " << doc;
                                              if (!data.deleted[size_t(doc)]) {
                                                  EXPECT_TRUE(got.emplace(id, repr(cells, cols)).second) << id;
                                              }
                                              return Status::OK();
                                          })
                    .ok());
    EXPECT_EQ(rows, info.n_docs);
    EXPECT_EQ(names_types(cols), names_types(info.metadata_columns));
    EXPECT_EQ(got, want);
}

// Attributes of document d as the tests write them.
std::string attrs_json(int d) {
    return "\"tenant\": " + std::to_string(d % 4) + ", \"year\": " + std::to_string(2000 + d) + ", \"lang\": \"" +
           (d % 2 ? "en" : "fr") + "\"";
}
std::string attrs_repr(int d) {
    return "tenant=i:" + std::to_string(d % 4) + ";year=i:" + std::to_string(2000 + d) +
           ";lang=t:" + (d % 2 ? "en" : "fr") + ";";
}

// Build documents [0, 100) with metadata (keyed; every tenth without an object), add 10 with
// metadata and a new column, replace one, add 5 without metadata, delete some, compact: the
// rows follow their documents.
void lifecycle(const std::string& name, int shards) {
    const fs::path dir = meta_dir(name);
    const std::string path = (dir / "index").string();
    const MetadataCorpus c(120);
    IndexBuildOptions bo;
    bo.n_centroids = 16;
    bo.progress = false;
    bo.chunk_docs = 16;
    bo.shards = shards;
    std::map<std::string, std::string> want;
    DocMetadata md;
    for (int d = 99; d >= 0; --d) {  // any order
        if (d % 10 == 9) {
            want[c.ids[size_t(d)]] = "";
            continue;
        }
        md.objects.push_back("{\"id\": \"" + c.ids[size_t(d)] + "\", " + attrs_json(d) + "}");
        want[c.ids[size_t(d)]] = attrs_repr(d);
    }
    std::unique_ptr<IndexBuilder> b;
    ASSERT_TRUE(IndexBuilder::Create(bo, path, &b).ok());
    Status st = b->Build(c.view(0, 100), c.lens_of(0, 100), c.ids_of(0, 100), nullptr, &md);
    ASSERT_TRUE(st.ok()) << st.ToString();
    IndexInfo info;
    ASSERT_TRUE(ReadIndexInfo(path, &info).ok());
    EXPECT_EQ(int(info.shards.size()), shards);
    EXPECT_EQ(info.metadata_rows, 100);
    EXPECT_EQ(names_types(info.metadata_columns),
              (std::vector<std::string>{"tenant:integer", "year:integer", "lang:text"}));
    EXPECT_TRUE(fs::exists(fs::path(path) / index::kMetadataFile));
    expect_rows(path, want);
    {
        std::unique_ptr<IndexUpdater> u;
        ASSERT_TRUE(IndexUpdater::Open(path, false, &u).ok());
        // d100..d109 in order with a new column, and d5 again (replaced).
        std::vector<float> tok(c.tokens.begin() + c.offsets[100] * MetadataCorpus::kDim,
                               c.tokens.begin() + c.offsets[110] * MetadataCorpus::kDim);
        tok.insert(tok.end(), c.tokens.begin() + c.offsets[5] * MetadataCorpus::kDim,
                   c.tokens.begin() + c.offsets[6] * MetadataCorpus::kDim);
        std::vector<int64_t> lens = c.lens_of(100, 110);
        lens.push_back(c.lens[5]);
        std::vector<std::string> ids = c.ids_of(100, 110);
        ids.push_back("d5");
        DocMetadata add;
        for (int d = 100; d < 110; ++d) {
            add.objects.push_back("{" + attrs_json(d) + ", \"color\": \"c" + std::to_string(d) + "\"}");
            want[c.ids[size_t(d)]] = attrs_repr(d) + "color=t:c" + std::to_string(d) + ";";
        }
        add.objects.push_back("{\"color\": \"new\", \"year\": 1}");
        want["d5"] = "year=i:1;color=t:new;";
        const EmbeddingView v{tok.data(), DType::kF32, int64_t(tok.size() / MetadataCorpus::kDim), MetadataCorpus::kDim};
        st = u->Add(v, lens, ids, true, &add);
        ASSERT_TRUE(st.ok()) << st.ToString();
        EXPECT_EQ(u->info().metadata_rows, 111);
        // Before Commit readers see the old state.
        ASSERT_TRUE(ReadIndexInfo(path, &info).ok());
        EXPECT_EQ(info.metadata_rows, 100);
        EXPECT_EQ(info.metadata_columns.size(), 3u);
        // d110..d114 without metadata: NULL rows.
        st = u->Add(c.view(110, 115), c.lens_of(110, 115), c.ids_of(110, 115), false);
        ASSERT_TRUE(st.ok()) << st.ToString();
        for (int d = 110; d < 115; ++d) want[c.ids[size_t(d)]] = "";
        ASSERT_TRUE(u->Commit().ok());
        EXPECT_EQ(u->info().metadata_rows, 116);
        ASSERT_TRUE(u->Delete({"d0", "d1", "d2", "d3", "d4", "d6", "d101"}).ok());
        for (const char* id : {"d0", "d1", "d2", "d3", "d4", "d6", "d101"}) want.erase(id);
        ASSERT_TRUE(u->Commit().ok());
    }
    ASSERT_TRUE(ReadIndexInfo(path, &info).ok());
    EXPECT_EQ(info.n_docs, 116);
    EXPECT_EQ(info.n_deleted, 8);
    EXPECT_EQ(names_types(info.metadata_columns),
              (std::vector<std::string>{"tenant:integer", "year:integer", "lang:text", "color:text"}));
    expect_rows(path, want);
    // The snapshot a searcher loads: the whole index's documents, whatever shards it reads.
    std::vector<index::IndexData> parts;
    std::unique_ptr<index::MetadataSnapshot> snap;
    ASSERT_TRUE(index::ReadIndexShards(path, index::VectorLoad::kNone, false, &parts, {0}, &snap).ok());
    ASSERT_TRUE(snap);
    EXPECT_EQ(snap->n_docs(), 116);
    EXPECT_EQ(snap->rows(), 116);
    std::vector<uint32_t> bits;
    int64_t count = 0;
    ASSERT_TRUE(snap->Filter("color = 'new' OR id = 'd7'", &bits, &count).ok());
    EXPECT_EQ(count, 2);
    EXPECT_TRUE(bits[110 / 32] >> (110 % 32) & 1);  // the replacement, after d100..d109
    EXPECT_TRUE(bits[0] >> 7 & 1);

    ASSERT_TRUE(CompactIndex(path, false).ok());
    ASSERT_TRUE(ReadIndexInfo(path, &info).ok());
    EXPECT_EQ(info.n_docs, 108);
    EXPECT_EQ(info.metadata_rows, 108);
    EXPECT_EQ(int(info.shards.size()), shards);
    expect_rows(path, want);
    for (const auto& e : fs::directory_iterator(path)) {
        EXPECT_EQ(e.path().filename().string().find("metadata.sqlite."), std::string::npos) << e.path();
    }
}

TEST(MetadataCpu, FollowsDocumentsThroughAddReplaceDeleteCompact) { lifecycle("life", 1); }

TEST(MetadataCpu, ShardedIndexKeepsOneFileAtItsRoot) { lifecycle("sharded", 3); }

TEST(MetadataCpu, IndexWithoutMetadataGetsSomeByAdd) {
    const fs::path dir = meta_dir("late");
    const std::string path = (dir / "index").string();
    const MetadataCorpus c(60);
    IndexBuildOptions bo;
    bo.n_centroids = 16;
    bo.codec = "residual";  // PQ needs more tokens to train
    bo.progress = false;
    std::unique_ptr<IndexBuilder> b;
    ASSERT_TRUE(IndexBuilder::Create(bo, path, &b).ok());
    const Status built = b->Build(c.view(0, 40), c.lens_of(0, 40), c.ids_of(0, 40));
    ASSERT_TRUE(built.ok()) << built.ToString();
    IndexInfo info;
    ASSERT_TRUE(ReadIndexInfo(path, &info).ok());
    EXPECT_EQ(info.metadata_rows, -1);
    EXPECT_TRUE(info.metadata_columns.empty());
    {
        std::unique_ptr<IndexUpdater> u;
        ASSERT_TRUE(IndexUpdater::Open(path, false, &u).ok());
        ASSERT_TRUE(u->Add(c.view(40, 45), c.lens_of(40, 45), c.ids_of(40, 45), false).ok());
        EXPECT_EQ(u->info().metadata_rows, -1);
        ASSERT_TRUE(u->Delete({"d3"}).ok());
        ASSERT_TRUE(u->Commit().ok());
    }
    EXPECT_FALSE(fs::exists(fs::path(path) / index::kMetadataFile));
    std::map<std::string, std::string> want;
    for (int d = 0; d < 45; ++d) want[c.ids[size_t(d)]] = "";
    want.erase("d3");
    {
        std::unique_ptr<IndexUpdater> u;
        ASSERT_TRUE(IndexUpdater::Open(path, false, &u).ok());
        // Documents added without metadata before one with: NULLs too.
        ASSERT_TRUE(u->Add(c.view(45, 50), c.lens_of(45, 50), c.ids_of(45, 50), false).ok());
        DocMetadata md;
        for (int d = 50; d < 60; ++d) md.objects.push_back("{\"id\": \"d" + std::to_string(d) + "\", \"rank\": 0.5}");
        const Status st = u->Add(c.view(50, 60), c.lens_of(50, 60), c.ids_of(50, 60), false, &md);
        ASSERT_TRUE(st.ok()) << st.ToString();
        EXPECT_EQ(u->info().metadata_rows, 60);
        ASSERT_TRUE(u->Commit().ok());
    }
    for (int d = 45; d < 50; ++d) want[c.ids[size_t(d)]] = "";
    for (int d = 50; d < 60; ++d) want[c.ids[size_t(d)]] = "rank=r:0.500000;";
    ASSERT_TRUE(ReadIndexInfo(path, &info).ok());
    EXPECT_EQ(names_types(info.metadata_columns), (std::vector<std::string>{"rank:real"}));
    expect_rows(path, want);
}

TEST(MetadataCpu, RowsPastTheStoresAreInvisibleAndRemovedByTheNextWriter) {
    const fs::path dir = meta_dir("crash");
    const std::string path = (dir / "index").string();
    const MetadataCorpus c(30);
    IndexBuildOptions bo;
    bo.n_centroids = 8;
    bo.codec = "residual";
    bo.progress = false;
    DocMetadata md;
    for (int d = 0; d < 20; ++d) md.objects.push_back("{\"n\": " + std::to_string(d) + "}");
    std::unique_ptr<IndexBuilder> b;
    ASSERT_TRUE(IndexBuilder::Create(bo, path, &b).ok());
    const Status built = b->Build(c.view(0, 20), c.lens_of(0, 20), c.ids_of(0, 20), nullptr, &md);
    ASSERT_TRUE(built.ok()) << built.ToString();
    // What a commit killed between its SQLite and store commits leaves: rows of documents 20, 21.
    const std::string file = (fs::path(path) / index::kMetadataFile).string();
    {
        std::unique_ptr<index::MetadataWriter> w;
        ASSERT_TRUE(index::MetadataWriter::Open(file, &w).ok());
        ASSERT_TRUE(w->AddColumns({{"ghost", MetaType::kText}}).ok());
        ASSERT_TRUE(w->Insert(20, "x", {}).ok());
        ASSERT_TRUE(w->Insert(21, "y", {}).ok());
        ASSERT_TRUE(w->Commit().ok());
    }
    IndexInfo info;
    ASSERT_TRUE(ReadIndexInfo(path, &info).ok());
    EXPECT_EQ(info.metadata_rows, 20);
    {
        std::unique_ptr<IndexUpdater> u;
        ASSERT_TRUE(IndexUpdater::Open(path, false, &u).ok());
        ASSERT_TRUE(u->Add(c.view(20, 21), c.lens_of(20, 21), c.ids_of(20, 21), false).ok());
        ASSERT_TRUE(u->Commit().ok());
    }
    std::vector<MetaColumn> cols;
    std::map<int64_t, std::string> ids;
    ASSERT_TRUE(index::ForEachMetadataRow(file, 1000, &cols, [&](int64_t doc, const std::string& id, const MetaCells&) {
                    ids[doc] = id;
                    return Status::OK();
                }).ok());
    EXPECT_EQ(ids.size(), 21u);
    EXPECT_EQ(ids[20], "d20");
}

}  // namespace
}  // namespace tms

// Copyright TileMaxSim authors. Document metadata: JSONL input, the SQLite file, the snapshot
// and the filter language. The only user of SQLite.
#include "index/metadata/metadata.h"

#include <sqlite3.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <list>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "index/metadata/filter_functions.h"
#include "index/store/index_dir.h"
#include "tilemaxsim/options.h"

namespace fs = std::filesystem;

namespace tms {
namespace index {
namespace {

constexpr size_t kMaxColumnName = 64;
constexpr int kMaxJsonDepth = 64;  // nesting of an attribute's array or object
constexpr size_t kMaxFilterChars = 100000;
constexpr int kMaxFilterParams = 10000;
constexpr int kFilterCache = 16;
constexpr int kBusyTimeoutMs = 120000;  // a writer's transaction, at most: readers wait for it

const char* const kFilterKeywords[] = {"AND",  "OR",   "NOT",     "IN",     "IS",   "NULL",
                                       "LIKE", "GLOB", "BETWEEN", "ESCAPE", "TRUE", "FALSE"};
const char* const kFilterFunctions[] = {"abs",    "coalesce", "ifnull", "instr",  "json_extract",
                                        "length", "lower",    "round",  "substr", "upper"};

std::string lower(std::string s) {
    for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
}
std::string upper(std::string s) {
    for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
    return s;
}

// Text from the input as a message shows it: one line, printable, at most 80 characters.
std::string shown(std::string_view s) {
    std::string out;
    for (unsigned char c : s.substr(0, 80)) {
        if (c >= 0x20 && c < 0x7f) {
            out.push_back(char(c));
        } else {
            char b[8];
            std::snprintf(b, sizeof(b), "\\x%02x", c);
            out += b;
        }
    }
    if (s.size() > 80) out += "...";
    return out;
}

bool is_keyword(const std::string& word) {
    const std::string u = upper(word);
    return std::any_of(std::begin(kFilterKeywords), std::end(kFilterKeywords), [&](const char* k) { return u == k; });
}

// ---- JSON: one object a line -------------------------------------------------------------

struct JsonMember {
    std::string key;
    MetaValue value;
    char first = 0;  // the value's first character: '"' a string, 't'/'f' a boolean, '['/'{' nested, ...
};

// A strict JSON (RFC 8259) parser of one object whose members are kept in order: scalars as
// values, nested arrays and objects checked (to kMaxJsonDepth) and kept as their text. It never
// reads past its input and recurses only as deep as the nesting allows.
class JsonObjectParser {
public:
    explicit JsonObjectParser(std::string_view text)
        : begin_(text.data()), p_(text.data()), end_(text.data() + text.size()) {}

    // An empty string on success, else what is wrong.
    std::string Parse(std::vector<JsonMember>* out) {
        out->clear();
        skip_ws();
        if (p_ == end_ || *p_ != '{') return "expected a JSON object";
        ++p_;
        skip_ws();
        if (p_ < end_ && *p_ == '}') {
            ++p_;
        } else {
            for (;;) {
                JsonMember m;
                skip_ws();
                if (p_ == end_ || *p_ != '"') return error("expected a key (a string)");
                if (!string(&m.key)) return err_;
                skip_ws();
                if (p_ == end_ || *p_ != ':') return error("expected ':'");
                ++p_;
                skip_ws();
                m.first = p_ < end_ ? *p_ : 0;
                if (!value(&m.value)) return err_;
                out->push_back(std::move(m));
                skip_ws();
                if (p_ < end_ && *p_ == ',') {
                    ++p_;
                    continue;
                }
                if (p_ < end_ && *p_ == '}') {
                    ++p_;
                    break;
                }
                return error("expected ',' or '}'");
            }
        }
        skip_ws();
        if (p_ != end_) return error("unexpected text after the object");
        return "";
    }

private:
    void skip_ws() {
        while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
    }
    std::string error(const std::string& what) {
        err_ = "bad JSON: " + what + " at character " + std::to_string(p_ - begin_ + 1);
        return err_;
    }
    bool fail(const std::string& what) {
        error(what);
        return false;
    }
    bool literal(const char* word) {
        const size_t n = std::strlen(word);
        if (size_t(end_ - p_) < n || std::memcmp(p_, word, n) != 0) return fail("bad literal");
        p_ += n;
        return true;
    }

    static void put_utf8(uint32_t cp, std::string* out) {
        if (cp < 0x80) {
            out->push_back(char(cp));
        } else if (cp < 0x800) {
            out->push_back(char(0xc0 | (cp >> 6)));
            out->push_back(char(0x80 | (cp & 0x3f)));
        } else if (cp < 0x10000) {
            out->push_back(char(0xe0 | (cp >> 12)));
            out->push_back(char(0x80 | ((cp >> 6) & 0x3f)));
            out->push_back(char(0x80 | (cp & 0x3f)));
        } else {
            out->push_back(char(0xf0 | (cp >> 18)));
            out->push_back(char(0x80 | ((cp >> 12) & 0x3f)));
            out->push_back(char(0x80 | ((cp >> 6) & 0x3f)));
            out->push_back(char(0x80 | (cp & 0x3f)));
        }
    }
    bool hex4(uint32_t* v) {
        if (end_ - p_ < 4) return fail("truncated \\u escape");
        *v = 0;
        for (int i = 0; i < 4; ++i, ++p_) {
            const char c = *p_;
            const int d = c >= '0' && c <= '9'   ? c - '0'
                          : c >= 'a' && c <= 'f' ? c - 'a' + 10
                          : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                 : -1;
            if (d < 0) return fail("bad \\u escape");
            *v = *v * 16 + uint32_t(d);
        }
        return true;
    }
    // One UTF-8 sequence starting at p_ (not ASCII), checked (no overlong forms, surrogates or
    // code points past U+10FFFF), appended to out.
    bool utf8(std::string* out) {
        const auto* u = reinterpret_cast<const unsigned char*>(p_);
        const size_t left = size_t(end_ - p_);
        size_t n = 0;
        uint32_t cp = 0;
        if (u[0] >= 0xc2 && u[0] <= 0xdf) n = 2, cp = u[0] & 0x1f;
        else if (u[0] >= 0xe0 && u[0] <= 0xef) n = 3, cp = u[0] & 0x0f;
        else if (u[0] >= 0xf0 && u[0] <= 0xf4) n = 4, cp = u[0] & 0x07;
        else return fail("invalid UTF-8");
        if (left < n) return fail("invalid UTF-8");
        for (size_t i = 1; i < n; ++i) {
            if ((u[i] & 0xc0) != 0x80) return fail("invalid UTF-8");
            cp = (cp << 6) | (u[i] & 0x3f);
        }
        if ((n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff))) {
            return fail("invalid UTF-8");
        }
        out->append(p_, n);
        p_ += n;
        return true;
    }
    // A string at p_ (the opening quote), unescaped into out.
    bool string(std::string* out) {
        ++p_;
        out->clear();
        while (p_ < end_) {
            const char c = *p_;
            if (c == '"') {
                ++p_;
                return true;
            }
            if (static_cast<unsigned char>(c) < 0x20) return fail("control character in a string");
            if (static_cast<unsigned char>(c) >= 0x80) {
                if (!utf8(out)) return false;
                continue;
            }
            if (c != '\\') {
                out->push_back(c);
                ++p_;
                continue;
            }
            if (++p_ == end_) break;
            const char e = *p_++;
            switch (e) {
                case '"': out->push_back('"'); break;
                case '\\': out->push_back('\\'); break;
                case '/': out->push_back('/'); break;
                case 'b': out->push_back('\b'); break;
                case 'f': out->push_back('\f'); break;
                case 'n': out->push_back('\n'); break;
                case 'r': out->push_back('\r'); break;
                case 't': out->push_back('\t'); break;
                case 'u': {
                    uint32_t cp;
                    if (!hex4(&cp)) return false;
                    if (cp >= 0xdc00 && cp <= 0xdfff) return fail("unpaired surrogate in a \\u escape");
                    if (cp >= 0xd800 && cp <= 0xdbff) {
                        uint32_t lo;
                        if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u')
                            return fail("unpaired surrogate in a \\u escape");
                        p_ += 2;
                        if (!hex4(&lo)) return false;
                        if (lo < 0xdc00 || lo > 0xdfff) return fail("unpaired surrogate in a \\u escape");
                        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    }
                    put_utf8(cp, out);
                    break;
                }
                default: --p_; return fail("bad escape");
            }
        }
        return fail("unterminated string");
    }
    bool number(MetaValue* v) {
        const char* s = p_;
        if (p_ < end_ && *p_ == '-') ++p_;
        if (p_ == end_ || !std::isdigit(static_cast<unsigned char>(*p_))) return fail("bad number");
        if (*p_ == '0') {
            ++p_;
        } else {
            while (p_ < end_ && std::isdigit(static_cast<unsigned char>(*p_))) ++p_;
        }
        bool integral = true;
        if (p_ < end_ && *p_ == '.') {
            integral = false;
            ++p_;
            if (p_ == end_ || !std::isdigit(static_cast<unsigned char>(*p_))) return fail("bad number");
            while (p_ < end_ && std::isdigit(static_cast<unsigned char>(*p_))) ++p_;
        }
        if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
            integral = false;
            ++p_;
            if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
            if (p_ == end_ || !std::isdigit(static_cast<unsigned char>(*p_))) return fail("bad number");
            while (p_ < end_ && std::isdigit(static_cast<unsigned char>(*p_))) ++p_;
        }
        if (integral) {
            int64_t i = 0;
            const auto r = std::from_chars(s, p_, i);
            if (r.ec == std::errc() && r.ptr == p_) {
                v->kind = MetaValue::Kind::kInteger;
                v->i = i;
                return true;
            }
        }
        // A real, or an integer beyond 64 bits (a real, as SQLite reads one).
        double d = 0;
        const auto r = std::from_chars(s, p_, d);
        if (r.ec != std::errc() || r.ptr != p_ || !std::isfinite(d)) {
            p_ = s;
            return fail("number out of range");
        }
        v->kind = MetaValue::Kind::kReal;
        v->r = d;
        return true;
    }
    // A nested array or object at p_, checked; depth counts the open brackets around it.
    bool nested(int depth) {
        if (depth > kMaxJsonDepth) return fail("nested more than " + std::to_string(kMaxJsonDepth) + " deep");
        const char close = *p_ == '{' ? '}' : ']';
        const bool object = close == '}';
        ++p_;
        skip_ws();
        if (p_ < end_ && *p_ == close) {
            ++p_;
            return true;
        }
        std::string scratch;
        for (;;) {
            skip_ws();
            if (object) {
                if (p_ == end_ || *p_ != '"') return fail("expected a key (a string)");
                if (!string(&scratch)) return false;
                skip_ws();
                if (p_ == end_ || *p_ != ':') return fail("expected ':'");
                ++p_;
                skip_ws();
            }
            if (p_ < end_ && (*p_ == '{' || *p_ == '[')) {
                if (!nested(depth + 1)) return false;
            } else {
                MetaValue v;
                if (!value(&v)) return false;
            }
            skip_ws();
            if (p_ < end_ && *p_ == ',') {
                ++p_;
                continue;
            }
            if (p_ < end_ && *p_ == close) {
                ++p_;
                return true;
            }
            return fail(object ? "expected ',' or '}'" : "expected ',' or ']'");
        }
    }
    bool value(MetaValue* v) {
        *v = MetaValue();
        if (p_ == end_) return fail("expected a value");
        switch (*p_) {
            case '"': v->kind = MetaValue::Kind::kText; return string(&v->s);
            case '{':
            case '[': {
                const char* s = p_;
                if (!nested(1)) return false;
                v->kind = MetaValue::Kind::kText;
                v->s.assign(s, p_);
                return true;
            }
            case 't':
                v->kind = MetaValue::Kind::kInteger;
                v->i = 1;
                return literal("true");
            case 'f':
                v->kind = MetaValue::Kind::kInteger;
                v->i = 0;
                return literal("false");
            case 'n': return literal("null");
            default: return number(v);
        }
    }

    const char* begin_;
    const char* p_;
    const char* end_;
    std::string err_;
};

int64_t line_of(const DocMetadata& md, size_t i) { return i < md.lines.size() ? md.lines[i] : int64_t(i) + 1; }

std::string line_prefix(const DocMetadata& md, size_t i) {
    return md.source + ": line " + std::to_string(line_of(md, i)) + ": ";
}

Status parse_object(const DocMetadata& md, size_t i, std::vector<JsonMember>* out) {
    const std::string err = JsonObjectParser(md.objects[i]).Parse(out);
    if (!err.empty()) return Status::InvalidArgument(line_prefix(md, i) + err);
    return Status::OK();
}

MetaType type_of_decl(const char* decl) {
    const std::string d = upper(decl ? decl : "");
    if (d == "INTEGER") return MetaType::kInteger;
    if (d == "REAL") return MetaType::kReal;
    return MetaType::kText;
}

std::string sql_type(MetaType t) { return upper(MetaTypeName(t)); }

}  // namespace

Status CheckMetaColumnName(const std::string& name, const std::string& what) {
    const bool ok = !name.empty() && name.size() <= kMaxColumnName &&
                    (std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_') &&
                    std::all_of(name.begin(), name.end(),
                                [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
    if (!ok) {
        return Status::InvalidArgument(what + ": bad column name '" + shown(name) +
                                       "' (letters, digits and _, not starting with a digit, at most 64 characters)");
    }
    const std::string l = lower(name);
    if (l == "doc" || l == "id" || is_keyword(name)) {
        return Status::InvalidArgument(what + ": column name '" + name + "' is reserved");
    }
    return Status::OK();
}

Status ResolveMetadata(const DocMetadata& md, const std::vector<std::string>& ids,
                       const std::vector<MetaColumn>& existing, MetaRows* out) {
    const size_t n = ids.size();
    *out = MetaRows();
    out->columns = existing;
    out->n_existing = existing.size();
    out->cells.assign(n, MetaCells());
    std::unordered_map<std::string, int> by_name;  // lower-case name -> column
    for (size_t c = 0; c < existing.size(); ++c) by_name.emplace(lower(existing[c].name), int(c));
    for (const MetaColumn& d : md.declared) {
        TMS_RETURN_IF_ERROR(CheckMetaColumnName(d.name, md.source));
        auto it = by_name.find(lower(d.name));
        if (it != by_name.end()) {
            const MetaColumn& e = out->columns[size_t(it->second)];
            if (size_t(it->second) >= out->n_existing) {
                return Status::InvalidArgument(md.source + ": column '" + d.name + "' declared twice");
            }
            if (e.type != d.type) {
                return Status::InvalidArgument(md.source + ": column '" + e.name + "' is " + MetaTypeName(e.type) +
                                               " in the index, declared " + MetaTypeName(d.type));
            }
            continue;
        }
        by_name.emplace(lower(d.name), int(out->columns.size()));
        out->columns.push_back(d);
    }
    if (out->columns.size() > size_t(kMaxMetaColumns)) {
        return Status::InvalidArgument(md.source + ": more than " + std::to_string(kMaxMetaColumns) + " columns");
    }
    const size_t n_fixed = out->columns.size();  // existing and declared: their types are known
    // Inference for the other columns: what kinds of values each holds.
    struct Seen {
        bool integer = false, real = false, text = false;
    };
    std::vector<Seen> seen;
    if (md.objects.empty() && n == 0) return Status::OK();
    if (md.objects.empty()) {
        return Status::InvalidArgument(md.source + ": no objects for " + std::to_string(n) + " documents");
    }
    std::vector<JsonMember> members;
    TMS_RETURN_IF_ERROR(parse_object(md, 0, &members));
    const bool keyed = std::any_of(members.begin(), members.end(), [](const JsonMember& m) { return m.key == "id"; });
    std::unordered_map<std::string_view, size_t> doc_of;  // keyed: external id -> batch document
    std::vector<size_t> owner;                            // keyed: the object of each document + 1
    if (keyed) {
        doc_of.reserve(n);
        for (size_t d = 0; d < n; ++d) doc_of.emplace(ids[d], d);
        owner.assign(n, 0);
    } else if (md.objects.size() != n) {
        if (md.objects.size() > n) {
            return Status::InvalidArgument(line_prefix(md, n) + "more objects than documents (" + std::to_string(n) +
                                           "; one per document, in order, or each naming its document by \"id\")");
        }
        return Status::InvalidArgument(
            md.source + ": " + std::to_string(md.objects.size()) +
            (md.objects.size() == 1 ? " object for " : " objects for ") + std::to_string(n) +
            " documents (one per document, in order, or each naming its document by \"id\")");
    }
    std::vector<int> used;  // columns named by the current object (no column twice)
    for (size_t i = 0; i < md.objects.size(); ++i) {
        if (i > 0) TMS_RETURN_IF_ERROR(parse_object(md, i, &members));
        const std::string at = line_prefix(md, i);
        size_t doc = i;
        if (keyed) {
            auto m = std::find_if(members.begin(), members.end(), [](const JsonMember& x) { return x.key == "id"; });
            if (m == members.end()) {
                return Status::InvalidArgument(at +
                                               "no \"id\" (the first object names its document by \"id\", so every "
                                               "object must)");
            }
            std::string id;
            if (m->first == '"') {
                id = m->value.s;
            } else if (m->value.kind == MetaValue::Kind::kInteger && m->first != 't' && m->first != 'f') {
                id = std::to_string(m->value.i);
            } else {
                return Status::InvalidArgument(at + "\"id\" must be a string or an integer");
            }
            auto it = doc_of.find(id);
            if (it == doc_of.end()) return Status::InvalidArgument(at + "unknown document id '" + shown(id) + "'");
            doc = it->second;
            if (owner[doc]) {
                return Status::InvalidArgument(at + "document '" + shown(id) + "' already has an object (line " +
                                               std::to_string(line_of(md, owner[doc] - 1)) + ")");
            }
            owner[doc] = i + 1;
        }
        used.clear();
        bool id_seen = false;
        MetaCells& cells = out->cells[doc];
        for (JsonMember& m : members) {
            if (m.key == "id") {
                if (!keyed) {
                    return Status::InvalidArgument(at +
                                                   "\"id\" names a document only when the first object has one too");
                }
                if (id_seen) return Status::InvalidArgument(at + "\"id\" given twice");
                id_seen = true;
                continue;
            }
            auto it = by_name.find(lower(m.key));
            int c;
            if (it != by_name.end()) {
                c = it->second;
            } else {
                TMS_RETURN_IF_ERROR(CheckMetaColumnName(m.key, at.substr(0, at.size() - 2)));
                if (int(out->columns.size()) >= kMaxMetaColumns) {
                    return Status::InvalidArgument(at + "more than " + std::to_string(kMaxMetaColumns) + " columns");
                }
                c = int(out->columns.size());
                by_name.emplace(lower(m.key), c);
                out->columns.push_back(MetaColumn{m.key, MetaType::kText});
            }
            if (std::find(used.begin(), used.end(), c) != used.end()) {
                return Status::InvalidArgument(at + "column '" + out->columns[size_t(c)].name + "' given twice");
            }
            used.push_back(c);
            if (size_t(c) < n_fixed) {  // a known type: the value must be one (SQLite would store anything)
                const MetaColumn& col = out->columns[size_t(c)];
                const MetaValue::Kind k = m.value.kind;
                const bool fits = k == MetaValue::Kind::kNull || col.type == MetaType::kText ||
                                  k == MetaValue::Kind::kInteger ||
                                  (k == MetaValue::Kind::kReal && col.type == MetaType::kReal);
                if (!fits) {
                    const char* got = k == MetaValue::Kind::kReal ? "a real number"
                                      : m.first == '['            ? "an array"
                                      : m.first == '{'            ? "an object"
                                                                  : "a string";
                    return Status::InvalidArgument(at + "column '" + col.name + "' is " + MetaTypeName(col.type) +
                                                   (size_t(c) < out->n_existing ? " in the index" : " as declared") +
                                                   ", got " + got +
                                                   (k == MetaValue::Kind::kText ? " \"" + shown(m.value.s) + "\"" : ""));
                }
            } else {
                seen.resize(out->columns.size() - n_fixed);
                Seen& s = seen[size_t(c) - n_fixed];
                s.integer |= m.value.kind == MetaValue::Kind::kInteger;
                s.real |= m.value.kind == MetaValue::Kind::kReal;
                s.text |= m.value.kind == MetaValue::Kind::kText;
            }
            if (m.value.kind != MetaValue::Kind::kNull) cells.emplace_back(c, std::move(m.value));
        }
    }
    seen.resize(out->columns.size() - n_fixed);
    for (size_t c = n_fixed; c < out->columns.size(); ++c) {
        const Seen& s = seen[c - n_fixed];
        out->columns[c].type = s.text || (!s.integer && !s.real) ? MetaType::kText
                               : s.real                          ? MetaType::kReal
                                                                 : MetaType::kInteger;
    }
    return Status::OK();
}

}  // namespace index

Status LoadMetadataJsonl(const std::string& path, DocMetadata* out) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) return Status::InvalidArgument(path + ": is a directory (expected a JSONL file)");
    std::ifstream f(path, std::ios::binary);
    if (!f) return Status::NotFound(path + ": cannot open");
    DocMetadata md;  // objects and lines, checked one by one
    md.source = path;
    std::string line;
    std::vector<index::JsonMember> members;
    for (int64_t no = 1; std::getline(f, line); ++no) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (no == 1 && line.compare(0, 3, "\xef\xbb\xbf") == 0) line.erase(0, 3);  // a UTF-8 byte order mark
        if (line.find_first_not_of(" \t") == std::string::npos) continue;
        md.objects.push_back(std::move(line));
        md.lines.push_back(no);
        TMS_RETURN_IF_ERROR(index::parse_object(md, md.objects.size() - 1, &members));
    }
    if (f.bad()) return Status::IOError(path + ": read failed");
    out->objects = std::move(md.objects);
    out->lines = std::move(md.lines);
    out->source = path;
    return Status::OK();
}

Status ParseMetaColumns(const std::string& spec, std::vector<MetaColumn>* out) {
    out->clear();
    if (spec.find_first_not_of(" \t") == std::string::npos) return Status::OK();
    std::stringstream ss(spec);
    std::unordered_set<std::string> names;
    for (std::string item; std::getline(ss, item, ',');) {
        const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
        item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
        const auto colon = item.find(':');
        if (colon == std::string::npos) {
            return Status::InvalidArgument("metadata types: '" + index::shown(item) +
                                           "' is not NAME:TYPE (types integer, real or text)");
        }
        MetaColumn c;
        c.name = item.substr(0, colon);
        while (!c.name.empty() && (c.name.back() == ' ' || c.name.back() == '\t')) c.name.pop_back();
        std::string t = index::lower(item.substr(colon + 1));
        t.erase(0, std::min(t.size(), t.find_first_not_of(" \t")));
        TMS_RETURN_IF_ERROR(index::CheckMetaColumnName(c.name, "metadata types"));
        if (t == "integer" || t == "int") c.type = MetaType::kInteger;
        else if (t == "real" || t == "float") c.type = MetaType::kReal;
        else if (t == "text" || t == "str") c.type = MetaType::kText;
        else {
            return Status::InvalidArgument("metadata types: bad type '" + index::shown(t) + "' for column '" + c.name +
                                           "' (integer, real or text)");
        }
        if (!names.insert(index::lower(c.name)).second) {
            return Status::InvalidArgument("metadata types: column '" + c.name + "' given twice");
        }
        out->push_back(std::move(c));
    }
    if (!spec.empty() && spec.back() == ',') return Status::InvalidArgument("metadata types: trailing ','");
    return Status::OK();
}

namespace index {
namespace {

// ---- SQLite -------------------------------------------------------------------------------

struct Stmt {
    sqlite3_stmt* s = nullptr;
    Stmt() = default;
    Stmt(const Stmt&) = delete;
    Stmt& operator=(const Stmt&) = delete;
    Stmt(Stmt&& o) noexcept : s(std::exchange(o.s, nullptr)) {}
    void reset() {
        sqlite3_finalize(s);
        s = nullptr;
    }
    ~Stmt() { reset(); }
};

struct Conn {
    sqlite3* db = nullptr;
    Conn() = default;
    Conn(const Conn&) = delete;
    Conn& operator=(const Conn&) = delete;
    ~Conn() { sqlite3_close_v2(db); }
};

// An SQLite failure as a Status; `what` names the file.
Status sql_error(sqlite3* db, int rc, const std::string& what) {
    // The handle may not hold the error (a backup step fails on its own object): then rc says it.
    const std::string msg = db && sqlite3_errcode(db) != SQLITE_OK ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    switch (rc & 0xff) {
        case SQLITE_CORRUPT:
        case SQLITE_NOTADB: return Status::Corruption(what + ": damaged metadata file (" + msg + ")");
        case SQLITE_FULL: return Status::IOError(what + ": disk full");
        case SQLITE_NOMEM: return Status::ResourceExhausted(what + ": out of memory");
        case SQLITE_BUSY:
        case SQLITE_LOCKED: return Status::IOError(what + ": locked by another process for too long (" + msg + ")");
        default: return Status::IOError(what + ": " + msg);
    }
}

Status exec(sqlite3* db, const std::string& sql, const std::string& what) {
    const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr);
    return rc == SQLITE_OK ? Status::OK() : sql_error(db, rc, what);
}

Status prepare(sqlite3* db, const std::string& sql, const std::string& what, Stmt* out) {
    out->reset();
    const int rc = sqlite3_prepare_v2(db, sql.c_str(), int(sql.size()), &out->s, nullptr);
    return rc == SQLITE_OK ? Status::OK() : sql_error(db, rc, what);
}

// Opens `path` (an existing file unless `create`). Readers open it read-write too, where the file
// system allows, so that SQLite can roll back what a killed writer's transaction left in it (a
// hot journal) before reading. Writers' commits are durable when they return: synchronous=EXTRA
// also syncs the directory after the journal's deletion, which is the commit in DELETE mode.
Status open_file(const std::string& path, bool create, bool writer, Conn* out) {
    const int flags = SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0) | SQLITE_OPEN_NOMUTEX;
    const int rc = sqlite3_open_v2(path.c_str(), &out->db, flags, nullptr);
    if (rc != SQLITE_OK) return sql_error(out->db, rc, path);
    sqlite3_extended_result_codes(out->db, 1);
    sqlite3_busy_timeout(out->db, kBusyTimeoutMs);
    if (writer) TMS_RETURN_IF_ERROR(exec(out->db, "PRAGMA journal_mode=DELETE; PRAGMA synchronous=EXTRA", path));
    return Status::OK();
}

// The format version and columns of the file's docs table.
Status read_schema(sqlite3* db, const std::string& what, std::vector<MetaColumn>* columns) {
    Stmt st;
    TMS_RETURN_IF_ERROR(prepare(db, "PRAGMA user_version", what, &st));
    if (sqlite3_step(st.s) != SQLITE_ROW) return sql_error(db, sqlite3_errcode(db), what);
    const int version = sqlite3_column_int(st.s, 0);
    if (version != kMetadataFormatVersion) {
        return Status::NotSupported(what + ": metadata format version " + std::to_string(version) +
                                    " is not supported by this build (reads " + std::to_string(kMetadataFormatVersion) +
                                    ")");
    }
    TMS_RETURN_IF_ERROR(prepare(db, "PRAGMA table_info(docs)", what, &st));
    columns->clear();
    int i = 0, rc;
    for (; (rc = sqlite3_step(st.s)) == SQLITE_ROW; ++i) {
        const auto* name = reinterpret_cast<const char*>(sqlite3_column_text(st.s, 1));
        const std::string nm = name ? name : "";
        if (i < 2) {
            if (nm != (i == 0 ? "doc" : "id")) return Status::Corruption(what + ": not a metadata file (table docs)");
            continue;
        }
        columns->push_back(MetaColumn{nm, type_of_decl(reinterpret_cast<const char*>(sqlite3_column_text(st.s, 2)))});
    }
    if (rc != SQLITE_DONE) return sql_error(db, rc, what);
    if (i < 2) return Status::Corruption(what + ": not a metadata file (no table docs)");
    return Status::OK();
}

Status bind_value(sqlite3* db, sqlite3_stmt* s, int at, const MetaValue& v, const std::string& what) {
    int rc = SQLITE_OK;
    switch (v.kind) {
        case MetaValue::Kind::kNull: rc = sqlite3_bind_null(s, at); break;
        case MetaValue::Kind::kInteger: rc = sqlite3_bind_int64(s, at, v.i); break;
        case MetaValue::Kind::kReal: rc = sqlite3_bind_double(s, at, v.r); break;
        case MetaValue::Kind::kText:
            rc = sqlite3_bind_text64(s, at, v.s.data(), v.s.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
            break;
    }
    return rc == SQLITE_OK ? Status::OK() : sql_error(db, rc, what);
}

MetaValue column_value(sqlite3_stmt* s, int c) {
    MetaValue v;
    switch (sqlite3_column_type(s, c)) {
        case SQLITE_INTEGER:
            v.kind = MetaValue::Kind::kInteger;
            v.i = sqlite3_column_int64(s, c);
            break;
        case SQLITE_FLOAT:
            v.kind = MetaValue::Kind::kReal;
            v.r = sqlite3_column_double(s, c);
            break;
        case SQLITE_NULL: break;
        default: {  // text (or a blob, which no writer stores)
            v.kind = MetaValue::Kind::kText;
            const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s, c));
            v.s.assign(p ? p : "", size_t(sqlite3_column_bytes(s, c)));
        }
    }
    return v;
}

std::string sql_name(const std::string& column) { return "\"" + column + "\""; }

bool file_exists(const std::string& path) {
    std::error_code ec;
    return fs::exists(path, ec);
}

}  // namespace

// ---- writing ---------------------------------------------------------------------------------

struct MetadataWriter::Db {
    Conn conn;
    Stmt insert;  // for the current columns
    bool in_txn = false;
    ~Db() {
        if (in_txn) (void)sqlite3_exec(conn.db, "ROLLBACK", nullptr, nullptr, nullptr);
    }
};

MetadataWriter::~MetadataWriter() {
    db_.reset();
    if (!tmp_.empty()) {
        std::error_code ec;
        fs::remove(tmp_, ec);
        fs::remove(tmp_ + "-journal", ec);
    }
}

Status MetadataWriter::Create(const std::string& path, const std::vector<MetaColumn>& columns,
                              std::unique_ptr<MetadataWriter>* out) {
    std::unique_ptr<MetadataWriter> w(new MetadataWriter());
    w->path_ = path;
    w->tmp_ = path + ".tmp";
    std::error_code ec;
    fs::remove(w->tmp_, ec);  // what an interrupted writer left (the caller holds the writer lock)
    fs::remove(w->tmp_ + "-journal", ec);
    w->db_ = std::make_unique<Db>();
    TMS_RETURN_IF_ERROR(open_file(w->tmp_, true, true, &w->db_->conn));
    std::string ddl = "BEGIN; PRAGMA user_version=" + std::to_string(kMetadataFormatVersion) +
                      "; CREATE TABLE docs (doc INTEGER PRIMARY KEY, id TEXT NOT NULL";
    for (const MetaColumn& c : columns) ddl += ", " + sql_name(c.name) + " " + sql_type(c.type);
    ddl += "); CREATE INDEX docs_id ON docs(id);";
    TMS_RETURN_IF_ERROR(exec(w->db_->conn.db, ddl, path));
    w->db_->in_txn = true;
    w->columns_ = columns;
    *out = std::move(w);
    return Status::OK();
}

Status MetadataWriter::Open(const std::string& path, std::unique_ptr<MetadataWriter>* out) {
    std::unique_ptr<MetadataWriter> w(new MetadataWriter());
    w->path_ = path;
    w->db_ = std::make_unique<Db>();
    TMS_RETURN_IF_ERROR(open_file(path, false, true, &w->db_->conn));
    TMS_RETURN_IF_ERROR(exec(w->db_->conn.db, "BEGIN IMMEDIATE", path));
    w->db_->in_txn = true;
    TMS_RETURN_IF_ERROR(read_schema(w->db_->conn.db, path, &w->columns_));
    *out = std::move(w);
    return Status::OK();
}

Status MetadataWriter::AddColumns(const std::vector<MetaColumn>& cols) {
    for (const MetaColumn& c : cols) {
        TMS_RETURN_IF_ERROR(CheckMetaColumnName(c.name, path_));
        TMS_RETURN_IF_ERROR(
            exec(db_->conn.db, "ALTER TABLE docs ADD COLUMN " + sql_name(c.name) + " " + sql_type(c.type), path_));
        columns_.push_back(c);
    }
    if (!cols.empty()) db_->insert.reset();
    return Status::OK();
}

Status MetadataWriter::DeleteFrom(int64_t doc) {
    Stmt st;
    TMS_RETURN_IF_ERROR(prepare(db_->conn.db, "DELETE FROM docs WHERE doc >= ?1", path_, &st));
    sqlite3_bind_int64(st.s, 1, doc);
    const int rc = sqlite3_step(st.s);
    return rc == SQLITE_DONE ? Status::OK() : sql_error(db_->conn.db, rc, path_);
}

Status MetadataWriter::Insert(int64_t doc, const std::string& id, const MetaCells& cells) {
    sqlite3* db = db_->conn.db;
    if (!db_->insert.s) {
        std::string sql = "INSERT INTO docs (doc, id", vals = "?1, ?2";
        for (size_t c = 0; c < columns_.size(); ++c) {
            sql += ", " + sql_name(columns_[c].name);
            vals += ", ?" + std::to_string(c + 3);
        }
        TMS_RETURN_IF_ERROR(prepare(db, sql + ") VALUES (" + vals + ")", path_, &db_->insert));
    }
    sqlite3_stmt* s = db_->insert.s;
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    sqlite3_bind_int64(s, 1, doc);
    sqlite3_bind_text64(s, 2, id.data(), id.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
    for (const auto& [c, v] : cells) {
        if (c < 0 || size_t(c) >= columns_.size()) return Status::Internal(path_ + ": metadata cell of no column");
        TMS_RETURN_IF_ERROR(bind_value(db, s, c + 3, v, path_));
    }
    const int rc = sqlite3_step(s);
    return rc == SQLITE_DONE ? Status::OK() : sql_error(db, rc, path_);
}

Status MetadataWriter::Commit() {
    db_->insert.reset();
    TMS_RETURN_IF_ERROR(exec(db_->conn.db, "COMMIT", path_));
    db_->in_txn = false;
    db_.reset();
    if (tmp_.empty()) return Status::OK();
    // The commit synced the new file. A journal of an older file at the target would be taken
    // for this one's: none may survive the rename.
    std::error_code ec;
    fs::remove(path_ + "-journal", ec);
    fs::rename(tmp_, path_, ec);
    if (ec) return Status::IOError(path_ + ": cannot move " + tmp_ + " to it: " + ec.message());
    tmp_.clear();
    SyncDir(fs::path(path_).parent_path());
    return Status::OK();
}

// ---- reading -------------------------------------------------------------------------------

Status ReadMetadataInfo(const std::string& path, int64_t n_docs, std::vector<MetaColumn>* columns, int64_t* rows) {
    columns->clear();
    *rows = -1;
    if (!file_exists(path)) return Status::OK();
    Conn c;
    TMS_RETURN_IF_ERROR(open_file(path, false, false, &c));
    TMS_RETURN_IF_ERROR(exec(c.db, "BEGIN", path));  // schema and count of one state
    TMS_RETURN_IF_ERROR(read_schema(c.db, path, columns));
    Stmt st;
    TMS_RETURN_IF_ERROR(prepare(c.db, "SELECT count(*) FROM docs WHERE doc >= 0 AND doc < ?1", path, &st));
    sqlite3_bind_int64(st.s, 1, n_docs);
    const int rc = sqlite3_step(st.s);
    if (rc != SQLITE_ROW) return sql_error(c.db, rc, path);
    *rows = sqlite3_column_int64(st.s, 0);
    return Status::OK();
}

Status ForEachMetadataRow(const std::string& path, int64_t n_docs, std::vector<MetaColumn>* columns,
                          const std::function<Status(int64_t, const std::string&, const MetaCells&)>& row) {
    Conn c;
    TMS_RETURN_IF_ERROR(open_file(path, false, false, &c));
    TMS_RETURN_IF_ERROR(exec(c.db, "BEGIN", path));
    TMS_RETURN_IF_ERROR(read_schema(c.db, path, columns));
    Stmt st;
    TMS_RETURN_IF_ERROR(prepare(c.db, "SELECT * FROM docs WHERE doc >= 0 AND doc < ?1 ORDER BY doc", path, &st));
    sqlite3_bind_int64(st.s, 1, n_docs);
    MetaCells cells;
    std::string id;
    int rc;
    while ((rc = sqlite3_step(st.s)) == SQLITE_ROW) {
        cells.clear();
        const int64_t doc = sqlite3_column_int64(st.s, 0);
        const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(st.s, 1));
        id.assign(p ? p : "", size_t(sqlite3_column_bytes(st.s, 1)));
        for (int k = 0; k < int(columns->size()); ++k) {
            MetaValue v = column_value(st.s, k + 2);
            if (v.kind != MetaValue::Kind::kNull) cells.emplace_back(k, std::move(v));
        }
        TMS_RETURN_IF_ERROR(row(doc, id, cells));
    }
    return rc == SQLITE_DONE ? Status::OK() : sql_error(c.db, rc, path);
}

// ---- the snapshot ----------------------------------------------------------------------------

namespace {

// Only reads of the table and the filter's functions (LIKE and GLOB are functions too) are
// allowed in a snapshot's statements, whatever text reaches prepare.
int filter_authorizer(void*, int action, const char* a, const char* b, const char*, const char*) {
    switch (action) {
        case SQLITE_SELECT: return SQLITE_OK;
        case SQLITE_READ: return a && std::strcmp(a, "docs") == 0 ? SQLITE_OK : SQLITE_DENY;
        case SQLITE_FUNCTION: {
            const std::string f = lower(b ? b : "");
            if (f == "like" || f == "glob") return SQLITE_OK;
            return std::any_of(std::begin(kFilterFunctions), std::end(kFilterFunctions),
                               [&](const char* k) { return f == k; })
                       ? SQLITE_OK
                       : SQLITE_DENY;
        }
        default: return SQLITE_DENY;
    }
}

}  // namespace

struct MetadataSnapshot::Impl {
    Conn mem;
    std::mutex mu;
    FilterDeadline deadline;  // of the evaluation under way (mu held)
    int64_t time_ms = SearcherOptions().filter_time_ms, max_bytes = SearcherOptions().filter_max_bytes;
    struct Compiled {
        std::string where;
        Stmt stmt;
        std::vector<FilterParam> params;
        std::vector<uint32_t> bits;  // the result, once evaluated (count >= 0)
        int64_t count = -1;
    };
    std::list<Compiled> lru;  // most recent first
    std::unordered_map<std::string, std::list<Compiled>::iterator> by_where;
    std::unordered_set<std::string> indexed;  // columns with an index

    // An index on each of `columns` that has none. The authorizer admits filters only, so it
    // is lifted for these statements (their names are checked columns, never user text).
    Status Index(const std::vector<std::string>& columns) {
        for (const std::string& c : columns) {
            if (indexed.count(c)) continue;
            sqlite3_set_authorizer(mem.db, nullptr, nullptr);
            // Stored values of any length are indexed (the limit binds what filters compute).
            const int limit = sqlite3_limit(mem.db, SQLITE_LIMIT_LENGTH, INT32_MAX);
            const std::string sql = "CREATE INDEX IF NOT EXISTS " + sql_name("tms_ix_" + c) + " ON docs(" + sql_name(c) + ")";
            const int rc = sqlite3_exec(mem.db, sql.c_str(), nullptr, nullptr, nullptr);
            sqlite3_limit(mem.db, SQLITE_LIMIT_LENGTH, limit);
            sqlite3_set_authorizer(mem.db, filter_authorizer, nullptr);
            if (rc != SQLITE_OK) return Status::Internal(std::string("filter: indexing ") + c + ": " + sqlite3_errmsg(mem.db));
            indexed.insert(c);
        }
        return Status::OK();
    }
};

MetadataSnapshot::~MetadataSnapshot() = default;

Status MetadataSnapshot::Load(const std::string& index_dir, int64_t n_docs, std::unique_ptr<MetadataSnapshot>* out) {
    out->reset();
    const std::string path = (fs::path(index_dir) / kMetadataFile).string();
    if (!file_exists(path)) return Status::OK();
    std::unique_ptr<MetadataSnapshot> s(new MetadataSnapshot());
    s->impl_ = std::make_unique<Impl>();
    s->n_docs_ = n_docs;
    sqlite3*& mem = s->impl_->mem.db;
    int rc =
        sqlite3_open_v2(":memory:", &mem, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
    if (rc != SQLITE_OK) return sql_error(mem, rc, path);
    {
        Conn file;
        TMS_RETURN_IF_ERROR(open_file(path, false, false, &file));
        sqlite3_backup* b = sqlite3_backup_init(mem, "main", file.db, "main");
        if (!b) return sql_error(mem, sqlite3_errcode(mem), path);
        rc = sqlite3_backup_step(b, -1);  // every page, in one read transaction of the file
        sqlite3_backup_finish(b);
        if (rc != SQLITE_DONE) return sql_error(file.db, rc, path);
    }
    TMS_RETURN_IF_ERROR(read_schema(mem, path, &s->columns_));
    Stmt st;
    TMS_RETURN_IF_ERROR(prepare(mem, "DELETE FROM docs WHERE doc >= ?1 OR doc < 0", path, &st));
    sqlite3_bind_int64(st.s, 1, n_docs);
    if ((rc = sqlite3_step(st.s)) != SQLITE_DONE) return sql_error(mem, rc, path);
    TMS_RETURN_IF_ERROR(prepare(mem, "SELECT count(*) FROM docs", path, &st));
    if ((rc = sqlite3_step(st.s)) != SQLITE_ROW) return sql_error(mem, rc, path);
    s->rows_ = sqlite3_column_int64(st.s, 0);
    st.reset();  // no statement may be active while functions are replaced
    sqlite3_set_authorizer(mem, filter_authorizer, nullptr);
    // Bounded evaluation: our LIKE, GLOB and instr() (linear, interruptible), a check of the
    // deadline every 1,000 virtual-machine steps, and a limit on every value's length.
    if (!RegisterFilterFunctions(mem, &s->impl_->deadline)) return sql_error(mem, sqlite3_errcode(mem), path);
    sqlite3_progress_handler(
        mem, 1000, [](void* d) { return static_cast<FilterDeadline*>(d)->Check() ? 1 : 0; }, &s->impl_->deadline);
    s->SetLimits(s->impl_->time_ms, s->impl_->max_bytes);
    *out = std::move(s);
    return Status::OK();
}

void MetadataSnapshot::SetLimits(int64_t time_ms, int64_t max_bytes) {
    std::lock_guard<std::mutex> g(impl_->mu);
    impl_->time_ms = std::max<int64_t>(1, time_ms);
    impl_->max_bytes = std::clamp<int64_t>(max_bytes, 1, INT32_MAX);
    sqlite3_limit(impl_->mem.db, SQLITE_LIMIT_LENGTH, int(impl_->max_bytes));
}

Status MetadataSnapshot::Filter(const std::string& where, std::vector<uint32_t>* bits, int64_t* count) const {
    Impl& im = *impl_;
    std::lock_guard<std::mutex> g(im.mu);
    auto it = im.by_where.find(where);
    if (it != im.by_where.end()) {
        im.lru.splice(im.lru.begin(), im.lru, it->second);
        if (it->second->count >= 0) {
            *bits = it->second->bits;
            *count = it->second->count;
            return Status::OK();
        }
    } else {
        Impl::Compiled c;
        c.where = where;
        std::string sql;
        std::vector<std::string> used;
        TMS_RETURN_IF_ERROR(CompileFilter(where, columns_, &sql, &c.params, &used));
        TMS_RETURN_IF_ERROR(im.Index(used));
        sql = "SELECT doc FROM docs WHERE (" + sql + ")";
        const char* tail = nullptr;
        if (sqlite3_prepare_v2(im.mem.db, sql.c_str(), int(sql.size()), &c.stmt.s, &tail) != SQLITE_OK || !c.stmt.s ||
            (tail && *tail)) {
            return Status::InvalidArgument(std::string("filter: ") + sqlite3_errmsg(im.mem.db));
        }
        im.lru.push_front(std::move(c));
        im.by_where[where] = im.lru.begin();
        if (im.lru.size() > size_t(kFilterCache)) {
            im.by_where.erase(im.lru.back().where);
            im.lru.pop_back();
        }
    }
    Impl::Compiled& c = im.lru.front();
    sqlite3_stmt* s = c.stmt.s;
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    for (size_t p = 0; p < c.params.size(); ++p) {
        if (!bind_value(im.mem.db, s, int(p) + 1, c.params[p], "filter").ok()) {
            return Status::InvalidArgument(std::string("filter: ") + sqlite3_errmsg(im.mem.db));
        }
    }
    bits->assign(size_t((n_docs_ + 31) / 32), 0u);
    int64_t n = 0;
    int rc;
    im.deadline = FilterDeadline{std::chrono::steady_clock::now() + std::chrono::milliseconds(im.time_ms)};
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        const int64_t d = sqlite3_column_int64(s, 0);
        if (d < 0 || d >= n_docs_) continue;
        uint32_t& w = (*bits)[size_t(d / 32)];
        const uint32_t m = 1u << (d % 32);
        n += (w & m) ? 0 : 1;
        w |= m;
    }
    const bool timed_out = im.deadline.passed;
    im.deadline = FilterDeadline{};
    if (rc != SQLITE_DONE) {
        const std::string msg = sqlite3_errmsg(im.mem.db);
        sqlite3_reset(s);
        if (timed_out) {
            return Status::InvalidArgument("filter: ran longer than " + std::to_string(im.time_ms) +
                                           " ms (the filter's time limit, --filter-time-ms)");
        }
        if (rc == SQLITE_TOOBIG) {
            return Status::InvalidArgument("filter: a value longer than " + std::to_string(im.max_bytes) +
                                           " bytes (the filter's memory limit, --filter-max-bytes)");
        }
        return Status::InvalidArgument("filter: " + msg);
    }
    sqlite3_reset(s);
    *count = n;
    c.bits = *bits;
    c.count = n;
    return Status::OK();
}

// ---- the filter language --------------------------------------------------------------------

Status CompileFilter(const std::string& where, const std::vector<MetaColumn>& columns, std::string* sql,
                     std::vector<FilterParam>* params, std::vector<std::string>* used) {
    sql->clear();
    params->clear();
    if (used) used->clear();
    if (where.size() > kMaxFilterChars) {
        return Status::InvalidArgument("filter: longer than " + std::to_string(kMaxFilterChars) + " characters");
    }
    std::unordered_map<std::string, std::string> names;  // lower-case -> as declared
    names.emplace("id", "id");
    for (const MetaColumn& c : columns) names.emplace(lower(c.name), c.name);
    const auto unknown_column = [&](const std::string& name) {
        std::string list = "id";
        for (size_t c = 0; c < columns.size(); ++c) {
            if (c == 20) {
                list += ", ...";
                break;
            }
            list += ", " + columns[c].name;
        }
        return Status::InvalidArgument("filter: unknown column '" + shown(name) + "' (columns: " + list + ")");
    };
    const auto at = [&](size_t i) { return " at character " + std::to_string(i + 1); };
    const auto unexpected = [&](size_t i, size_t len) {
        return Status::InvalidArgument("filter: unexpected '" + shown(std::string_view(where).substr(i, len)) + "'" +
                                       at(i));
    };
    const auto emit = [&](const std::string& tok) {
        if (!sql->empty()) sql->push_back(' ');
        *sql += tok;
    };
    const auto column = [&](const std::string& name) {
        emit(sql_name(name));
        if (used && std::find(used->begin(), used->end(), name) == used->end()) used->push_back(name);
    };
    const auto param = [&](MetaValue v, size_t i) -> Status {
        if (int(params->size()) >= kMaxFilterParams) {
            return Status::InvalidArgument("filter: more than " + std::to_string(kMaxFilterParams) + " literals" +
                                           at(i));
        }
        params->push_back(std::move(v));
        emit("?" + std::to_string(params->size()));
        return Status::OK();
    };
    const size_t n = where.size();
    const auto ident_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
    size_t i = 0;
    while (i < n) {
        const char c = where[i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
            ++i;
            continue;
        }
        if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
            size_t j = i;
            while (j < n && ident_char(where[j])) ++j;
            const std::string word = where.substr(i, j - i);
            size_t k = j;
            while (k < n && std::isspace(static_cast<unsigned char>(where[k]))) ++k;
            const bool call = k < n && where[k] == '(';
            const std::string l = lower(word);
            if (is_keyword(word)) {
                emit(upper(word));
            } else if (call && std::any_of(std::begin(kFilterFunctions), std::end(kFilterFunctions),
                                           [&](const char* f) { return l == f; })) {
                emit(l);
            } else if (auto it = names.find(l); it != names.end()) {
                column(it->second);
            } else if (call) {
                std::string allowed;
                for (const char* f : kFilterFunctions) allowed += std::string(allowed.empty() ? "" : ", ") + f;
                return Status::InvalidArgument("filter: function '" + shown(word) +
                                               "' is not allowed (allowed: " + allowed + ")");
            } else {
                return unknown_column(word);
            }
            i = j;
            continue;
        }
        if (c == '"' || c == '\'') {
            std::string text;
            size_t j = i + 1;
            for (;; ++j) {
                if (j >= n) {
                    return Status::InvalidArgument(std::string("filter: unterminated ") +
                                                   (c == '"' ? "quoted name" : "string") + at(i));
                }
                if (where[j] == c) {
                    if (j + 1 < n && where[j + 1] == c) {
                        text.push_back(c);
                        ++j;
                        continue;
                    }
                    break;
                }
                text.push_back(where[j]);
            }
            if (c == '"') {
                auto it = names.find(lower(text));
                if (it == names.end()) return unknown_column(text);
                column(it->second);
            } else {
                MetaValue v;
                v.kind = MetaValue::Kind::kText;
                v.s = std::move(text);
                TMS_RETURN_IF_ERROR(param(std::move(v), i));
            }
            i = j + 1;
            continue;
        }
        if (std::isdigit(static_cast<unsigned char>(c)) ||
            (c == '.' && i + 1 < n && std::isdigit(static_cast<unsigned char>(where[i + 1])))) {
            MetaValue v;
            size_t j = i;
            if (c == '0' && i + 1 < n && (where[i + 1] == 'x' || where[i + 1] == 'X')) {
                j = i + 2;
                while (j < n && std::isxdigit(static_cast<unsigned char>(where[j]))) ++j;
                uint64_t u = 0;
                if (j == i + 2 || j - (i + 2) > 16 || (j < n && ident_char(where[j]))) {
                    return Status::InvalidArgument("filter: bad hex number '" + shown(where.substr(i, j + 1 - i)) +
                                                   "'" + at(i));
                }
                std::from_chars(where.data() + i + 2, where.data() + j, u, 16);
                v.kind = MetaValue::Kind::kInteger;
                v.i = int64_t(u);  // 64 bits, two's complement, as SQLite reads hex
            } else {
                bool integral = true;
                while (j < n && std::isdigit(static_cast<unsigned char>(where[j]))) ++j;
                if (j < n && where[j] == '.') {
                    integral = false;
                    ++j;
                    while (j < n && std::isdigit(static_cast<unsigned char>(where[j]))) ++j;
                }
                if (j < n && (where[j] == 'e' || where[j] == 'E')) {
                    integral = false;
                    size_t k = j + 1;
                    if (k < n && (where[k] == '+' || where[k] == '-')) ++k;
                    if (k == n || !std::isdigit(static_cast<unsigned char>(where[k]))) {
                        return Status::InvalidArgument("filter: bad number '" + shown(where.substr(i, k + 1 - i)) +
                                                       "'" + at(i));
                    }
                    j = k;
                    while (j < n && std::isdigit(static_cast<unsigned char>(where[j]))) ++j;
                }
                if (j < n && (ident_char(where[j]) || where[j] == '.')) {
                    return Status::InvalidArgument("filter: bad number '" + shown(where.substr(i, j + 1 - i)) + "'" +
                                                   at(i));
                }
                // from_chars reads no leading '.': "0" in front of ".5".
                const std::string num = (where[i] == '.' ? "0" : "") + where.substr(i, j - i);
                const char* b = num.data();
                const char* e = num.data() + num.size();
                if (integral && std::from_chars(b, e, v.i).ec == std::errc()) {
                    v.kind = MetaValue::Kind::kInteger;
                } else {  // a real, or an integer past 64 bits (a real, as SQLite reads it)
                    const auto r = std::from_chars(b, e, v.r);
                    if (r.ec != std::errc() || !std::isfinite(v.r)) {
                        return Status::InvalidArgument("filter: number out of range '" + shown(num) + "'" + at(i));
                    }
                    v.kind = MetaValue::Kind::kReal;
                }
            }
            TMS_RETURN_IF_ERROR(param(std::move(v), i));
            i = j;
            continue;
        }
        const std::string two = where.substr(i, 2);
        if (two == "--" || two == "/*") return unexpected(i, 2);
        if (two == "==" || two == "!=" || two == "<>" || two == "<=" || two == ">=" || two == "<<" || two == ">>" ||
            two == "||") {
            emit(two);
            i += 2;
            continue;
        }
        if (std::strchr("=<>(),+-*/%&|~", c) && c != '\0') {
            emit(std::string(1, c));
            ++i;
            continue;
        }
        return unexpected(i, 1);
    }
    if (sql->empty()) return Status::InvalidArgument("filter: empty expression");
    return Status::OK();
}

}  // namespace index
}  // namespace tms

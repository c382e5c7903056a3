// Copyright TileMaxSim authors. Document metadata from JSONL: one JSON object a line (parsed by
// nlohmann/json), resolved against the documents' ids and the index's columns.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>
#include <nlohmann/json.hpp>

#include "index/ingest/metadata_jsonl.h"
#include "index/metadata/metadata.h"
#include "index/metadata/names.h"
#include "tilemaxsim/options.h"

namespace fs = std::filesystem;

namespace tms {
namespace index {
namespace {

constexpr int kMaxJsonDepth = 64;  // nesting of an attribute's array or object

struct JsonMember {
    std::string key;
    MetaValue value;
    char first = 0;  // the value's first character: '"' a string, 't'/'f' a boolean, '['/'{' nested, ...
};

// Members of one JSON object (RFC 8259, strict: nlohmann/json's parser) in order: scalars as
// values, nested arrays and objects kept as their JSON text (compact) and nested at most
// kMaxJsonDepth deep. A member value of a key given twice is kept twice (the caller refuses it).
class ObjectSax : public nlohmann::json_sax<nlohmann::json> {
public:
    explicit ObjectSax(std::vector<JsonMember>* out) : out_(out) { out_->clear(); }
    const std::string& error() const { return err_; }

    bool null() override { return scalar(MetaValue(), 'n', nullptr); }
    bool boolean(bool b) override {
        MetaValue v;
        v.kind = MetaValue::Kind::kInteger;
        v.i = b ? 1 : 0;
        return scalar(v, b ? 't' : 'f', b);
    }
    bool number_integer(number_integer_t i) override {
        MetaValue v;
        v.kind = MetaValue::Kind::kInteger;
        v.i = i;
        return scalar(v, '0', i);
    }
    bool number_unsigned(number_unsigned_t u) override {
        MetaValue v;  // beyond int64: a real, as SQLite reads one
        if (u <= uint64_t(INT64_MAX)) {
            v.kind = MetaValue::Kind::kInteger;
            v.i = int64_t(u);
        } else {
            v.kind = MetaValue::Kind::kReal;
            v.r = double(u);
        }
        return scalar(v, '0', u);
    }
    bool number_float(number_float_t d, const string_t&) override {
        if (!std::isfinite(d)) return fail("number out of range");
        MetaValue v;
        v.kind = MetaValue::Kind::kReal;
        v.r = d;
        return scalar(v, '0', d);
    }
    bool string(string_t& s) override {
        MetaValue v;
        v.kind = MetaValue::Kind::kText;
        v.s = s;
        return scalar(v, '"', s);
    }
    bool binary(binary_t&) override { return fail("binary value"); }
    bool start_object(std::size_t) override { return open(nlohmann::json::object(), '{'); }
    bool start_array(std::size_t) override {
        if (depth_ == 0) return fail("expected a JSON object");
        return open(nlohmann::json::array(), '[');
    }
    bool key(string_t& k) override {
        if (depth_ == 1) {
            out_->emplace_back();
            out_->back().key = k;
        } else {
            key_ = k;
        }
        return true;
    }
    bool end_object() override { return close(); }
    bool end_array() override { return close(); }
    bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
        if (!err_.empty()) return false;
        // "[json.exception.parse_error.101] parse error at line 1, column 8: syntax error while
        // parsing object - unexpected end of input; last read: '...'; expected '}'": the input
        // it echoes is left out (the message names the character).
        std::string what = e.what();
        if (what.rfind("[json.exception.", 0) == 0) what.erase(0, what.find("] ") + 2);
        if (what.rfind("parse error at line ", 0) == 0) what.erase(0, what.find(": ") + 2);
        const size_t echo = what.find("; last read: ");
        if (echo != std::string::npos) {
            const size_t expected = what.find("; expected ", echo);
            what.erase(echo, expected == std::string::npos ? std::string::npos : expected - echo);
        }
        err_ = "bad JSON: " + what + " at character " + std::to_string(position);
        return false;
    }

private:
    bool fail(const std::string& what) {
        if (err_.empty()) err_ = "bad JSON: " + what;
        return false;
    }
    // A scalar: a member's value at depth 1, else an element of the nested value being built.
    bool scalar(const MetaValue& v, char first, nlohmann::json j) {
        if (depth_ == 0) return fail("expected a JSON object");
        if (depth_ == 1) {
            out_->back().value = v;
            out_->back().first = first;
            return true;
        }
        add(std::move(j));
        return true;
    }
    bool open(nlohmann::json j, char first) {
        if (depth_ == 0) {
            depth_ = 1;
            return true;
        }
        if (depth_ > kMaxJsonDepth) return fail("nested more than " + std::to_string(kMaxJsonDepth) + " deep");
        if (depth_ == 1)
            out_->back().first = first;
        else
            stack_key_.push_back(key_);
        stack_.push_back(std::move(j));
        ++depth_;
        return true;
    }
    bool close() {
        --depth_;
        if (depth_ == 0) return true;  // the object itself
        nlohmann::json done = std::move(stack_.back());
        stack_.pop_back();
        if (depth_ == 1) {
            MetaValue& v = out_->back().value;
            v.kind = MetaValue::Kind::kText;
            v.s = done.dump();
            return true;
        }
        key_ = stack_key_.back();
        stack_key_.pop_back();
        add(std::move(done));
        return true;
    }
    void add(nlohmann::json j) {
        nlohmann::json& top = stack_.back();
        if (top.is_array())
            top.push_back(std::move(j));
        else
            top[key_] = std::move(j);
    }

    std::vector<JsonMember>* out_;
    int depth_ = 0;                       // 1 inside the object, 2 inside a member's array or object...
    std::vector<nlohmann::json> stack_;   // the nested values being built
    std::vector<std::string> stack_key_;  // the key each one is under in its parent object
    std::string key_;                     // the last key of the innermost nested object
    std::string err_;
};

int64_t line_of(const DocMetadata& md, size_t i) { return i < md.lines.size() ? md.lines[i] : int64_t(i) + 1; }

std::string line_prefix(const DocMetadata& md, size_t i) {
    return md.source + ": line " + std::to_string(line_of(md, i)) + ": ";
}

Status parse_object(const DocMetadata& md, size_t i, std::vector<JsonMember>* out) {
    const std::string& text = md.objects[i];
    const size_t first = text.find_first_not_of(" \t\n\r");
    std::string err;
    if (first == std::string::npos || text[first] != '{') {
        err = "expected a JSON object";
    } else {
        ObjectSax sax(out);
        if (!nlohmann::json::sax_parse(text, &sax)) err = sax.error().empty() ? "bad JSON" : sax.error();
    }
    if (!err.empty()) return Status::InvalidArgument(line_prefix(md, i) + err);
    return Status::OK();
}

}  // namespace

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
                    return Status::InvalidArgument(
                        at + "column '" + col.name + "' is " + MetaTypeName(col.type) +
                        (size_t(c) < out->n_existing ? " in the index" : " as declared") + ", got " + got +
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
        if (t == "integer" || t == "int")
            c.type = MetaType::kInteger;
        else if (t == "real" || t == "float")
            c.type = MetaType::kReal;
        else if (t == "text" || t == "str")
            c.type = MetaType::kText;
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

}  // namespace tms

// Copyright TileMaxSim authors. The filter language compiled to SQLite SQL with bound parameters.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "index/metadata/filter_functions.h"
#include "index/metadata/filter_language.h"
#include "index/metadata/metadata.h"
#include "index/metadata/names.h"

namespace tms::index {

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

}  // namespace tms::index

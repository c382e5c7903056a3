// Copyright TileMaxSim authors. Names in metadata and filters.
#include "index/metadata/names.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <iterator>

#include "index/metadata/filter_language.h"
#include "index/metadata/metadata.h"

namespace tms::index {

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

std::string sql_name(const std::string& column) { return "\"" + column + "\""; }

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

}  // namespace tms::index

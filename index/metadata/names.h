// Copyright TileMaxSim authors. Names in metadata and filters: columns, keywords, SQL quoting, and
// input text as messages show it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace tms::index {

inline constexpr size_t kMaxColumnName = 64;

std::string lower(std::string s);
std::string upper(std::string s);
/// Text from the input as a message shows it: one line, printable, at most 80 characters.
std::string shown(std::string_view s);
/// A word of the filter language (AND, OR, NOT, IN, ...), any case.
bool is_keyword(const std::string& word);
/// A column's name quoted for SQL.
std::string sql_name(const std::string& column);

}  // namespace tms::index

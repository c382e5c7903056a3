// Copyright TileMaxSim authors. A new index's metadata: the text field's check, the file written with the build.
#include "index/build_metadata.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "index/metadata/names.h"

#include "index/store/index_dir.h"

namespace tms::index {

Status CheckTextField(const IndexBuildOptions& opts, const std::vector<MetaColumn>* columns) {
    if (!opts.text_field.empty()) {
        const bool found = columns && std::any_of(columns->begin(), columns->end(), [&](const MetaColumn& m) {
                               return m.name == opts.text_field && m.type == MetaType::kText;
                           });
        if (!found) {
            return Status::InvalidArgument("text field '" + opts.text_field +
                                           "': the documents' metadata has no field of that name with text values "
                                           "(give it in the metadata, e.g. {\"" +
                                           opts.text_field + "\": \"the document's text\"})");
        }
    }
    if (!opts.spans_field.empty()) {
        const bool found = columns && std::any_of(columns->begin(), columns->end(), [&](const MetaColumn& m) {
                               return lower(m.name) == lower(opts.spans_field) && m.type == MetaType::kText;
                           });
        if (!found) {
            return Status::InvalidArgument("spans field '" + opts.spans_field +
                                           "': the documents' metadata has no field of that name holding token spans "
                                           "(give them in the metadata, e.g. {\"" +
                                           opts.spans_field + "\": [[0, 5], [6, 11]]}, a pair per token)");
        }
    }
    return Status::OK();
}

namespace {

// The characters (Unicode code points) of UTF-8 text.
int64_t code_points(const std::string& s) {
    int64_t n = 0;
    for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0u) != 0x80u;
    return n;
}

int column_of(const std::vector<MetaColumn>& columns, const std::string& name) {
    for (size_t c = 0; c < columns.size(); ++c)
        if (lower(columns[c].name) == lower(name)) return int(c);
    return -1;
}

}  // namespace

Status CheckSpans(const std::string& spans_field, const std::string& text_field, const std::vector<MetaColumn>& columns,
                  const std::vector<MetaCells>& cells, const std::vector<int64_t>& doclens,
                  const std::vector<std::string>& ids, const std::string& source) {
    if (spans_field.empty()) return Status::OK();
    const int sc = column_of(columns, spans_field), tc = column_of(columns, text_field);
    for (size_t d = 0; d < cells.size() && d < doclens.size(); ++d) {
        const MetaValue* spans = nullptr;
        const MetaValue* text = nullptr;
        for (const auto& [c, v] : cells[d]) {
            if (c == sc) spans = &v;
            if (c == tc) text = &v;
        }
        if (!spans || spans->kind == MetaValue::Kind::kNull) continue;
        const auto bad = [&](const std::string& why) {
            return Status::InvalidArgument(source + ": document '" + (d < ids.size() ? ids[d] : std::to_string(d)) +
                                           "': " + spans_field + ": " + why);
        };
        if (spans->kind != MetaValue::Kind::kText) return bad("expected an array of [start, end] pairs");
        const nlohmann::json j = nlohmann::json::parse(spans->s, nullptr, /*allow_exceptions=*/false);
        if (!j.is_array()) return bad("expected an array of [start, end] pairs");
        if (int64_t(j.size()) != doclens[d]) {
            return bad(std::to_string(j.size()) + " spans for " + std::to_string(doclens[d]) +
                       " tokens (one [start, end] pair per token)");
        }
        const int64_t len = text && text->kind == MetaValue::Kind::kText ? code_points(text->s) : 0;
        for (size_t t = 0; t < j.size(); ++t) {
            const nlohmann::json& p = j[t];
            if (!p.is_array() || p.size() != 2 || !p[0].is_number_integer() || !p[1].is_number_integer()) {
                return bad("token " + std::to_string(t) + ": expected a [start, end] pair of integers");
            }
            const int64_t a = p[0].get<int64_t>(), b = p[1].get<int64_t>();
            if (a < 0 || a > b || b > len) {
                return bad("token " + std::to_string(t) + ": [" + std::to_string(a) + ", " + std::to_string(b) +
                           "] is not within the text's " + std::to_string(len) + " characters");
            }
        }
    }
    return Status::OK();
}

Status WriteBuildMetadata(const std::string& build_dir, const std::vector<MetaColumn>& columns,
                          const std::vector<std::string>& ids, const std::vector<MetaCells>& cells,
                          const IndexBuildOptions& opts) {
    const TextIndexSpec text{opts.text_field, opts.text_tokenizer, opts.spans_field};
    std::unique_ptr<MetadataWriter> w;
    TMS_RETURN_IF_ERROR(MetadataWriter::Create((std::filesystem::path(build_dir) / kMetadataFile).string(), columns, &w,
                                               opts.text_field.empty() ? nullptr : &text));
    for (size_t d = 0; d < ids.size(); ++d) TMS_RETURN_IF_ERROR(w->Insert(int64_t(d), ids[d], cells[d]));
    TMS_RETURN_IF_ERROR(w->Commit());
    CrashPoint("meta:built");
    return Status::OK();
}

}  // namespace tms::index

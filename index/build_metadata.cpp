// Copyright TileMaxSim authors. A new index's metadata: the text field's check, the file written with the build.
#include "index/build_metadata.h"

#include <algorithm>
#include <filesystem>

#include "index/store/index_dir.h"

namespace tms::index {

Status CheckTextField(const IndexBuildOptions& opts, const std::vector<MetaColumn>* columns) {
    if (opts.text_field.empty()) return Status::OK();
    const bool found = columns && std::any_of(columns->begin(), columns->end(), [&](const MetaColumn& m) {
                           return m.name == opts.text_field && m.type == MetaType::kText;
                       });
    if (found) return Status::OK();
    return Status::InvalidArgument("text field '" + opts.text_field +
                                   "': the documents' metadata has no field of that name with text values (give it "
                                   "in the metadata, e.g. {\"" +
                                   opts.text_field + "\": \"the document's text\"})");
}

Status WriteBuildMetadata(const std::string& build_dir, const std::vector<MetaColumn>& columns,
                          const std::vector<std::string>& ids, const std::vector<MetaCells>& cells,
                          const IndexBuildOptions& opts) {
    const TextIndexSpec text{opts.text_field, opts.text_tokenizer};
    std::unique_ptr<MetadataWriter> w;
    TMS_RETURN_IF_ERROR(MetadataWriter::Create((std::filesystem::path(build_dir) / kMetadataFile).string(), columns, &w,
                                               opts.text_field.empty() ? nullptr : &text));
    for (size_t d = 0; d < ids.size(); ++d) TMS_RETURN_IF_ERROR(w->Insert(int64_t(d), ids[d], cells[d]));
    TMS_RETURN_IF_ERROR(w->Commit());
    CrashPoint("meta:built");
    return Status::OK();
}

}  // namespace tms::index

// Copyright TileMaxSim authors. A new index's metadata: the text field's check, the file written with the build.
#pragma once

#include <string>
#include <vector>

#include "index/metadata/metadata.h"
#include "tilemaxsim/options.h"
#include "tilemaxsim/status.h"

namespace tms::index {

/// InvalidArgument unless opts.text_field is empty or names one of `columns` (null: the
/// documents have no metadata) of text values, and likewise opts.spans_field (spans are arrays,
/// which the metadata keeps as their JSON text).
Status CheckTextField(const IndexBuildOptions& opts, const std::vector<MetaColumn>* columns);

/// Each document's spans (`spans_field` of `cells`, which index `columns`; a document without
/// one has none): a JSON array of [start, end] pairs, one per token (doclens[d]), with
/// 0 <= start <= end <= the character length (Unicode code points) of its `text_field`. One
/// line naming `source`, the document's id and the problem. OK when spans_field is empty.
Status CheckSpans(const std::string& spans_field, const std::string& text_field, const std::vector<MetaColumn>& columns,
                  const std::vector<MetaCells>& cells, const std::vector<int64_t>& doclens,
                  const std::vector<std::string>& ids, const std::string& source);

/// Writes the metadata file of a new index into its build directory: a row per document
/// (`ids` and `cells` in document order, cells indexing `columns`), and the text index of
/// opts.text_field when set.
Status WriteBuildMetadata(const std::string& build_dir, const std::vector<MetaColumn>& columns,
                          const std::vector<std::string>& ids, const std::vector<MetaCells>& cells,
                          const IndexBuildOptions& opts);

}  // namespace tms::index

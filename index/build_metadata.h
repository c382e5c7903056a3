// Copyright TileMaxSim authors. A new index's metadata: the text field's check, the file written with the build.
#pragma once

#include <string>
#include <vector>

#include "index/metadata/metadata.h"
#include "tilemaxsim/options.h"
#include "tilemaxsim/status.h"

namespace tms::index {

/// InvalidArgument unless opts.text_field is empty or names one of `columns` (null: the
/// documents have no metadata) of text values.
Status CheckTextField(const IndexBuildOptions& opts, const std::vector<MetaColumn>* columns);

/// Writes the metadata file of a new index into its build directory: a row per document
/// (`ids` and `cells` in document order, cells indexing `columns`), and the text index of
/// opts.text_field when set.
Status WriteBuildMetadata(const std::string& build_dir, const std::vector<MetaColumn>& columns,
                          const std::vector<std::string>& ids, const std::vector<MetaCells>& cells,
                          const IndexBuildOptions& opts);

}  // namespace tms::index

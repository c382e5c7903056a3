// Copyright TileMaxSim authors. Document metadata from JSONL, resolved to a batch's documents.
#pragma once

#include <string>
#include <vector>

#include "index/metadata/metadata.h"
#include "tilemaxsim/metadata.h"
#include "tilemaxsim/status.h"

namespace tms::index {

/// A batch's metadata resolved to its documents.
struct MetaRows {
    /// The columns the rows may name: the existing ones first (as given, in order), then the
    /// new ones in order of first appearance (declared ones before inferred ones).
    std::vector<MetaColumn> columns;
    size_t n_existing = 0;
    std::vector<MetaCells> cells;  ///< [n documents of the batch], column indexes into `columns`
};

/// Parses `md` and assigns its objects to the batch's documents (`ids`: their external ids).
/// `existing`: the index's columns (matched ignoring case, their types kept; declaring another
/// type for one is an error). Every failure is one line naming md.source and the line.
Status ResolveMetadata(const DocMetadata& md, const std::vector<std::string>& ids,
                       const std::vector<MetaColumn>& existing, MetaRows* out);

}  // namespace tms::index

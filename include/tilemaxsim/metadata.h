// Copyright TileMaxSim authors. Per-document metadata (attributes that searches filter by).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms {

/// Attributes of a batch of documents: one JSON object per document. An index keeps them in
/// INDEX/metadata.sqlite (one row per document: its internal id, its external id and a column
/// per attribute), written with the documents by IndexBuilder and IndexUpdater::Add.
///
/// Column names: [A-Za-z_][A-Za-z0-9_]*, at most 64 characters, unique ignoring case, at most
/// 1,000 columns; `doc`, `id` and the filter keywords (and, or, not, in, is, null, like, glob,
/// between, escape, true, false) are reserved.
struct DocMetadata {
    /// JSON object texts. Either one per document, in document order; or, when the first object
    /// has the key "id", each object names its document by its external id ("id": string, or an
    /// integer written as its decimal string), in any order, every document at most once
    /// (documents with no object get NULLs). Values: integers, reals, strings, booleans (1/0),
    /// null; arrays and objects are stored as their JSON text.
    std::vector<std::string> objects;
    /// Declared column types (optional); other columns are inferred from their values: all
    /// integers (or booleans) -> integer, numbers -> real, anything else -> text.
    std::vector<MetaColumn> declared;
    /// Names the input in error messages, e.g. the file path ("meta.jsonl: line 3: ...").
    std::string source = "metadata";
    /// The source line of each object, for messages (empty: objects[i] is on line i + 1).
    std::vector<int64_t> lines;
};

/// Reads a JSONL file (one object per non-empty line) into out->objects (and out->lines,
/// out->source = path); each object is checked. Errors name the file and line, in one line:
/// "meta.jsonl: line 7: expected a JSON object".
Status LoadMetadataJsonl(const std::string& path, DocMetadata* out);
/// Parses "name:type,name:type" (types integer|real|text, also int/float/str) into columns.
Status ParseMetaColumns(const std::string& spec, std::vector<MetaColumn>* out);

}  // namespace tms

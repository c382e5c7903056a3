// Copyright TileMaxSim authors. Checks of a build's input: shapes, document lengths, ids, values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms::index {

/// Input checks shared by every build path: dim range, lengths >= 1 summing to the rows,
/// ids unique and whitespace-free (filled with "0".."n-1" when empty).
Status ValidateInput(const EmbeddingView& tokens, const std::vector<int64_t>& doclens,
                     std::vector<std::string>* doc_ids);

/// A shape read from a file header: every dimension >= 0 and the byte count (with
/// `elem_size`-byte elements) below 2^50, computed without overflow. Messages name `what`.
Status CheckShape(const std::vector<int64_t>& shape, int64_t elem_size, const std::string& what);

/// Document lengths against the token rows they split: each >= 1, summing to `rows` exactly
/// (checked step by step, so that no sum of huge lengths wraps around). Messages name
/// `lens_what` and `rows_what`.
Status CheckDocLens(const std::vector<int64_t>& lens, int64_t rows, const std::string& lens_what,
                    const std::string& rows_what);

/// A document or query id as runs and metadata store it: non-empty, at most 1,024 bytes, no
/// whitespace or control characters (TREC runs separate fields by whitespace; a NUL would cut
/// the id short). Messages start with `what`.
Status CheckId(const std::string& id, const std::string& what);

/// The first value of `tokens` (row-major element index) that is not finite or is beyond
/// kMaxEmbeddingValue, scanned on every thread; rows x dim when every one is.
int64_t FirstBadValue(const EmbeddingView& tokens);
/// OK when FirstBadValue finds none; else NonFiniteError(what, row, column) of the first.
Status CheckValues(const EmbeddingView& tokens, const std::string& what);

/// What is wrong with a value that is not finite or beyond kMaxEmbeddingValue: "non-finite value
/// (NaN)", or "value 1e+30 beyond fp16's range (|x| <= 65504)".
std::string BadValueText(float v);
/// "<what>: <BadValueText(v)> at row R, column C".
Status NonFiniteError(const std::string& what, int64_t row, int col, float v);

}  // namespace tms::index

// Copyright TileMaxSim authors. Checks of a build's input: document lengths, ids, values.

#include <climits>
#include <cmath>
#include <unordered_set>

#include "index/ingest/input_checks.h"
#include "kernels/maxsim.h"

namespace tms::index {

Status CheckDocLens(const std::vector<int64_t>& lens, int64_t rows, const std::string& lens_what,
                    const std::string& rows_what) {
    if (lens.empty()) return Status::InvalidArgument(lens_what + ": no documents");
    int64_t sum = 0;
    for (size_t i = 0; i < lens.size(); ++i) {
        if (lens[i] <= 0) {
            return Status::InvalidArgument(lens_what + ": document " + std::to_string(i) + " has " +
                                           std::to_string(lens[i]) + " tokens (must be >= 1)");
        }
        if (lens[i] > rows - sum) {  // sum <= rows throughout: no overflow
            return Status::InvalidArgument(lens_what + ": lengths sum to more than the " + std::to_string(rows) +
                                           " rows of " + rows_what + " (at document " + std::to_string(i) + ")");
        }
        sum += lens[i];
    }
    if (sum != rows) {
        return Status::InvalidArgument(lens_what + ": lengths sum to " + std::to_string(sum) + " tokens but " +
                                       rows_what + " has " + std::to_string(rows) + " rows");
    }
    return Status::OK();
}

Status CheckId(const std::string& id, const std::string& what) {
    if (id.empty()) return Status::InvalidArgument(what + ": empty id");
    if (id.size() > 1024) return Status::InvalidArgument(what + ": id longer than 1024 bytes");
    for (const char ch : id) {
        const auto c = static_cast<unsigned char>(ch);
        if (c <= 0x20 || c == 0x7f) {
            return Status::InvalidArgument(
                what + ": id contains " +
                (c == ' ' || c == '\t' ? "whitespace" : "a control character (byte " + std::to_string(c) + ")"));
        }
    }
    return Status::OK();
}

std::string BadValueText(float v) {
    if (!std::isfinite(v)) return std::string("non-finite value (") + (std::isnan(v) ? "NaN" : "Inf") + ")";
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%g", double(v));
    return std::string("value ") + buf + " beyond fp16's range (|x| <= 65504; the index stores and scores fp16)";
}

int64_t FirstBadValue(const EmbeddingView& tokens) {
    const int64_t n = tokens.rows * int64_t(tokens.dim);
    int64_t first_bad = n;
    if (tokens.dtype == DType::kF32) {
        const auto* f = static_cast<const uint32_t*>(tokens.data);
        static_assert(kMaxEmbeddingValue == 65504.0f, "0x477fe000 is 65504.0f's bits");
#pragma omp parallel for reduction(min : first_bad) schedule(static)
        for (int64_t i = 0; i < n; ++i)
            if ((f[i] & 0x7fffffffu) > 0x477fe000u && i < first_bad) first_bad = i;
    } else {
        // fp16: exponent all ones (Inf, NaN); bf16: above 65280, the largest bf16 within range.
        const auto* h = static_cast<const uint16_t*>(tokens.data);
        const bool f16 = tokens.dtype == DType::kF16;
        const uint16_t mask = f16 ? 0x7c00u : 0x7fffu, limit = f16 ? 0x7bffu : 0x477fu;
#pragma omp parallel for reduction(min : first_bad) schedule(static)
        for (int64_t i = 0; i < n; ++i)
            if ((h[i] & mask) > limit && i < first_bad) first_bad = i;
    }
    return first_bad;
}

Status CheckValues(const EmbeddingView& tokens, const std::string& what) {
    const int64_t bad = FirstBadValue(tokens);
    if (bad == tokens.rows * int64_t(tokens.dim)) return Status::OK();
    return NonFiniteError(what, bad / tokens.dim, int(bad % tokens.dim),
                          kernels::load_as_float(tokens.data, tokens.dtype, bad));
}

Status NonFiniteError(const std::string& what, int64_t row, int col, float v) {
    return Status::InvalidArgument(what + ": " + BadValueText(v) + " at row " + std::to_string(row) + ", column " +
                                   std::to_string(col));
}

namespace {

Status validate_input(const EmbeddingView& tokens, const std::vector<int64_t>& doclens,
                      std::vector<std::string>* doc_ids) {
    if (tokens.dim < 32 || tokens.dim > 1024) {
        return Status::InvalidArgument("docs: dimension " + std::to_string(tokens.dim) +
                                       " outside the supported range [32, 1024]");
    }
    if (doclens.empty()) return Status::InvalidArgument("doclens: no documents");
    if (doclens.size() > size_t(INT32_MAX)) {
        return Status::NotSupported("doclens: " + std::to_string(doclens.size()) +
                                    " documents; one index holds at most 2^31 - 1 (split the corpus into shards)");
    }
    TMS_RETURN_IF_ERROR(CheckDocLens(doclens, tokens.rows, "doclens", "docs"));
    if (doc_ids->empty()) {
        doc_ids->resize(doclens.size());
        for (size_t i = 0; i < doclens.size(); ++i) (*doc_ids)[i] = std::to_string(i);
    }
    if (doc_ids->size() != doclens.size()) {
        return Status::InvalidArgument("doc-ids: " + std::to_string(doc_ids->size()) + " ids for " +
                                       std::to_string(doclens.size()) + " documents");
    }
    std::unordered_set<std::string> seen;
    seen.reserve(doc_ids->size());
    for (size_t i = 0; i < doc_ids->size(); ++i) {
        const std::string& id = (*doc_ids)[i];
        TMS_RETURN_IF_ERROR(CheckId(id, "doc-ids: line " + std::to_string(i + 1)));
        if (!seen.insert(id).second) {
            return Status::InvalidArgument("doc-ids: line " + std::to_string(i + 1) + ": duplicate id '" + id + "'");
        }
    }
    return Status::OK();
}

}  // namespace

Status ValidateInput(const EmbeddingView& tokens, const std::vector<int64_t>& doclens,
                     std::vector<std::string>* doc_ids) {
    return validate_input(tokens, doclens, doc_ids);
}

}  // namespace tms::index

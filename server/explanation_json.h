// Copyright TileMaxSim authors. An explanation (Searcher::Explain) as JSON, as the server's
// search answers and `tms search --explain` lines give it (openapi.json, "explanations").
#pragma once

#include <nlohmann/json.hpp>

#include "tilemaxsim/searcher.h"

namespace tms::server {

/// {"doc_tokens", "similarities", "maxsim", "from_codes"[, "spans" when the index keeps them]}.
inline nlohmann::json ExplanationJson(const Explanation& e) {
    nlohmann::json w = {{"doc_tokens", e.doc_tokens},
                        {"similarities", e.similarities},
                        {"maxsim", e.score},
                        {"from_codes", e.from_codes}};
    if (!e.spans.empty()) w["spans"] = e.spans;
    return w;
}

}  // namespace tms::server

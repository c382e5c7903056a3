// Copyright TileMaxSim authors. multipart/form-data request bodies (RFC 7578): how a client sends
// JSON fields and binary arrays in one request (curl -F, requests' files=).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tilemaxsim/status.h"

namespace tms::server {

/// One part of a form: its name (Content-Disposition), its Content-Type ("" when not given) and
/// its bytes, a view into the body it was parsed from.
struct FormPart {
    std::string name;
    std::string content_type;
    std::string_view data;
};

/// The most parts a form may hold.
constexpr size_t kMaxFormParts = 16;

/// True when `content_type` (a request's Content-Type) is multipart/form-data.
bool IsFormData(std::string_view content_type);

/// The parts of `body`, sent with `content_type` (multipart/form-data; boundary=...). Refuses, with
/// InvalidArgument naming the problem, a missing or over-long boundary, a body that does not
/// start with it or never closes, a part without a name or with two names alike, and more than
/// kMaxFormParts parts.
Status ParseFormData(std::string_view content_type, std::string_view body, std::vector<FormPart>* parts);

}  // namespace tms::server

// Copyright TileMaxSim authors. server/openapi.json, compiled in (served at /openapi.json).
#pragma once

namespace tms::server {

extern const char* const kOpenApiJson;

}  // namespace tms::server

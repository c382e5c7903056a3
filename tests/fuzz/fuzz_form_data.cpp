// Copyright TileMaxSim authors. multipart/form-data bodies of `tms serve` (server/form_data.h):
// the first line of the input is the Content-Type, the rest the body.
#include <string_view>
#include <vector>

#include "server/form_data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view in(reinterpret_cast<const char*>(data), size);
    const size_t eol = in.find('\n');
    const std::string_view ctype = in.substr(0, eol);
    const std::string_view body = eol == std::string_view::npos ? std::string_view() : in.substr(eol + 1);
    std::vector<tms::server::FormPart> parts;
    if (tms::server::ParseFormData(ctype, body, &parts).ok()) {
        for (const auto& p : parts) {
            // Every part's bytes lie inside the body.
            if (p.data.data() < body.data() || p.data.data() + p.data.size() > body.data() + body.size())
                __builtin_trap();
        }
    }
    return 0;
}

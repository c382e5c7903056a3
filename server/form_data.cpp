// Copyright TileMaxSim authors. multipart/form-data (form_data.h).
#include "server/form_data.h"

#include <algorithm>
#include <cctype>

namespace tms::server {
namespace {

constexpr const char* kNameless = "a part without Content-Disposition: form-data; name=\"...\"";

Status Bad(const std::string& what) { return Status::InvalidArgument("body: multipart/form-data: " + what); }

std::string Lower(std::string_view s) {
    std::string out(s);
    std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    return out;
}

std::string_view Trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

// The value of parameter `name` in a header value "type; a=b; name="value"" ("" when absent).
// Returns false for a quoted value that never closes.
bool Param(std::string_view header, std::string_view name, std::string* value) {
    value->clear();
    size_t at = header.find(';');
    while (at != std::string_view::npos) {
        std::string_view rest = Trim(header.substr(at + 1));
        const size_t eq = rest.find('=');
        if (eq == std::string_view::npos) return true;
        const std::string key = Lower(Trim(rest.substr(0, eq)));
        std::string_view v = Trim(rest.substr(eq + 1));
        size_t next;
        std::string got;
        if (!v.empty() && v.front() == '"') {
            const size_t close = v.find('"', 1);
            if (close == std::string_view::npos) return false;
            got = std::string(v.substr(1, close - 1));
            next = v.find(';', close);
        } else {
            next = v.find(';');
            got = std::string(Trim(v.substr(0, next)));
        }
        if (key == name) {
            *value = std::move(got);
            return true;
        }
        if (next == std::string_view::npos) return true;
        header = v.substr(next);
        at = 0;
    }
    return true;
}

}  // namespace

bool IsFormData(std::string_view content_type) {
    return Lower(Trim(content_type.substr(0, content_type.find(';')))) == "multipart/form-data";
}

Status ParseFormData(std::string_view content_type, std::string_view body, std::vector<FormPart>* parts) {
    parts->clear();
    if (!IsFormData(content_type)) return Bad("Content-Type is not multipart/form-data");
    std::string boundary;
    if (!Param(content_type, "boundary", &boundary) || boundary.empty() || boundary.size() > 70) {
        return Bad("Content-Type needs a boundary of 1 to 70 characters");
    }
    const std::string delim = "--" + boundary;
    // The first delimiter opens the body (a preamble before it ends with CRLF).
    size_t at = body.find(delim);
    if (at == std::string_view::npos || (at > 0 && (at < 2 || body.substr(at - 2, 2) != "\r\n"))) {
        return Bad("the body does not start with the boundary");
    }
    at += delim.size();
    const std::string next = "\r\n" + delim;
    for (;;) {
        if (body.substr(at, 2) == "--") return parts->empty() ? Bad("no parts") : Status::OK();
        // Transport padding, then the CRLF that ends the delimiter line.
        while (at < body.size() && (body[at] == ' ' || body[at] == '\t')) ++at;
        if (body.substr(at, 2) != "\r\n") return Bad("a boundary line that does not end with CRLF");
        at += 2;
        if (body.substr(at, 2) == "\r\n") return Bad(kNameless);
        const size_t head_end = body.find("\r\n\r\n", at);
        const size_t end = head_end == std::string_view::npos ? head_end : body.find(next, head_end + 4);
        if (end == std::string_view::npos) return Bad("a part that never closes (truncated body?)");
        if (parts->size() == kMaxFormParts) return Bad("more than " + std::to_string(kMaxFormParts) + " parts");
        FormPart p;
        bool form = false;
        // The part's header lines.
        std::string_view head = body.substr(at, head_end - at);
        while (!head.empty()) {
            const size_t eol = head.find("\r\n");
            const std::string_view line = head.substr(0, eol);
            head = eol == std::string_view::npos ? std::string_view() : head.substr(eol + 2);
            const size_t colon = line.find(':');
            if (colon == std::string_view::npos) return Bad("a part header without ':'");
            const std::string name = Lower(Trim(line.substr(0, colon)));
            const std::string_view value = Trim(line.substr(colon + 1));
            if (name == "content-disposition") {
                if (Lower(Trim(value.substr(0, value.find(';')))) != "form-data")
                    return Bad("a part whose Content-Disposition is not form-data");
                if (!Param(value, "name", &p.name)) return Bad("a part name whose quote never closes");
                form = true;
            } else if (name == "content-type") {
                p.content_type = std::string(value);
            }
        }
        if (!form || p.name.empty()) return Bad(kNameless);
        for (const FormPart& q : *parts) {
            if (q.name == p.name) return Bad("two parts named '" + p.name + "'");
        }
        p.data = body.substr(head_end + 4, end - (head_end + 4));
        parts->push_back(std::move(p));
        at = end + next.size();
    }
}

}  // namespace tms::server

// Copyright TileMaxSim authors. API keys of `tms serve`: a JSON file, read again when it changes.
//
//   {"keys": [{"name": "ops",     "key": "...", "scopes": ["read", "write", "admin"]},
//             {"name": "tenant7", "key": "...", "scopes": ["read", "write"], "filter": "tenant = 7"}]}
//
// A key's filter is applied to every search made with it (the documents it may see) and checked
// on every write (each new document's metadata must satisfy it; deletes and replacements only
// reach documents it allows). Keys are at least 16 characters; names and keys are unique.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tilemaxsim/status.h"

namespace tms::server {

enum Scope : unsigned { kRead = 1, kWrite = 2, kAdmin = 4 };

struct ApiKey {
    std::string name, key, filter;
    unsigned scopes = 0;
};

/// Parses a key file's text; errors name `source` and the key.
Status ParseApiKeys(const std::string& text, const std::string& source, std::vector<ApiKey>* out);

class ApiKeys {
public:
    /// The keys of `path` (must parse).
    static Status Load(const std::string& path, std::unique_ptr<ApiKeys>* out);
    /// The key `presented` (a copy: the file may change), or nullptr when no key matches.
    /// At most once a second, reads the file again when its modification time or size changed;
    /// a file that no longer parses keeps the keys in force (and says so on stderr once).
    std::shared_ptr<const ApiKey> Find(const std::string& presented);
    size_t size();

private:
    void MaybeReload();
    std::string path_;
    std::mutex mu_;
    std::vector<std::shared_ptr<const ApiKey>> keys_;
    int64_t mtime_ns_ = 0, size_ = -1;
    std::chrono::steady_clock::time_point checked_;
    bool reported_ = false;
};

}  // namespace tms::server

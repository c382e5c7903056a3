// Copyright TileMaxSim authors.
#include "server/api_keys.h"

#include <fstream>
#include <set>
#include <sstream>
#include <sys/stat.h>

#include "nlohmann/json.hpp"
#include "base/log.h"

namespace tms::server {
namespace {

// Equal strings in time that depends on their lengths only.
bool SameKey(const std::string& a, const std::string& b) {
    if (a.size() != b.size()) return false;
    unsigned char diff = 0;
    for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
    return diff == 0;
}

bool FileStamp(const std::string& path, int64_t* mtime_ns, int64_t* size) {
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) return false;
    *mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    *size = int64_t(st.st_size);
    return true;
}

Status ReadText(const std::string& path, std::string* out) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return Status::IOError(path + ": cannot read the key file");
    std::ostringstream ss;
    ss << f.rdbuf();
    *out = ss.str();
    return Status::OK();
}

}  // namespace

Status ParseApiKeys(const std::string& text, const std::string& source, std::vector<ApiKey>* out) {
    out->clear();
    nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded()) return Status::InvalidArgument(source + ": not JSON");
    if (!doc.is_object() || !doc.contains("keys") || !doc["keys"].is_array()) {
        return Status::InvalidArgument(source + ": expected {\"keys\": [{\"name\", \"key\", \"scopes\"}, ...]}");
    }
    std::set<std::string> names, keys;
    int i = 0;
    for (const auto& k : doc["keys"]) {
        const std::string where = source + ": keys[" + std::to_string(i++) + "]";
        if (!k.is_object()) return Status::InvalidArgument(where + ": expected an object");
        ApiKey key;
        for (const auto& [field, value] : k.items()) {
            if (field == "name" && value.is_string()) {
                key.name = value.get<std::string>();
            } else if (field == "key" && value.is_string()) {
                key.key = value.get<std::string>();
            } else if (field == "filter" && value.is_string()) {
                key.filter = value.get<std::string>();
            } else if (field == "scopes" && value.is_array()) {
                for (const auto& sc : value) {
                    const std::string s = sc.is_string() ? sc.get<std::string>() : "";
                    if (s == "read")
                        key.scopes |= kRead;
                    else if (s == "write")
                        key.scopes |= kWrite;
                    else if (s == "admin")
                        key.scopes |= kAdmin;
                    else
                        return Status::InvalidArgument(where + ": scopes are \"read\", \"write\" and \"admin\"");
                }
            } else {
                return Status::InvalidArgument(where + ": unknown or mistyped field '" + field +
                                               "' (fields: name, key, scopes, filter)");
            }
        }
        if (key.name.empty()) return Status::InvalidArgument(where + ": needs a \"name\"");
        if (key.key.size() < 16) {
            return Status::InvalidArgument(where + " (" + key.name + "): a key must have at least 16 characters");
        }
        if (!key.scopes) return Status::InvalidArgument(where + " (" + key.name + "): needs \"scopes\"");
        if (!names.insert(key.name).second) {
            return Status::InvalidArgument(where + ": the name '" + key.name + "' is used twice");
        }
        if (!keys.insert(key.key).second) {
            return Status::InvalidArgument(where + " (" + key.name + "): the same key is given twice");
        }
        out->push_back(std::move(key));
    }
    return Status::OK();
}

Status ApiKeys::Load(const std::string& path, std::unique_ptr<ApiKeys>* out) {
    auto k = std::make_unique<ApiKeys>();
    k->path_ = path;
    if (!FileStamp(path, &k->mtime_ns_, &k->size_)) return Status::IOError(path + ": cannot read the key file");
    std::string text;
    TMS_RETURN_IF_ERROR(ReadText(path, &text));
    std::vector<ApiKey> keys;
    TMS_RETURN_IF_ERROR(ParseApiKeys(text, path, &keys));
    for (auto& key : keys) k->keys_.push_back(std::make_shared<const ApiKey>(std::move(key)));
    k->checked_ = std::chrono::steady_clock::now();
    *out = std::move(k);
    return Status::OK();
}

void ApiKeys::MaybeReload() {
    const auto now = std::chrono::steady_clock::now();
    if (now - checked_ < std::chrono::seconds(1)) return;
    checked_ = now;
    int64_t mtime = 0, size = 0;
    if (!FileStamp(path_, &mtime, &size) || (mtime == mtime_ns_ && size == size_)) return;
    std::string text;
    std::vector<ApiKey> keys;
    Status st = ReadText(path_, &text);
    if (st.ok()) st = ParseApiKeys(text, path_, &keys);
    if (!st.ok()) {
        if (!reported_)
            Logf(LogLevel::kError, "tms serve: the key file changed but is not valid; the keys before stay: %s\n",
                 st.message().c_str());
        reported_ = true;
        return;
    }
    mtime_ns_ = mtime;
    size_ = size;
    reported_ = false;
    keys_.clear();
    for (auto& key : keys) keys_.push_back(std::make_shared<const ApiKey>(std::move(key)));
    LogInfo("tms serve: read %zu keys from %s again\n", keys_.size(), path_.c_str());
}

std::shared_ptr<const ApiKey> ApiKeys::Find(const std::string& presented) {
    std::lock_guard<std::mutex> lk(mu_);
    MaybeReload();
    std::shared_ptr<const ApiKey> found;
    for (const auto& k : keys_) {
        if (SameKey(k->key, presented)) found = k;  // no early exit: every key compared
    }
    return found;
}

size_t ApiKeys::size() {
    std::lock_guard<std::mutex> lk(mu_);
    return keys_.size();
}

}  // namespace tms::server

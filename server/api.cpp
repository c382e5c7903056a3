// Copyright TileMaxSim authors.
#include "server/api.h"

#include <charconv>
#include <cstdio>
#include <ctime>
#include <exception>
#include <set>

#include "base/log.h"
#include "index/ingest/npy.h"
#include "nlohmann/json.hpp"
#include "server/explanation_json.h"
#include "server/form_data.h"
#include "tilemaxsim/estimate.h"
#include "server/openapi.h"

namespace tms::server {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// A request's error: its HTTP status and one line.
struct Bad {
    int status;
    std::string message;
};

int StatusCode(const Status& st) {
    if (st.message().rfind(kForbidden, 0) == 0) return 403;
    switch (st.code()) {
        case Status::Code::kInvalidArgument:
        case Status::Code::kNotSupported: return 400;
        case Status::Code::kNotFound: return 404;
        case Status::Code::kAlreadyExists: return 409;
        case Status::Code::kResourceExhausted: return 503;
        default: return 500;
    }
}

const char* kRoutes[] = {"/health",    "/ready",     "/metrics",      "/openapi.json",        "/v1/info",
                         "/v1/search", "/v1/rerank", "/v1/documents", "/v1/documents/delete", "/v1/compact"};

std::string RouteLabel(const std::string& path) {
    for (const char* r : kRoutes) {
        if (path == r) return r;
    }
    return "other";
}

bool ParseInt(const std::string& s, int64_t* out) {
    const char* end = s.data() + s.size();
    auto [p, ec] = std::from_chars(s.data(), end, *out);
    return ec == std::errc() && p == end && !s.empty();
}

bool ParseDouble(const std::string& s, double* out) {
    char* end = nullptr;
    *out = strtod(s.c_str(), &end);
    return !s.empty() && end == s.c_str() + s.size();
}

// A document id given in JSON: a string, or an integer (its decimal text).
std::string IdOf(const json& v, const std::string& what) {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
    throw Bad{400, what + ": ids are strings (or integers)"};
}

std::vector<std::string> IdList(const json& v, const std::string& what, size_t max) {
    if (!v.is_array()) throw Bad{400, what + ": expected an array of ids"};
    if (v.size() > max) throw Bad{400, what + ": more than " + std::to_string(max) + " ids"};
    std::vector<std::string> ids;
    ids.reserve(v.size());
    for (const auto& x : v) ids.push_back(IdOf(x, what));
    return ids;
}

// Token vectors of one document or query: [[dim numbers], ...], appended to `out` as floats.
int64_t AppendTokens(const json& v, const std::string& what, int* dim, int64_t max_tokens, std::vector<float>* out) {
    if (!v.is_array() || v.empty()) throw Bad{400, what + ": expected a non-empty array of token vectors"};
    if (int64_t(v.size()) > max_tokens) {
        throw Bad{400, what + ": " + std::to_string(v.size()) + " tokens, more than " + std::to_string(max_tokens)};
    }
    for (size_t t = 0; t < v.size(); ++t) {
        const json& row = v[t];
        if (!row.is_array() || row.empty())
            throw Bad{400, what + ", token " + std::to_string(t) + ": expected an array of numbers"};
        if (*dim == 0) *dim = int(row.size());
        if (int(row.size()) != *dim) {
            throw Bad{400, what + ", token " + std::to_string(t) + ": " + std::to_string(row.size()) +
                               " values, the others have " + std::to_string(*dim)};
        }
        for (const auto& x : row) {
            if (!x.is_number())
                throw Bad{400, what + ", token " + std::to_string(t) + ": a value that is not a number"};
            out->push_back(x.get<float>());
        }
    }
    return int64_t(v.size());
}

// The queries of a request with their storage.
struct Queries {
    HostArray arr;
    std::vector<int32_t> lengths;
    QueryBatch batch;
};

void QueriesFromJson(const json& v, const ApiOptions& o, Queries* q) {
    if (!v.is_array() || v.empty())
        throw Bad{400, "queries: expected a non-empty array of queries (each an array of token vectors)"};
    if (int64_t(v.size()) > o.max_queries) {
        throw Bad{400, "queries: " + std::to_string(v.size()) + " queries, more than the " +
                           std::to_string(o.max_queries) + " a request may hold"};
    }
    int dim = 0;
    std::vector<std::vector<float>> rows(v.size());
    int64_t tmax = 0;
    for (size_t i = 0; i < v.size(); ++i) {
        const int64_t t = AppendTokens(v[i], "queries[" + std::to_string(i) + "]", &dim, o.max_query_tokens, &rows[i]);
        q->lengths.push_back(int32_t(t));
        tmax = std::max(tmax, t);
    }
    q->arr.descr = "<f4";
    q->arr.shape = {int64_t(v.size()), tmax, dim};
    q->arr.bytes.assign(size_t(q->arr.numel()) * 4, 0);
    for (size_t i = 0; i < rows.size(); ++i) {
        memcpy(q->arr.bytes.data() + i * size_t(tmax) * size_t(dim) * 4, rows[i].data(), rows[i].size() * 4);
    }
}

void QueriesFromNpy(const std::string& body, const ApiOptions& o, Queries* q) {
    Status st = ParseNpy(body, "body", &q->arr);
    if (!st.ok()) throw Bad{400, st.message()};
    if (q->arr.shape.size() == 2) q->arr.shape.insert(q->arr.shape.begin(), 1);  // one query
    if (q->arr.shape.size() != 3)
        throw Bad{400, "body: expected queries [n_queries, tokens, dim] or one query [tokens, dim]"};
    if (q->arr.shape[0] < 1 || q->arr.shape[0] > o.max_queries) {
        throw Bad{400, "body: " + std::to_string(q->arr.shape[0]) + " queries; a request holds 1 to " +
                           std::to_string(o.max_queries)};
    }
    if (q->arr.shape[1] < 1 || q->arr.shape[1] > o.max_query_tokens) {
        throw Bad{400, "body: " + std::to_string(q->arr.shape[1]) + " tokens a query; at most " +
                           std::to_string(o.max_query_tokens)};
    }
}

// Checks values and dimension, and points q->batch at the array.
void MakeBatch(Queries* q, const std::string& what, const IndexInfo& info) {
    EmbeddingView view;
    Status st = EmbeddingsFromArray(q->arr, 3, what, &view);
    if (!st.ok()) throw Bad{400, st.message()};
    if (view.dim != info.dim) {
        throw Bad{400,
                  what + ": dimension " + std::to_string(view.dim) + ", the index's is " + std::to_string(info.dim)};
    }
    q->batch.data = view.data;
    q->batch.dtype = view.dtype;
    q->batch.n_queries = int(q->arr.shape[0]);
    q->batch.q_tokens = int(q->arr.shape[1]);
    q->batch.dim = view.dim;
    q->batch.lengths = q->lengths.empty() ? nullptr : q->lengths.data();
}

// One search option from JSON or from the query string (text); false when `name` is not one.
bool SetSearchOption(const std::string& name, const json* j, const std::string* text, const ApiOptions& o,
                     SearchOptions* opts) {
    auto integer = [&](int64_t lo, int64_t hi) -> int {
        int64_t v = 0;
        const bool ok = j ? j->is_number_integer() && (v = j->get<int64_t>(), true) : ParseInt(*text, &v);
        if (!ok || v < lo || v > hi) {
            throw Bad{400, name + ": expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]"};
        }
        return int(v);
    };
    auto fraction = [&]() {  // a number in [0, 1]
        double v = 0;
        const bool ok = j ? j->is_number() && (v = j->get<double>(), true) : ParseDouble(*text, &v);
        if (!ok || !(v >= 0 && v <= 1)) throw Bad{400, name + ": expected a number in [0, 1]"};
        return v;
    };
    if (name == "k") {
        opts->k = integer(1, o.max_k);
    } else if (name == "nprobe") {
        opts->nprobe = integer(1, 1 << 20);
    } else if (name == "ncandidates") {
        opts->ncandidates = integer(0, 1 << 30);
    } else if (name == "rerank") {
        opts->rerank = integer(0, 1 << 30);
    } else if (name == "target_recall") {
        opts->target_recall = fraction();
    } else if (name == "exhaustive" || name == "certify" || name == "adaptive") {
        if (j ? !j->is_boolean() : (*text != "true" && *text != "false"))
            throw Bad{400, name + ": expected true or false"};
        (name == "exhaustive" ? opts->exhaustive
         : name == "certify"  ? opts->certify
                              : opts->adaptive) = j ? j->get<bool>() : *text == "true";
    } else if (name == "pruning") {
        const std::string v = j ? (j->is_string() ? j->get<std::string>() : "") : *text;
        if (v != "probe" && v != "interaction") throw Bad{400, "pruning: expected \"probe\" or \"interaction\""};
        opts->pruning = v == "probe" ? Pruning::kProbe : Pruning::kInteraction;
    } else if (name == "mode" || name == "fusion") {
        const std::string v = j ? (j->is_string() ? j->get<std::string>() : "") : *text;
        const Status st = name == "mode" ? ParseSearchMode(v, &opts->mode) : ParseFusion(v, &opts->fusion);
        if (!st.ok()) throw Bad{400, st.message()};
    } else if (name == "bm25_weight") {
        opts->bm25_weight = fraction();
    } else if (name == "lexical_candidates") {
        opts->lexical_candidates = integer(1, 100000);
    } else if (name == "filter") {
        if (j && !j->is_string()) throw Bad{400, "filter: expected a string"};
        opts->filter = j ? j->get<std::string>() : *text;
        if (opts->filter.size() > o.max_filter_chars) {
            throw Bad{400, "filter: longer than " + std::to_string(o.max_filter_chars) + " characters"};
        }
    } else {
        return false;
    }
    return true;
}

constexpr const char* kSearchFields =
    "queries, k, nprobe, ncandidates, rerank, target_recall, exhaustive, adaptive, certify, pruning, filter, subset, "
    "mode, texts, fusion, bm25_weight, lexical_candidates, fields, explain";

// A query's text (modes bm25 and hybrid), at most this long.
constexpr size_t kMaxTextBytes = 65536;

void AddText(const std::string& t, const ApiOptions& o, std::vector<std::string>* texts) {
    if (t.size() > kMaxTextBytes)
        throw Bad{400, "texts: a text longer than " + std::to_string(kMaxTextBytes) + " bytes"};
    if (texts->size() >= size_t(o.max_queries)) {
        throw Bad{400, "texts: more than " + std::to_string(o.max_queries) + " (a request's queries at most)"};
    }
    texts->push_back(t);
}

json ParseJsonBody(const std::string& body) {
    json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) throw Bad{400, "body: not valid JSON"};
    if (!j.is_object()) throw Bad{400, "body: expected a JSON object"};
    return j;
}

bool IsNpy(const HttpRequest& r) {
    const std::string ct = r.Header("Content-Type");
    return ct.rfind("application/x-npy", 0) == 0 || ct.rfind("application/octet-stream", 0) == 0;
}

// Per query {"ids", "scores"}, "metadata" (one object per hit) when `objects` holds them, every
// query's hits in order, and "explanations" (one per hit) when `ex` holds them.
json Hits(const std::vector<std::vector<SearchHit>>& results, const std::vector<std::string>* objects = nullptr,
          const std::vector<std::vector<Explanation>>* ex = nullptr) {
    json out = json::array();
    size_t at = 0;
    for (size_t q = 0; q < results.size(); ++q) {
        json ids = json::array(), scores = json::array(), meta = json::array(), why = json::array();
        for (size_t j = 0; j < results[q].size(); ++j) {
            const SearchHit& h = results[q][j];
            ids.push_back(h.doc_id);
            scores.push_back(h.score);
            if (objects) meta.push_back(json::parse((*objects)[at++]));
            if (ex) why.push_back(ExplanationJson((*ex)[q][j]));
        }
        json r = {{"ids", std::move(ids)}, {"scores", std::move(scores)}};
        if (objects) r["metadata"] = std::move(meta);
        if (ex) r["explanations"] = std::move(why);
        out.push_back(std::move(r));
    }
    return out;
}

// The metadata of every hit (Hits' objects).
void HitMetadata(const Searcher& s, const std::vector<std::vector<SearchHit>>& results,
                 const std::vector<std::string>& fields, std::vector<std::string>* objects) {
    std::vector<int64_t> docs;
    for (const auto& hits : results) {
        for (const auto& h : hits) docs.push_back(h.internal_id);
    }
    Status st = s.Metadata(docs, fields, objects);
    if (!st.ok()) throw Bad{400, st.message()};
}

// The documents a request may reach: its key's filter, narrowed to `ids` when given.
std::shared_ptr<const DocSet> Reach(const Searcher& s, const std::string& key_filter,
                                    const std::vector<std::string>* ids) {
    std::shared_ptr<DocSet> allowed;
    Status st = IndexService::Allowed(s, key_filter, &allowed);
    if (!st.ok()) throw Bad{500, "the key's filter: " + st.message()};
    if (!ids) return allowed;
    std::vector<int64_t> internal;
    s.FindDocs(*ids, &internal);
    auto sub = std::make_shared<DocSet>(s.info().n_docs);
    for (int64_t d : internal) {
        if (d >= 0 && (!allowed || allowed->Has(0, d))) sub->Add(0, d);
    }
    return sub;
}

}  // namespace

struct Api::Call {
    HttpRequest req;
    HttpReply reply;
    Clock::time_point start = Clock::now();
    std::string route;
    std::shared_ptr<const ApiKey> key;
    std::shared_ptr<IndexService> index;
    std::atomic<int> queries{0};
    std::atomic<bool> answered{false};
    HttpResponse resp;  // the worker's (the deadline thread answers with one of its own)

    void Json(int status, const json& j) {
        resp.status = status;
        resp.content_type = "application/json";
        resp.body = j.dump(-1, ' ', false, json::error_handler_t::replace);
    }
    void Error(int status, const std::string& message) { Json(status, json{{"error", message}}); }
    void Busy(const std::string& message) {
        Error(503, message);
        resp.headers.emplace_back("Retry-After", "1");
    }
    std::string KeyFilter() const { return key ? key->filter : std::string(); }
};

Api::Api(const ApiOptions& opts, std::unique_ptr<ApiKeys> keys)
    : opts_(opts),
      keys_(std::move(keys)),
      searchers_(opts.workers, opts.queue),
      writer_(opts.write_workers, opts.write_queue) {
    if (opts_.recalibrate_after > 0) calibrator_ = std::thread([this] { Recalibrate(); });
    if (opts_.request_timeout.count() > 0) expirer_ = std::thread([this] { Expire(); });
}

Api::~Api() { Stop(); }

void Api::Stop() {
    {
        std::lock_guard<std::mutex> lk(threads_mu_);
        stopping_ = true;
    }
    if (const auto index = std::atomic_load(&index_)) index->StopRecalibrating();
    calibrator_cv_.notify_all();
    deadline_cv_.notify_all();
    if (calibrator_.joinable()) calibrator_.join();
    if (expirer_.joinable()) expirer_.join();
    searchers_.Stop();
    writer_.Stop();
}

void Api::Expire() {
    std::unique_lock<std::mutex> lk(threads_mu_);
    while (!stopping_) {
        if (deadlines_.empty()) {
            deadline_cv_.wait(lk);
            continue;
        }
        const auto at = deadlines_.top().first;
        if (Clock::now() < at) {
            deadline_cv_.wait_until(lk, at);
            continue;
        }
        const std::shared_ptr<Call> c = deadlines_.top().second.lock();
        deadlines_.pop();
        if (!c || c->answered) continue;
        lk.unlock();
        HttpResponse r;
        r.status = 504;
        r.content_type = "application/json";
        r.body = json{{"error", "not answered within " + std::to_string(opts_.request_timeout.count()) +
                                    " ms (--request-timeout-ms): try fewer queries, a smaller k, or later"}}
                     .dump();
        Send(*c, std::move(r));
        lk.lock();
    }
}

void Api::Recalibrate() {
    std::unique_lock<std::mutex> lk(threads_mu_);
    while (!stopping_) {
        calibrator_cv_.wait_for(lk, std::chrono::milliseconds(250));
        const auto index = std::atomic_load(&index_);
        if (stopping_ || !index || !index->RecalibrationDue(opts_.recalibrate_after)) continue;
        const int64_t idle_ns = Clock::now().time_since_epoch().count() - last_search_ns_.load();
        if (idle_ns < std::chrono::nanoseconds(opts_.recalibrate_idle).count() || searchers_.running() > 0 ||
            searchers_.queued() > 0) {
            continue;
        }
        lk.unlock();
        bool measured = false;
        const Status st = index->Recalibrate(opts_.recalibrate_after, &measured);
        if (!st.ok() && st.code() != Status::Code::kCancelled)
            Logf(LogLevel::kWarning, "tms serve: recall estimate on served queries: %s\n", st.message().c_str());
        lk.lock();
    }
}

void Api::SetIndex(std::unique_ptr<IndexService> index) {
    std::atomic_store(&index_, std::shared_ptr<IndexService>(std::move(index)));
}

void Api::Handle(HttpRequest&& req, HttpReply reply) {
    auto c = std::make_shared<Call>();
    c->req = std::move(req);
    c->reply = std::move(reply);
    c->route = RouteLabel(c->req.path);
    c->index = std::atomic_load(&index_);
    const std::string& path = c->req.path;
    const std::string& method = c->req.method;
    struct Route {
        const char* path;
        const char* method;
        unsigned scope;  // 0: open to all
    };
    static const Route kTable[] = {{"/health", "GET", 0},
                                   {"/ready", "GET", 0},
                                   {"/openapi.json", "GET", 0},
                                   {"/metrics", "GET", kAdmin},
                                   {"/v1/info", "GET", kRead},
                                   {"/v1/search", "POST", kRead},
                                   {"/v1/rerank", "POST", kRead},
                                   {"/v1/documents", "POST", kWrite},
                                   {"/v1/documents/delete", "POST", kWrite},
                                   {"/v1/compact", "POST", kAdmin}};
    const Route* route = nullptr;
    for (const Route& r : kTable) {
        if (path == r.path) route = &r;
    }
    if (!route) {
        c->Error(404, "no such endpoint: " + path + " (see /openapi.json)");
        return Finish(*c);
    }
    if (method != route->method) {
        c->Error(405, "use " + std::string(route->method) + " " + path);
        c->resp.headers.emplace_back("Allow", route->method);
        return Finish(*c);
    }
    if (route->scope && keys_) {
        std::string presented = c->req.Header("X-API-Key");
        const std::string auth = c->req.Header("Authorization");
        if (presented.empty() && auth.rfind("Bearer ", 0) == 0) presented = auth.substr(7);
        if (presented.empty()) {
            c->Error(401, "an API key is needed: Authorization: Bearer KEY (or X-API-Key: KEY)");
            c->resp.headers.emplace_back("WWW-Authenticate", "Bearer");
            return Finish(*c);
        }
        c->key = keys_->Find(presented);
        if (!c->key) {
            c->Error(401, "unknown API key");
            c->resp.headers.emplace_back("WWW-Authenticate", "Bearer");
            return Finish(*c);
        }
        if (!(c->key->scopes & route->scope)) {
            const char* need = route->scope == kRead ? "read" : route->scope == kWrite ? "write" : "admin";
            c->Error(403, "this key has no " + std::string(need) + " scope");
            return Finish(*c);
        }
    }
    if (path == "/health") {
        c->Json(200, {{"status", "ok"}});
        return Finish(*c);
    }
    if (path == "/openapi.json") {
        c->resp.body = kOpenApiJson;
        return Finish(*c);
    }
    if (path == "/ready") {
        if (c->index) {
            c->Json(200, {{"ready", true}, {"n_docs", c->index->Current()->info().n_docs}});
        } else {
            c->Json(503, {{"ready", false}, {"error", "the index is still loading"}});
            c->resp.headers.emplace_back("Retry-After", "1");
        }
        return Finish(*c);
    }
    if (path == "/metrics") {
        std::map<std::string, double> g;
        g["tms_search_queue_depth"] = searchers_.queued();
        g["tms_search_workers_busy"] = searchers_.running();
        g["tms_write_queue_depth"] = writer_.queued() + writer_.running();
        if (counters_) {
            const HttpCounters h = counters_();
            g["tms_connections_open"] = double(h.connections_open);
            g["tms_connections_total"] = double(h.connections_total);
            g["tms_connections_refused_total"] = double(h.connections_refused);
            g["tms_read_timeouts_total"] = double(h.timeouts);
        }
        if (c->index) {
            auto s = c->index->Current();
            g["tms_index_documents"] = double(s->info().n_docs - s->info().n_deleted);
            g["tms_index_tokens"] = double(s->info().n_tokens);
            g["tms_index_writes_total"] = double(c->index->generation());
            int64_t bytes = 0, vbytes = 0;
            for (const auto& p : s->placement()) {
                g["tms_shard_bytes{shard=\"" + std::to_string(p.shard) + "\",device=\"" +
                  (p.device == Device::kGpu ? "gpu" + std::to_string(p.gpu) : std::string("cpu")) + "\"}"] =
                    double(p.bytes + p.vector_bytes);
                bytes += p.bytes;
                vbytes += p.vector_bytes;
            }
            g["tms_index_memory_bytes"] = double(bytes + vbytes);
            // The driver's view of each GPU the index is on (other processes' use included).
            std::set<int> gpus;
            for (const auto& p : s->placement()) {
                if (p.device == Device::kGpu) gpus.insert(p.gpu);
            }
            for (const int gpu : gpus) {
                GpuMemory m;
                if (!GetGpuMemory(gpu, &m).ok()) continue;
                const std::string label = "{gpu=\"" + std::to_string(gpu) + "\"}";
                g["tms_gpu_memory_free_bytes" + label] = double(m.free_bytes);
                g["tms_gpu_memory_total_bytes" + label] = double(m.total_bytes);
            }
        }
        c->resp.content_type = "text/plain; version=0.0.4";
        c->resp.body = metrics_.Text(g);
        return Finish(*c);
    }
    if (!c->index) {
        c->Busy("the index is still loading");
        return Finish(*c);
    }
    if (path == "/v1/info") {
        Info(*c);
        return Finish(*c);
    }
    Dispatch(c);
}

void Api::Dispatch(const std::shared_ptr<Call>& c) {
    const bool write = c->req.path.rfind("/v1/documents", 0) == 0 || c->req.path == "/v1/compact";
    WorkerPool& pool = write ? writer_ : searchers_;
    if (!write && opts_.request_timeout.count() > 0) {
        std::lock_guard<std::mutex> lk(threads_mu_);
        const bool earliest = deadlines_.empty() || c->start + opts_.request_timeout < deadlines_.top().first;
        deadlines_.emplace(c->start + opts_.request_timeout, c);
        if (earliest) deadline_cv_.notify_all();
    }
    const bool queued = pool.TryPost([this, c] {
        if (c->answered) return;  // expired while it waited: nobody waits for its work
        if (Clock::now() - c->start > opts_.queue_timeout) {
            c->Busy("the request waited longer than " + std::to_string(opts_.queue_timeout.count()) +
                    " ms for a worker");
            return Finish(*c);
        }
        try {
            if (c->req.path == "/v1/search")
                Search(*c);
            else if (c->req.path == "/v1/rerank")
                Rerank(*c);
            else if (c->req.path == "/v1/documents")
                Add(*c);
            else if (c->req.path == "/v1/compact")
                Compact(*c);
            else
                Delete(*c);
        } catch (const Bad& b) {
            c->Error(b.status, b.message);
        } catch (const json::exception& e) {
            c->Error(400, std::string("body: ") + e.what());
        } catch (const std::bad_alloc&) {
            c->Busy("out of memory for this request");
        } catch (const std::exception& e) {
            c->Error(500, std::string("internal error: ") + e.what());
        }
        Finish(*c);
    });
    if (!queued) {
        c->Busy(write ? "too many writes are waiting: try again" : "the server is busy: try again");
        Finish(*c);
    }
}

void Api::Info(Call& c) {
    std::shared_ptr<const RecallEstimate> e;
    const auto s = c.index->Current(&e);
    const IndexInfo& i = s->info();
    json cols = json::array();
    for (const auto& m : i.metadata_columns) cols.push_back({{"name", m.name}, {"type", MetaTypeName(m.type)}});
    // The recall estimate the default search plans from, and what it plans.
    json estimate = nullptr;
    if (e) {
        estimate = {{"source", e->sampled ? "sample" : "pseudo-queries"},
                    {"queries", e->queries},
                    {"measured_at", e->measured_at}};
    }
    const SearchOptions plan = s->Plan(SearchOptions());
    c.Json(200, {{"n_docs", i.n_docs - i.n_deleted},
                 {"n_deleted", i.n_deleted},
                 {"n_tokens", i.n_tokens},
                 {"dim", i.dim},
                 {"codec", i.codec},
                 {"n_centroids", i.n_centroids},
                 {"has_vectors", i.has_vectors},
                 {"shards", i.shards.size()},
                 {"metadata_columns", cols},
                 {"device", DeviceName(s->device())},
                 {"writes", c.index->generation()},
                 {"queries_recorded", c.index->queries_seen()},
                 {"estimate", estimate},
                 {"default_search",
                  {{"nprobe", plan.nprobe},
                   {"ncandidates", plan.ncandidates},
                   {"rerank", plan.rerank},
                   {"exhaustive", plan.exhaustive}}}});
}

void Api::Search(Call& c) {
    last_search_ns_ = Clock::now().time_since_epoch().count();
    const auto s = c.index->Current();
    Queries q;
    SearchOptions opts;
    std::vector<std::string> subset, fields, texts;
    bool has_subset = false, has_fields = false, explain = false;
    const auto set_explain = [&](bool is, bool v) {
        if (!is) throw Bad{400, "explain: expected true or false"};
        explain = v;
    };
    if (IsNpy(c.req)) {
        QueriesFromNpy(c.req.body, opts_, &q);
        for (const auto& [name, value] : c.req.query) {
            if (name == "text") {  // one per query, in order
                AddText(value, opts_, &texts);
            } else if (name == "explain") {
                set_explain(value == "true" || value == "false", value == "true");
            } else if (name == "subset") {
                subset.push_back(value);
                has_subset = true;
            } else if (name == "fields") {
                if (!value.empty()) fields.push_back(value);
                has_fields = true;
            } else if (!SetSearchOption(name, nullptr, &value, opts_, &opts)) {
                throw Bad{400, "unknown parameter '" + name + "' (parameters: " + std::string(kSearchFields + 9) + ")"};
            }
        }
    } else {
        const json j = ParseJsonBody(c.req.body);
        for (const auto& [name, value] : j.items()) {
            if (name == "queries") {
                QueriesFromJson(value, opts_, &q);
            } else if (name == "explain") {
                set_explain(value.is_boolean(), value.is_boolean() && value.get<bool>());
            } else if (name == "texts") {
                if (!value.is_array()) throw Bad{400, "texts: expected an array of strings (one per query)"};
                for (const auto& t : value) {
                    if (!t.is_string()) throw Bad{400, "texts: expected an array of strings (one per query)"};
                    AddText(t.get<std::string>(), opts_, &texts);
                }
            } else if (name == "subset") {
                subset = IdList(value, "subset", size_t(1) << 24);
                has_subset = true;
            } else if (name == "fields") {
                if (!value.is_array()) throw Bad{400, "fields: expected an array of metadata column names"};
                for (const auto& f : value) {
                    if (!f.is_string()) throw Bad{400, "fields: expected an array of metadata column names"};
                    fields.push_back(f.get<std::string>());
                }
                has_fields = true;
            } else if (!SetSearchOption(name, &value, nullptr, opts_, &opts)) {
                throw Bad{400, "unknown field '" + name + "' (fields: " + std::string(kSearchFields) + ")"};
            }
        }
        if (!j.contains("queries") && opts.mode == SearchMode::kBm25 && !texts.empty()) {
            // BM25 alone reads no embeddings: a query of one zero token per text.
            q.arr.descr = "<f4";
            q.arr.shape = {int64_t(texts.size()), 1, int64_t(s->info().dim)};
            q.arr.bytes.assign(size_t(q.arr.numel()) * 4, 0);
        } else if (!j.contains("queries")) {
            throw Bad{400, "queries: missing"};
        }
    }
    MakeBatch(&q, IsNpy(c.req) ? "body" : "queries", s->info());
    c.queries = q.batch.n_queries;
    if (opts.mode != SearchMode::kMaxSim) {
        if (texts.size() != size_t(q.batch.n_queries)) {
            throw Bad{400, "texts: " + std::to_string(texts.size()) + " for " + std::to_string(q.batch.n_queries) +
                               " queries (mode " + SearchModeName(opts.mode) + " takes one text per query)"};
        }
        opts.query_texts = std::make_shared<const std::vector<std::string>>(std::move(texts));
    }
    opts.allow = Reach(*s, c.KeyFilter(), has_subset ? &subset : nullptr);
    std::vector<std::vector<SearchHit>> results;
    SearchTimings t;
    Status st = s->Search(q.batch, opts, &results, &t);
    last_search_ns_ = Clock::now().time_since_epoch().count();
    if (!st.ok()) return c.Error(StatusCode(st), st.message());
    metrics_.Stages(t.candidates, t.scoring, t.rerank);
    std::vector<std::string> objects;
    if (has_fields) HitMetadata(*s, results, fields, &objects);
    std::vector<std::vector<Explanation>> ex;
    if (explain) {
        std::vector<std::vector<int64_t>> docs(results.size());
        for (size_t i = 0; i < results.size(); ++i)
            for (const SearchHit& h : results[i]) docs[i].push_back(h.internal_id);
        st = s->Explain(q.batch, docs, &ex);
        if (!st.ok()) return c.Error(StatusCode(st), st.message());
    }
    // Per query, whether its top-k was certified (request field certify); null where the search
    // does not certify (certify off, exhaustive, no vectors).
    json certified = nullptr;
    if (!t.certified.empty()) {
        certified = json::array();
        for (const uint8_t v : t.certified) certified.push_back(v != 0);
    }
    // Per query, how many steps deeper its second search went (0: searched once; adaptive or
    // certify); null where no query could go deeper.
    json depth = nullptr;
    if (!t.depth.empty()) depth = t.depth;
    c.Json(200, {{"results", Hits(results, has_fields ? &objects : nullptr, explain ? &ex : nullptr)},
                 {"certified", certified},
                 {"depth", depth},
                 {"timings_ms",
                  {{"candidates", t.candidates * 1e3},
                   {"scoring", t.scoring * 1e3},
                   {"rerank", t.rerank * 1e3},
                   {"total", t.total * 1e3}}}});
}

void Api::Rerank(Call& c) {
    const auto s = c.index->Current();
    const json j = ParseJsonBody(c.req.body);
    Queries q;
    int k = 0;
    std::vector<std::vector<std::string>> cands;
    for (const auto& [name, value] : j.items()) {
        if (name == "queries") {
            QueriesFromJson(value, opts_, &q);
        } else if (name == "candidates") {
            if (!value.is_array()) throw Bad{400, "candidates: expected an array (a list of ids per query)"};
            for (size_t i = 0; i < value.size(); ++i) {
                cands.push_back(IdList(value[i], "candidates[" + std::to_string(i) + "]", 100000));
            }
        } else if (name == "k") {
            if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > opts_.max_k) {
                throw Bad{400, "k: expected an integer in [0, " + std::to_string(opts_.max_k) + "]"};
            }
            k = value.get<int>();
        } else {
            throw Bad{400, "unknown field '" + name + "' (fields: queries, candidates, k)"};
        }
    }
    if (!j.contains("queries")) throw Bad{400, "queries: missing"};
    MakeBatch(&q, "queries", s->info());
    if (int(cands.size()) != q.batch.n_queries) {
        throw Bad{400, "candidates: " + std::to_string(cands.size()) + " lists for " +
                           std::to_string(q.batch.n_queries) + " queries"};
    }
    c.queries = q.batch.n_queries;
    const auto reach = Reach(*s, c.KeyFilter(), nullptr);
    std::vector<std::vector<int64_t>> internal(cands.size());
    for (size_t i = 0; i < cands.size(); ++i) {
        std::vector<int64_t> ids;
        s->FindDocs(cands[i], &ids);
        for (int64_t d : ids) {
            if (d >= 0 && (!reach || reach->Has(0, d))) internal[i].push_back(d);  // others: as if absent
        }
    }
    std::vector<std::vector<SearchHit>> results;
    Status st = s->Rerank(q.batch, internal, k, &results);
    if (!st.ok()) return c.Error(StatusCode(st), st.message());
    c.Json(200, {{"results", Hits(results)}});
}

namespace {

// What an add request holds: the documents' tokens (`view`, over `arr`), their lengths, ids and
// metadata.
struct AddRequest {
    HostArray arr;
    EmbeddingView view;
    std::vector<int64_t> doclens;
    std::vector<std::string> ids;
    DocMetadata md;
    bool has_md = false, replace = false;
};

// An add request's field other than the documents' tokens (ids, metadata, replace, and with a
// binary body doclens); false when `name` is not one.
bool AddField(const std::string& name, const json& value, bool binary, const ApiOptions& o, AddRequest* r) {
    if (name == "ids") {
        r->ids = IdList(value, "ids", size_t(o.max_docs_per_add));
    } else if (name == "metadata") {
        if (!value.is_array()) throw Bad{400, "metadata: expected an array of objects, one per document"};
        for (size_t i = 0; i < value.size(); ++i) {
            if (!value[i].is_object()) throw Bad{400, "metadata[" + std::to_string(i) + "]: expected an object"};
            r->md.objects.push_back(value[i].dump());
        }
        r->has_md = true;
    } else if (name == "replace") {
        if (!value.is_boolean()) throw Bad{400, "replace: expected true or false"};
        r->replace = value.get<bool>();
    } else if (name == "doclens" && binary) {
        if (!value.is_array() || value.empty()) throw Bad{400, "doclens: expected a non-empty array of token counts"};
        if (int64_t(value.size()) > o.max_docs_per_add) {
            throw Bad{400, "doclens: more than " + std::to_string(o.max_docs_per_add) + " documents in one request"};
        }
        for (size_t i = 0; i < value.size(); ++i) {
            if (!value[i].is_number_integer() || value[i].get<int64_t>() < 1 || value[i].get<int64_t>() > (1 << 20)) {
                throw Bad{400, "doclens[" + std::to_string(i) + "]: expected an integer in [1, 1048576]"};
            }
            r->doclens.push_back(value[i].get<int64_t>());
        }
    } else {
        return false;
    }
    return true;
}

// A JSON body: {"documents": [[[dim numbers] per token] per document], "ids", "metadata", "replace"}.
void AddFromJson(const std::string& body, const ApiOptions& o, AddRequest* r) {
    const json j = ParseJsonBody(body);
    std::vector<float> values;
    int dim = 0;
    for (const auto& [name, value] : j.items()) {
        if (name == "documents") {
            if (!value.is_array() || value.empty())
                throw Bad{400, "documents: expected a non-empty array of documents"};
            if (int64_t(value.size()) > o.max_docs_per_add) {
                throw Bad{400, "documents: more than " + std::to_string(o.max_docs_per_add) + " in one request"};
            }
            for (size_t i = 0; i < value.size(); ++i) {
                r->doclens.push_back(
                    AppendTokens(value[i], "documents[" + std::to_string(i) + "]", &dim, 1 << 20, &values));
            }
        } else if (!AddField(name, value, /*binary=*/false, o, r)) {
            throw Bad{400, "unknown field '" + name + "' (fields: documents, ids, metadata, replace)"};
        }
    }
    if (r->doclens.empty()) throw Bad{400, "documents: missing"};
    r->arr.descr = "<f4";
    r->arr.shape = {int64_t(values.size()) / dim, dim};
    r->arr.bytes.resize(values.size() * 4);
    memcpy(r->arr.bytes.data(), values.data(), r->arr.bytes.size());
}

// A multipart/form-data body: a part "documents" (.npy [tokens, dim] of every document's tokens
// in order: f2, f4 or bf16 as float32) and a part "request" (JSON: "doclens", "ids", "metadata",
// "replace").
void AddFromForm(const HttpRequest& req, const ApiOptions& o, AddRequest* r) {
    std::vector<FormPart> parts;
    Status st = ParseFormData(req.Header("Content-Type"), req.body, &parts);
    if (!st.ok()) throw Bad{400, st.message()};
    bool docs = false, fields = false;
    for (const FormPart& p : parts) {
        if (p.name == "documents") {
            st = ParseNpy(std::string(p.data), "documents", &r->arr);
            if (!st.ok()) throw Bad{400, st.message()};
            if (r->arr.shape.size() != 2) throw Bad{400, "documents: expected a .npy of [tokens, dim]"};
            docs = true;
        } else if (p.name == "request") {
            const json j = ParseJsonBody(std::string(p.data));
            for (const auto& [name, value] : j.items()) {
                if (!AddField(name, value, /*binary=*/true, o, r)) {
                    throw Bad{400, "request: unknown field '" + name + "' (fields: doclens, ids, metadata, replace)"};
                }
            }
            fields = true;
        } else {
            throw Bad{400, "body: unknown part '" + p.name + "' (parts: documents, request)"};
        }
    }
    if (!docs) throw Bad{400, "documents: missing (a part of .npy [tokens, dim])"};
    if (!fields || r->doclens.empty()) throw Bad{400, "doclens: missing (in the part \"request\")"};
    int64_t total = 0;
    for (const int64_t n : r->doclens) total += n;
    if (total != r->arr.shape[0]) {
        throw Bad{400, "doclens: they add up to " + std::to_string(total) + " tokens, documents holds " +
                           std::to_string(r->arr.shape[0])};
    }
}

}  // namespace

void Api::Add(Call& c) {
    AddRequest r;
    if (IsFormData(c.req.Header("Content-Type"))) {
        AddFromForm(c.req, opts_, &r);
    } else {
        AddFromJson(c.req.body, opts_, &r);
    }
    if (r.ids.size() != r.doclens.size()) {
        throw Bad{400, "ids: " + std::to_string(r.ids.size()) + " ids for " + std::to_string(r.doclens.size()) +
                           " documents"};
    }
    // (How the metadata objects match the documents, by order or by "id": ResolveMetadata.)
    r.md.source = "metadata";
    Status st = EmbeddingsFromArray(r.arr, 2, "documents", &r.view);
    if (!st.ok()) throw Bad{400, st.message()};
    const int index_dim = c.index->Current()->info().dim;
    if (r.view.dim != index_dim) {
        throw Bad{400, "documents: dimension " + std::to_string(r.view.dim) + ", the index's is " +
                           std::to_string(index_dim)};
    }
    st = c.index->Add(r.view, r.doclens, r.ids, r.replace, r.has_md ? &r.md : nullptr, c.KeyFilter());
    if (!st.ok()) return c.Error(StatusCode(st), st.message());
    const IndexInfo& i = c.index->Current()->info();
    c.Json(200, {{"added", r.ids.size()}, {"n_docs", i.n_docs - i.n_deleted}});
}

void Api::Delete(Call& c) {
    const json j = ParseJsonBody(c.req.body);
    std::vector<std::string> ids;
    for (const auto& [name, value] : j.items()) {
        if (name != "ids") throw Bad{400, "unknown field '" + name + "' (fields: ids)"};
        ids = IdList(value, "ids", size_t(opts_.max_docs_per_add));
    }
    if (ids.empty()) throw Bad{400, "ids: missing or empty"};
    int64_t deleted = 0;
    Status st = c.index->Delete(ids, c.KeyFilter(), &deleted);
    if (!st.ok()) return c.Error(StatusCode(st), st.message());
    const IndexInfo& i = c.index->Current()->info();
    c.Json(200, {{"deleted", deleted}, {"n_docs", i.n_docs - i.n_deleted}});
}

void Api::Compact(Call& c) {
    if (!c.req.body.empty() && ParseJsonBody(c.req.body).size() > 0) throw Bad{400, "compact takes no fields"};
    Status st = c.index->Compact();
    if (!st.ok()) return c.Error(StatusCode(st), st.message());
    const IndexInfo& i = c.index->Current()->info();
    c.Json(200, {{"n_docs", i.n_docs - i.n_deleted}, {"n_deleted", i.n_deleted}});
}

std::unique_ptr<HttpServer> ListenApi(const std::shared_ptr<Api>& api, const std::string& host, int port,
                                      const HttpLimits& limits, std::string* error) {
    auto http = HttpServer::Listen(
        host, port, limits, [api](HttpRequest&& r, HttpReply reply) { api->Handle(std::move(r), std::move(reply)); },
        error);
    if (http) api->SetCounters([h = http.get()] { return h->counters(); });
    return http;
}

void Api::Finish(Call& c) { Send(c, std::move(c.resp)); }

void Api::Send(Call& c, HttpResponse resp) {
    if (c.answered.exchange(true)) return;
    const double secs = std::chrono::duration<double>(Clock::now() - c.start).count();
    metrics_.Request(c.route, resp.status, secs, c.queries.load());
    if (LogEnabled(LogLevel::kInfo)) {
        const std::string who = c.key ? c.key->name : "-";
        if (opts_.log_json) {
            json line = {{"ts", double(time(nullptr))},
                         {"method", c.req.method},
                         {"path", c.route},
                         {"status", resp.status},
                         {"ms", secs * 1e3},
                         {"queries", c.queries.load()},
                         {"key", who},
                         {"remote", c.req.remote}};
            Logf(LogLevel::kInfo, "%s\n", line.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
        } else {
            Logf(LogLevel::kInfo, "tms serve: %s %s %d %.2f ms queries=%d key=%s remote=%s\n", c.req.method.c_str(),
                 c.route.c_str(), resp.status, secs * 1e3, c.queries.load(), who.c_str(), c.req.remote.c_str());
        }
    }
    HttpReply reply = std::move(c.reply);
    reply(std::move(resp));
}

}  // namespace tms::server

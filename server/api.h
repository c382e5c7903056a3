// Copyright TileMaxSim authors. The HTTP API of `tms serve` (version 1; openapi.json describes it).
//
//   GET  /health                 live (always 200 while the process serves)
//   GET  /ready                  200 once the index is open, 503 before
//   GET  /metrics                Prometheus text (scope admin when keys are on)
//   GET  /openapi.json           this API
//   GET  /v1/info                what the index holds (read)
//   POST /v1/search              queries -> top-k ids and scores (read)
//   POST /v1/rerank              queries and candidate ids -> exact scores (read)
//   POST /v1/documents           add or replace documents (write)
//   POST /v1/documents/delete    delete documents by id (write)
//   POST /v1/compact             drop deleted documents now (admin)
//
// Searches and writes run on worker pools with bounded queues: a full queue is 503 with
// Retry-After at once. Every error is {"error": "<one line>"} with its status.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <condition_variable>
#include <mutex>
#include <queue>
#include <string>
#include <thread>

#include "server/api_keys.h"
#include "server/http_server.h"
#include "server/index_service.h"
#include "server/metrics.h"
#include "server/worker_pool.h"

namespace tms::server {

struct ApiOptions {
    int workers = 64;        ///< threads that search (concurrent searches are gathered into batches)
    int queue = 256;         ///< searches that may wait for a worker; more: 503
    int write_workers = 64;  ///< writes that may wait together for one group commit
    int write_queue = 1024;  ///< writes that may wait for a writer; more: 503
    int max_queries = 1024;  ///< queries in one request
    int max_query_tokens = 1024;
    int max_k = 10000;
    int64_t max_docs_per_add = 100000;
    size_t max_filter_chars = 100000;
    std::chrono::milliseconds queue_timeout{10000};  ///< a request that waited longer: 503
    /// A search or rerank not answered this long after it arrived is answered 504 then (its work,
    /// if it started, runs to its end and is dropped; a request expired in the queue never runs).
    /// Writes have none: their outcome must be the answer. 0: none.
    std::chrono::milliseconds request_timeout{30000};
    bool log_json = false;
    /// Measure the recall estimate again on the sample of the queries served (the index's
    /// SearcherOptions::record_into) once this many more were served (0: never), when no search
    /// has run for recalibrate_idle (IndexService::Recalibrate).
    int64_t recalibrate_after = 1000;
    std::chrono::milliseconds recalibrate_idle{2000};
};

class Api {
public:
    /// `keys` may be null: every request is allowed (the server then listens on loopback only).
    Api(const ApiOptions& opts, std::unique_ptr<ApiKeys> keys);
    ~Api();

    /// The index, once open (until then searches are 503 and /ready says so).
    void SetIndex(std::unique_ptr<IndexService> index);
    /// The transport's counters, for /metrics.
    void SetCounters(std::function<HttpCounters()> counters) { counters_ = std::move(counters); }
    /// Serves one request (HttpHandler).
    void Handle(HttpRequest&& req, HttpReply reply);
    /// Finishes the queued work (after the transport stopped accepting).
    void Stop();

private:
    struct Call;
    void Dispatch(const std::shared_ptr<Call>& call);
    void Search(Call& c);
    void Rerank(Call& c);
    void Add(Call& c);
    void Delete(Call& c);
    void Compact(Call& c);
    void Info(Call& c);
    void Finish(Call& c);
    void Send(Call& c, HttpResponse resp);  // the first answer of c goes, later ones are dropped
    void Recalibrate();                     // the calibrator thread
    void Expire();                          // the deadline thread (request_timeout)

    ApiOptions opts_;
    std::unique_ptr<ApiKeys> keys_;
    std::shared_ptr<IndexService> index_;  // set once (atomic load/store)
    std::function<HttpCounters()> counters_;
    Metrics metrics_;
    WorkerPool searchers_, writer_;
    std::atomic<int64_t> last_search_ns_{0};  // steady clock, when a search last started or ended
    std::mutex threads_mu_;                   // stopping_, deadlines_
    std::condition_variable calibrator_cv_;
    bool stopping_ = false;
    std::thread calibrator_;
    // Read requests by deadline (earliest first), for the deadline thread.
    using Deadline = std::pair<std::chrono::steady_clock::time_point, std::weak_ptr<Call>>;
    struct Later {
        bool operator()(const Deadline& a, const Deadline& b) const { return a.first > b.first; }
    };
    std::priority_queue<Deadline, std::vector<Deadline>, Later> deadlines_;  // under threads_mu_
    std::condition_variable deadline_cv_;
    std::thread expirer_;
};

/// An HttpServer listening on host:port whose requests `api` answers (and whose counters its
/// /metrics reports); null with *error when it cannot listen. After Run returns, api->Stop().
std::unique_ptr<HttpServer> ListenApi(const std::shared_ptr<Api>& api, const std::string& host, int port,
                                      const HttpLimits& limits, std::string* error);

}  // namespace tms::server

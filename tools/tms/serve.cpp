// Copyright TileMaxSim authors. `tms serve`: the index as an HTTP service (server/api.h).
#include <csignal>
#include <unistd.h>
#include <cerrno>
#include <sys/resource.h>
#include <thread>

#include "base/log.h"
#include "server/api.h"
#include "server/http_server.h"
#include "tools/tms/common.h"

namespace tms::cli {
namespace {

struct ServeArgs {
    std::string index, host = "127.0.0.1", api_keys, device = "auto", devices, vectors = "auto";
    int port = 8080, io_threads = 2, gather_us = 0, read_timeout_s = 30, grace_s = 30;
    int64_t max_body_mib = 64, queue_timeout_ms = 10000, request_timeout_ms = 30000, recalibrate_idle_ms = 2000;
    int record_queries = 1000;
    double compact_deleted = 0.25;
    bool log_json = false, insecure = false;
    server::ApiOptions api;
};

int g_signal_pipe[2] = {-1, -1};

void OnStopSignal(int sig) {
    const unsigned char b = static_cast<unsigned char>(sig);
    if (write(g_signal_pipe[1], &b, 1) < 0) {}
}

bool IsLoopback(const std::string& host) { return host == "127.0.0.1" || host == "::1" || host == "localhost"; }

// A process serving many connections needs more descriptors than the usual soft limit of 1,024.
void RaiseFileLimit() {
    struct rlimit rl {};
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

int RunServe(const ServeArgs& a) {
    if (!IsLoopback(a.host) && a.api_keys.empty() && !a.insecure) {
        return fail("serve", tms::Status::InvalidArgument(
                                 "--host " + a.host +
                                 " serves beyond this machine: give --api-keys FILE (or --insecure to serve "
                                 "without keys)"));
    }
    std::unique_ptr<server::ApiKeys> keys;
    if (!a.api_keys.empty()) {
        tms::Status st = server::ApiKeys::Load(a.api_keys, &keys);
        if (!st.ok()) return fail("serve", st);
    }
    tms::SearcherOptions so;
    tms::Status st = parse_placement(a.device, a.devices, a.vectors, &so);
    if (!st.ok()) return fail("serve", st);
    so.gather = true;
    so.gather_us = a.gather_us;
    if (a.record_queries > 0) so.record_into = std::make_shared<tms::QuerySample>(a.record_queries);
    tms::IndexInfo info;
    st = tms::ReadIndexInfo(a.index, &info);  // a missing or broken index fails before listening
    if (!st.ok()) return fail("serve", st);

    RaiseFileLimit();
    // SIGTERM and SIGINT write their number to a pipe (whichever thread they interrupt; OpenMP's
    // may exist already); one thread reads it and shuts the server down.
    if (pipe(g_signal_pipe) != 0) return fail("serve", tms::Status::IOError("pipe() failed"));
    struct sigaction sa {};
    sa.sa_handler = OnStopSignal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    signal(SIGPIPE, SIG_IGN);

    server::ApiOptions ao = a.api;
    ao.log_json = a.log_json;
    ao.queue_timeout = std::chrono::milliseconds(a.queue_timeout_ms);
    ao.request_timeout = std::chrono::milliseconds(a.request_timeout_ms);
    ao.recalibrate_idle = std::chrono::milliseconds(a.recalibrate_idle_ms);
    if (a.record_queries == 0) ao.recalibrate_after = 0;
    const bool with_keys = keys != nullptr;
    const size_t n_keys = with_keys ? keys->size() : 0;
    auto api = std::make_shared<server::Api>(ao, std::move(keys));
    server::HttpLimits limits;
    limits.max_body = a.max_body_mib << 20;
    limits.read_timeout = std::chrono::seconds(a.read_timeout_s);
    std::string error;
    auto http = server::ListenApi(api, a.host, a.port, limits, &error);
    if (!http) return fail("serve", tms::Status::IOError(error));
    tms::LogInfo("tms serve: listening on http://%s:%d/ (%s)\n",
                 a.host.find(':') != std::string::npos ? ("[" + a.host + "]").c_str() : a.host.c_str(), http->port(),
                 with_keys ? (std::to_string(n_keys) + " API keys from " + a.api_keys).c_str()
                           : "no API keys: every request is allowed, from this machine only");

    // The index opens while the server answers /health (and /ready says 503).
    std::atomic<bool> open_failed{false};
    std::thread opener([&] {
        std::unique_ptr<server::IndexService> index;
        const auto t0 = Clock::now();
        tms::Status ost = server::IndexService::Open(a.index, so, &index, a.compact_deleted);
        if (!ost.ok()) {
            fail("serve", ost);
            open_failed = true;
            http->Shutdown(std::chrono::milliseconds(0));
            return;
        }
        const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
        tms::LogInfo("tms serve: %s open in %.2f s (%lld documents, %s): ready\n", a.index.c_str(), secs,
                     (long long)(index->Current()->info().n_docs - index->Current()->info().n_deleted),
                     tms::DeviceName(index->Current()->device()));
        api->SetIndex(std::move(index));
    });
    std::thread waiter([&] {
        unsigned char sig = 0;
        while (read(g_signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {}
        if (sig == 0) return;  // the server stopped by itself
        tms::LogInfo("tms serve: %s: finishing the requests in flight (at most %d s)\n",
                     sig == SIGTERM ? "SIGTERM" : "SIGINT", a.grace_s);
        http->Shutdown(std::chrono::seconds(a.grace_s));
    });
    http->Run(a.io_threads);
    opener.join();
    api->Stop();
    const unsigned char done = 0;
    if (write(g_signal_pipe[1], &done, 1) != 1) waiter.detach();
    if (waiter.joinable()) waiter.join();
    if (open_failed) return 1;
    tms::LogInfo("tms serve: stopped\n");
    return 0;
}

}  // namespace

Command AddServe(CLI::App& app) {
    auto s = std::make_shared<ServeArgs>();
    auto* c = app.add_subcommand("serve", "Serve an index over HTTP (search, add, delete; /openapi.json)");
    c->add_option("--index", s->index, "Index directory")->required();
    c->add_option("--host", s->host, "Address to listen on (beyond loopback only with --api-keys)")
        ->capture_default_str();
    c->add_option("--port", s->port, "Port (0: any free port, printed at start)")
        ->capture_default_str()
        ->check(CLI::Range(0, 65535));
    c->add_option("--api-keys", s->api_keys,
                  "JSON file of API keys: {\"keys\": [{\"name\", \"key\", \"scopes\": [read, write, admin], "
                  "\"filter\"}]}, read again when it changes; a key's filter limits its searches and writes");
    c->add_flag("--insecure", s->insecure, "Allow a non-loopback --host without API keys");
    c->add_option("--device", s->device, "Where scoring runs: auto, cpu or gpu")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "cpu", "gpu"}));
    c->add_option("--devices", s->devices, "GPUs that hold shards: all, or CUDA ordinals \"0,1\"");
    c->add_option("--vectors", s->vectors, "Where the stored vectors live: auto, gpu, host, disk, none")
        ->capture_default_str();
    c->add_option("--workers", s->api.workers,
                  "Threads that run searches; concurrent searches are gathered into one batch")
        ->capture_default_str()
        ->check(CLI::Range(1, 4096));
    c->add_option("--queue", s->api.queue, "Searches that may wait for a worker; more get 503 with Retry-After")
        ->capture_default_str()
        ->check(CLI::Range(0, 1000000));
    c->add_option("--batch-wait-us", s->gather_us,
                  "A gathered batch waits up to this many microseconds for more searches before it starts "
                  "(0: a search that finds none running starts at once; those arriving meanwhile go together next)")
        ->capture_default_str()
        ->check(CLI::Range(0, 1000000));
    c->add_option("--max-queries", s->api.max_queries, "Queries one request may hold")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 20));
    c->add_option("--max-k", s->api.max_k, "Largest k a request may ask for")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 20));
    c->add_option("--max-body-mib", s->max_body_mib, "Largest request body, MiB (413 beyond)")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 16));
    c->add_option("--queue-timeout-ms", s->queue_timeout_ms, "A request that waited this long for a worker: 503")
        ->capture_default_str()
        ->check(CLI::Range(1, 3600000));
    c->add_option("--request-timeout-ms", s->request_timeout_ms,
                  "A search or rerank not answered this long after it arrived gets 504 (writes have no timeout: "
                  "their answer is their outcome; 0: none)")
        ->capture_default_str()
        ->check(CLI::Range(int64_t(0), int64_t(3600000)));
    c->add_option("--read-timeout-s", s->read_timeout_s,
                  "A request must arrive whole within this time, and an idle connection closes after it")
        ->capture_default_str()
        ->check(CLI::Range(1, 3600));
    c->add_option("--io-threads", s->io_threads, "Threads serving connections (idle ones hold none)")
        ->capture_default_str()
        ->check(CLI::Range(1, 256));
    c->add_option("--grace-s", s->grace_s, "At SIGTERM, seconds to finish the requests in flight")
        ->capture_default_str()
        ->check(CLI::Range(0, 3600));
    c->add_option("--compact-deleted", s->compact_deleted,
                  "Compact the index (between two writes; searches go on) once this share of its documents, "
                  "and at least 1,000, are deleted (0: only on POST /v1/compact)")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    c->add_option("--record-queries", s->record_queries,
                  "Keep a uniform sample of this many of the queries served, on which the recall estimate is "
                  "measured again (0: none)")
        ->capture_default_str()
        ->check(CLI::Range(0, 1000000));
    c->add_option("--recalibrate-after", s->api.recalibrate_after,
                  "Measure the recall estimate again on the sample once this many more queries were served, so that "
                  "the default search (--target-recall) plans from the queries the index really gets (0: never)")
        ->capture_default_str()
        ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
    c->add_option("--recalibrate-idle-ms", s->recalibrate_idle_ms,
                  "A measurement due (--recalibrate-after) waits until no search has run for this long")
        ->capture_default_str()
        ->check(CLI::Range(int64_t(1), int64_t(3600000)));
    c->add_flag("--log-json", s->log_json, "One JSON object per request on stderr (else one text line)");
    return {c, [s] { return RunServe(*s); }};
}

}  // namespace tms::cli

// Copyright TileMaxSim authors. `tms bench serve`: the server's queries/s and latency against the
// engine's own, in one process.
#include "tools/bench/bench_serve.h"

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include "index/ingest/npy.h"
#include "kernels/maxsim.h"
#include "nlohmann/json.hpp"
#include "server/api.h"
#include "server/http_server.h"
#include "tilemaxsim/log.h"
#include "tilemaxsim/searcher.h"
#include "tools/bench/latency.h"

namespace tms::bench {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Row {
    int clients = 0;
    double qps = 0, p50_ms = 0, p99_ms = 0;
    int64_t ok = 0;
    std::map<int, int64_t> errors;  // status (0: a connection failure) -> count
};

// One query a call from `clients` threads for `seconds`.
Status InProcess(const Searcher& s, const QueryBatch& q, const SearchOptions& opts, int clients, double seconds,
                 Row* row) {
    std::atomic<int> next{0};
    std::atomic<bool> failed{false};
    std::mutex mu;
    std::vector<double> lat;
    const auto t0 = Clock::now();
    std::vector<std::thread> th;
    for (int c = 0; c < clients; ++c) {
        th.emplace_back([&] {
            std::vector<double> mine;
            while (Seconds(t0) < seconds) {
                const int i = next.fetch_add(1);
                std::vector<std::vector<SearchHit>> one;
                const auto t = Clock::now();
                if (!s.Search(q.Slice(i % q.n_queries, 1), opts, &one).ok()) failed = true;
                mine.push_back(Seconds(t) * 1e3);
            }
            std::lock_guard<std::mutex> lk(mu);
            lat.insert(lat.end(), mine.begin(), mine.end());
        });
    }
    for (auto& t : th) t.join();
    if (failed) return Status::Internal("bench serve: an in-process search failed");
    row->clients = clients;
    row->ok = int64_t(lat.size());
    row->qps = double(lat.size()) / Seconds(t0);
    row->p50_ms = Percentile(lat, 0.5);
    row->p99_ms = Percentile(lat, 0.99);
    return Status::OK();
}

// A keep-alive connection sending one query after another until `stop`.
class LoadConnection : public std::enable_shared_from_this<LoadConnection> {
public:
    LoadConnection(net::io_context& ioc, const tcp::endpoint& ep, const std::vector<std::string>* bodies,
                   std::string target, std::atomic<bool>* stop, int first)
        : stream_(ioc), ep_(ep), bodies_(bodies), target_(std::move(target)), stop_(stop), next_(first) {}

    void Start() {
        stream_.async_connect(ep_, [self = shared_from_this()](beast::error_code ec) {
            if (ec) return self->Fail();
            self->Send();
        });
    }
    std::vector<double> latencies;
    std::map<int, int64_t> errors;

private:
    void Send() {
        if (*stop_) return;
        req_ = {http::verb::post, target_, 11};
        req_.set(http::field::host, "127.0.0.1");
        req_.set(http::field::content_type, "application/x-npy");
        req_.body() = (*bodies_)[size_t(next_++) % bodies_->size()];
        req_.keep_alive(true);
        req_.prepare_payload();
        res_ = {};
        t0_ = Clock::now();
        http::async_write(stream_, req_, [self = shared_from_this()](beast::error_code ec, size_t) {
            if (ec) return self->Fail();
            http::async_read(self->stream_, self->buf_, self->res_, [self](beast::error_code ec2, size_t) {
                if (ec2) return self->Fail();
                if (self->res_.result_int() == 200) {
                    self->latencies.push_back(Seconds(self->t0_) * 1e3);
                } else {
                    ++self->errors[int(self->res_.result_int())];
                }
                self->Send();
            });
        });
    }
    void Fail() {
        if (*stop_) return;
        ++errors[0];
        beast::error_code ignored;
        stream_.socket().close(ignored);
        stream_.async_connect(ep_, [self = shared_from_this()](beast::error_code ec) {
            if (ec) return;
            self->Send();
        });
    }

    beast::tcp_stream stream_;
    tcp::endpoint ep_;
    const std::vector<std::string>* bodies_;
    std::string target_;
    std::atomic<bool>* stop_;
    int next_;
    http::request<http::string_body> req_;
    http::response<http::string_body> res_;
    beast::flat_buffer buf_;
    Clock::time_point t0_;
};

Row Served(int port, const std::vector<std::string>& bodies, int k, int clients, double seconds) {
    net::io_context ioc;
    const tcp::endpoint ep(net::ip::make_address("127.0.0.1"), uint16_t(port));
    std::atomic<bool> stop{false};
    std::vector<std::shared_ptr<LoadConnection>> conns;
    const std::string target = "/v1/search?k=" + std::to_string(k);
    for (int c = 0; c < clients; ++c) {
        conns.push_back(std::make_shared<LoadConnection>(ioc, ep, &bodies, target, &stop, c * 7919));
        conns.back()->Start();
    }
    net::steady_timer timer(ioc, std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
    const auto t0 = Clock::now();
    timer.async_wait([&](beast::error_code) { stop = true; });
    // The load's own threads (two: one connection's wait never holds another's send).
    std::thread extra([&] { ioc.run_for(std::chrono::milliseconds(int64_t((seconds + 30) * 1000))); });
    ioc.run_for(std::chrono::milliseconds(int64_t((seconds + 30) * 1000)));
    extra.join();
    const double elapsed = Seconds(t0);
    Row row;
    row.clients = clients;
    std::vector<double> lat;
    for (const auto& c : conns) {
        lat.insert(lat.end(), c->latencies.begin(), c->latencies.end());
        for (const auto& [st, n] : c->errors) row.errors[st] += n;
    }
    row.ok = int64_t(lat.size());
    row.qps = double(lat.size()) / std::max(elapsed, seconds);
    row.p50_ms = Percentile(lat, 0.5);
    row.p99_ms = Percentile(lat, 0.99);
    return row;
}

// POSTs `body` to `target` on a connection of its own; the status (0: no answer), and in *answer
// (when given) the answer's body or why there was none.
int PostOnce(int port, const std::string& target, const std::string& body, std::string* answer = nullptr) {
    try {
        net::io_context ioc;
        beast::tcp_stream s(ioc);
        s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), uint16_t(port)));
        http::request<http::string_body> req{http::verb::post, target, 11};
        req.set(http::field::host, "127.0.0.1");
        req.set(http::field::content_type, "application/json");
        req.body() = body;
        req.prepare_payload();
        http::write(s, req);
        beast::flat_buffer buf;
        http::response<http::string_body> res;
        http::read(s, buf, res);
        beast::error_code ec;
        s.socket().shutdown(tcp::socket::shutdown_both, ec);
        if (answer) *answer = res.body();
        return int(res.result_int());
    } catch (const std::exception& e) {
        if (answer) *answer = e.what();
        return 0;
    }
}

std::string RowJson(const char* kind, const Row& r, double writer_rate) {
    nlohmann::json j = {{"kind", kind},
                        {"clients", r.clients},
                        {"writer_docs_per_s", writer_rate},
                        {"qps", r.qps},
                        {"p50_ms", r.p50_ms},
                        {"p99_ms", r.p99_ms},
                        {"answered", r.ok},
                        {"errors", nlohmann::json::object()}};
    for (const auto& [st, n] : r.errors) j["errors"][st ? std::to_string(st) : "connection"] = n;
    return j.dump();
}

}  // namespace

Status RunServeBench(const ServeBenchOptions& o, std::string* json) {
    HostArray arr;
    TMS_RETURN_IF_ERROR(LoadNpy(o.queries, &arr));
    EmbeddingView view;
    TMS_RETURN_IF_ERROR(EmbeddingsFromArray(arr, 3, o.queries, &view));
    QueryBatch q{view.data, view.dtype, int(arr.shape[0]), int(arr.shape[1]), view.dim, nullptr};
    // One .npy body per query: [1, tokens, dim] of the file's dtype.
    std::vector<std::string> bodies;
    const size_t per = size_t(q.q_tokens) * size_t(q.dim) * size_t(DTypeSize(q.dtype));
    for (int i = 0; i < q.n_queries; ++i) {
        std::string b = NpyHeader(arr.descr, {1, q.q_tokens, q.dim});
        b.append(reinterpret_cast<const char*>(arr.bytes.data()) + size_t(i) * per, per);
        bodies.push_back(std::move(b));
    }
    SearcherOptions so = o.searcher;
    so.gather = true;
    so.progress = false;
    SearchOptions opts;
    opts.k = o.k;
    std::vector<Row> inproc;
    {
        std::unique_ptr<Searcher> s;
        TMS_RETURN_IF_ERROR(Searcher::Open(so, o.index, &s));
        for (int c : o.clients) {
            Row r;
            TMS_RETURN_IF_ERROR(InProcess(*s, q, opts, c, o.seconds, &r));
            inproc.push_back(r);
        }
    }
    // The server, as tms serve runs it (no keys, loopback, a sample of the queries kept).
    SearcherOptions served = so;
    served.record_into = std::make_shared<QuerySample>(1000);
    std::unique_ptr<server::IndexService> index;
    TMS_RETURN_IF_ERROR(server::IndexService::Open(o.index, served, &index));
    server::ApiOptions ao;
    ao.workers = o.workers > 0 ? o.workers : std::max(64, *std::max_element(o.clients.begin(), o.clients.end()));
    ao.queue = 4 * ao.workers;
    ao.recalibrate_after = 0;  // (tms serve measures only when idle: never during a row)
    auto api = std::make_shared<server::Api>(ao, nullptr);
    api->SetIndex(std::move(index));
    std::string error;
    auto httpd = server::ListenApi(api, "127.0.0.1", 0, server::HttpLimits{}, &error);
    if (!httpd) return Status::IOError("bench serve: " + error);
    const int port = httpd->port();
    std::thread serving([&] { httpd->Run(2); });
    const LogLevel level = GetLogLevel();
    SetLogLevel(LogLevel::kWarning);  // no line per request

    std::fprintf(stderr, "%8s %6s %12s %9s %9s %14s %9s %7s\n", "clients", "writer", "served q/s", "p50 ms", "p99 ms",
                 "in-process q/s", "ratio", "errors");
    std::string rows;
    const std::vector<double> rates =
        o.writer_rate > 0 ? std::vector<double>{0, o.writer_rate} : std::vector<double>{0};
    std::atomic<int64_t> written{0};
    std::map<int, int64_t> write_errors;        // status (0: no answer) -> count, under acked_mu
    std::map<int, std::string> write_messages;  // status -> the first such answer, under acked_mu
    int64_t next_write = 0;
    std::mutex acked_mu;
    std::vector<std::string> acked;  // ids of the documents the writer added
    for (double rate : rates) {
        std::atomic<bool> stop_writer{false};
        std::thread writer;
        if (rate > 0) {
            // Each document its own request on its own connection, sent on schedule whatever the
            // earlier ones wait for (a write is answered once its group's searcher is in place).
            writer = std::thread([&, rate] {
                std::vector<std::thread> sends;
                const auto t0 = Clock::now();
                for (int64_t n = 0; !stop_writer; ++n) {
                    const double due = double(n) / rate;
                    while (!stop_writer && Seconds(t0) < due) std::this_thread::sleep_for(std::chrono::milliseconds(1));
                    if (stop_writer) break;
                    const int qi = int(n % q.n_queries);
                    nlohmann::json doc = nlohmann::json::array();  // a query's tokens, as floats
                    for (int t = 0; t < q.q_tokens; ++t) {
                        nlohmann::json row = nlohmann::json::array();
                        for (int d = 0; d < q.dim; ++d) {
                            row.push_back(
                                kernels::load_as_float(q.data, q.dtype, (int64_t(qi) * q.q_tokens + t) * q.dim + d));
                        }
                        doc.push_back(std::move(row));
                    }
                    const std::string id = "bench-write-" + std::to_string(next_write++);
                    const std::string body = nlohmann::json{{"documents", {doc}}, {"ids", {id}}}.dump();
                    sends.emplace_back([&, body, id] {
                        std::string answer;
                        const int status = PostOnce(port, "/v1/documents", body, &answer);
                        std::lock_guard<std::mutex> lk(acked_mu);
                        if (status == 200) {
                            ++written;
                            acked.push_back(id);
                        } else {
                            ++write_errors[status];
                            write_messages.emplace(status, answer.substr(0, 500));
                        }
                    });
                }
                for (auto& t : sends) t.join();
            });
        }
        for (size_t i = 0; i < o.clients.size(); ++i) {
            const Row r = Served(port, bodies, o.k, o.clients[i], o.seconds);
            int64_t errs = 0;
            for (const auto& [st, n] : r.errors) errs += n;
            std::fprintf(stderr, "%8d %6.0f %12.1f %9.3f %9.3f %14.1f %9.3f %7lld\n", r.clients, rate, r.qps, r.p50_ms,
                         r.p99_ms, inproc[i].qps, inproc[i].qps > 0 ? r.qps / inproc[i].qps : 0, (long long)errs);
            rows += (rows.empty() ? "" : ",\n  ") + RowJson("served", r, rate);
            if (rate == 0) rows += ",\n  " + RowJson("in_process", inproc[i], 0);
        }
        stop_writer = true;
        if (writer.joinable()) writer.join();
    }
    // What the writer added goes again.
    if (!acked.empty()) PostOnce(port, "/v1/documents/delete", nlohmann::json{{"ids", acked}}.dump());
    SetLogLevel(level);
    httpd->Shutdown(std::chrono::seconds(5));
    serving.join();
    api->Stop();
    nlohmann::json head = {{"command", o.command},
                           {"index", o.index},
                           {"seconds", o.seconds},
                           {"k", o.k},
                           {"device", DeviceName(so.device)},
                           {"writes_acknowledged", written.load()},
                           {"write_errors", nlohmann::json::object()},
                           {"write_error_answers", nlohmann::json::object()}};
    for (const auto& [st, n] : write_errors) {
        const std::string key = st ? std::to_string(st) : "connection";
        head["write_errors"][key] = n;
        head["write_error_answers"][key] = write_messages[st];
        std::fprintf(stderr, "bench serve: %lld writes answered %s, the first: %s\n", (long long)n, key.c_str(),
                     write_messages[st].c_str());
    }
    std::string h = head.dump();
    h.pop_back();
    *json = h + ", \"rows\": [\n  " + rows + "\n]}\n";
    return Status::OK();
}

}  // namespace tms::bench

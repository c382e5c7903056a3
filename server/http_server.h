// Copyright TileMaxSim authors. HTTP/1.1 transport of `tms serve` (Boost.Beast over Asio).
//
// Connections are served asynchronously by a few I/O threads: an idle or slow client holds a
// socket and a timer, never a thread. A request must arrive whole within read_timeout (a
// slow-loris client is cut off), its header within max_header bytes and its body within
// max_body (413, then the connection closes). One request at a time per connection, keep-alive
// between them; the handler answers on any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tms::server {

struct HttpRequest {
    std::string method;                                      ///< "GET", "POST", ...
    std::string path;                                        ///< the target before '?', percent-decoded
    std::vector<std::pair<std::string, std::string>> query;  ///< decoded parameters, in order
    std::vector<std::pair<std::string, std::string>> headers;
    std::string body;
    std::string remote;  ///< client address

    /// The first header named `name` (case-insensitive); empty when none.
    std::string Header(const std::string& name) const;
};

struct HttpResponse {
    int status = 200;
    std::string content_type = "application/json";
    std::string body;
    std::vector<std::pair<std::string, std::string>> headers;  ///< extra headers (Retry-After)
};

/// Answers a request by calling `reply` exactly once, on any thread.
using HttpReply = std::function<void(HttpResponse)>;
using HttpHandler = std::function<void(HttpRequest&&, HttpReply)>;

struct HttpLimits {
    int64_t max_body = int64_t(64) << 20;
    int64_t max_header = 64 << 10;
    std::chrono::milliseconds read_timeout{30000};  ///< a whole request, or an idle keep-alive
    std::chrono::milliseconds write_timeout{30000};
    int max_connections = 10000;  ///< more are accepted and closed at once
};

/// The transport's counters (for /metrics).
struct HttpCounters {
    int64_t connections_open = 0, connections_total = 0, connections_refused = 0, timeouts = 0;
};

class HttpServer {
public:
    /// Listens on host:port (port 0: any free port; see port()). Throws nothing: errors in *error.
    static std::unique_ptr<HttpServer> Listen(const std::string& host, int port, const HttpLimits& limits,
                                              HttpHandler handler, std::string* error);
    /// After Run has returned, and after whatever answers requests (the handler's threads) has
    /// stopped.
    ~HttpServer();
    int port() const;
    /// Serves on `io_threads` threads until Shutdown; returns when every connection is closed.
    void Run(int io_threads);
    /// Stops accepting; each connection closes after its request in flight (if any) is answered;
    /// those still open after `grace` are closed. Thread- and signal-handler-safe to call once.
    void Shutdown(std::chrono::milliseconds grace);
    HttpCounters counters() const;

    struct Impl;

private:
    explicit HttpServer(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

/// Percent-decoding of a URL component ('+' is a space in a query); false on a bad escape.
bool UrlDecode(const std::string& in, bool query, std::string* out);

}  // namespace tms::server

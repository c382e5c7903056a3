// Copyright TileMaxSim authors.
#include "server/http_server.h"

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <mutex>
#include <optional>
#include <strings.h>
#include <thread>

#include "nlohmann/json.hpp"

namespace tms::server {
namespace {
namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

int HexDigit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

std::string ErrorBody(const std::string& message) { return nlohmann::json{{"error", message}}.dump(); }

}  // namespace

bool UrlDecode(const std::string& in, bool query, std::string* out) {
    out->clear();
    out->reserve(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
        const char c = in[i];
        if (c == '%') {
            if (i + 2 >= in.size()) return false;
            const int hi = HexDigit(in[i + 1]), lo = HexDigit(in[i + 2]);
            if (hi < 0 || lo < 0) return false;
            out->push_back(char(hi * 16 + lo));
            i += 2;
        } else {
            out->push_back(query && c == '+' ? ' ' : c);
        }
    }
    return true;
}

std::string HttpRequest::Header(const std::string& name) const {
    for (const auto& [k, v] : headers) {
        if (strcasecmp(k.c_str(), name.c_str()) == 0) return v;
    }
    return {};
}

class Session;

struct HttpServer::Impl {
    net::io_context ioc;
    tcp::acceptor acceptor{ioc};
    HttpLimits limits;
    HttpHandler handler;
    std::atomic<bool> stopping{false};
    std::atomic<int64_t> open{0}, total{0}, refused{0}, timeouts{0};
    // False once the server is being destroyed: the sessions the context still holds (in
    // handlers that never ran) go without touching it.
    std::shared_ptr<std::atomic<bool>> alive = std::make_shared<std::atomic<bool>>(true);
    std::mutex mu;  // sessions
    std::vector<std::weak_ptr<Session>> sessions;
    std::optional<net::steady_timer> grace;

    void Accept();
    void Closed();  // a session ended
};

class Session : public std::enable_shared_from_this<Session> {
public:
    Session(tcp::socket&& socket, HttpServer::Impl* srv) : stream_(std::move(socket)), srv_(srv), alive_(srv->alive) {
        beast::error_code ec;
        auto ep = stream_.socket().remote_endpoint(ec);
        if (!ec) remote_ = ep.address().to_string();
    }
    ~Session() {
        if (*alive_) srv_->Closed();
    }

    void Start() {
        net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->Read(); });
    }
    /// At shutdown: close now when waiting for a request; after the answer when one is in flight.
    void Drain() {
        net::post(stream_.get_executor(), [self = shared_from_this()] {
            if (!self->busy_) self->Close();
        });
    }
    void ForceClose() {
        net::post(stream_.get_executor(), [self = shared_from_this()] { self->Close(); });
    }

private:
    void Read() {
        if (srv_->stopping || closed_) return Close();
        parser_.emplace();
        parser_->body_limit(uint64_t(srv_->limits.max_body));
        parser_->header_limit(uint32_t(srv_->limits.max_header));
        stream_.expires_after(srv_->limits.read_timeout);
        http::async_read(stream_, buffer_, *parser_,
                         [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
    }

    void OnRead(beast::error_code ec) {
        if (ec == beast::error::timeout) {
            ++srv_->timeouts;
            return Close();
        }
        if (ec == http::error::body_limit) {
            return Fail(413, "the request body is larger than the limit of " + std::to_string(srv_->limits.max_body) +
                                 " bytes (tms serve --max-body-mib)");
        }
        if (ec == http::error::header_limit) {
            return Fail(431, "the request header is larger than the limit of " +
                                 std::to_string(srv_->limits.max_header) + " bytes");
        }
        if (ec) {
            // The client closed, or sent something that is not HTTP: answer only the latter, and
            // only when it sent anything.
            const bool garbage = ec.category() == http::make_error_code(http::error::bad_target).category() &&
                                 ec != http::error::end_of_stream && ec != http::error::partial_message;
            if (garbage && !srv_->stopping) return Fail(400, "bad HTTP request: " + ec.message());
            return Close();
        }
        auto req = parser_->release();
        keep_alive_ = req.keep_alive();
        HttpRequest r;
        r.method = std::string(req.method_string());
        r.remote = remote_;
        const std::string target(req.target());
        const size_t q = target.find('?');
        if (!UrlDecode(target.substr(0, q), false, &r.path)) return Fail(400, "bad percent-escape in the path");
        if (q != std::string::npos) {
            const std::string qs = target.substr(q + 1);
            size_t pos = 0;
            while (pos <= qs.size()) {
                size_t amp = qs.find('&', pos);
                if (amp == std::string::npos) amp = qs.size();
                const std::string part = qs.substr(pos, amp - pos);
                if (!part.empty()) {
                    const size_t eq = part.find('=');
                    std::string k, v;
                    if (!UrlDecode(part.substr(0, eq), true, &k) ||
                        (eq != std::string::npos && !UrlDecode(part.substr(eq + 1), true, &v))) {
                        return Fail(400, "bad percent-escape in the query string");
                    }
                    r.query.emplace_back(std::move(k), std::move(v));
                }
                pos = amp + 1;
            }
        }
        for (const auto& f : req) r.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
        r.body = std::move(req.body());
        busy_ = true;
        stream_.expires_never();  // the handler has its own time limits
        auto self = shared_from_this();
        srv_->handler(std::move(r), [self](HttpResponse resp) {
            net::post(self->stream_.get_executor(),
                      [self, resp = std::move(resp)]() mutable { self->Write(std::move(resp)); });
        });
    }

    void Fail(int status, const std::string& message) {
        keep_alive_ = false;
        busy_ = true;
        HttpResponse resp;
        resp.status = status;
        resp.body = ErrorBody(message);
        Write(std::move(resp));
    }

    void Write(HttpResponse resp) {
        if (closed_) return;
        auto res = std::make_shared<http::response<http::string_body>>(http::int_to_status(unsigned(resp.status)), 11);
        if (res->result() == http::status::unknown) res->result(unsigned(resp.status));
        res->set(http::field::server, "tilemaxsim");
        res->set(http::field::content_type, resp.content_type);
        for (const auto& [k, v] : resp.headers) res->set(k, v);
        res->body() = std::move(resp.body);
        const bool again = keep_alive_ && !srv_->stopping;
        res->keep_alive(again);
        res->prepare_payload();
        stream_.expires_after(srv_->limits.write_timeout);
        http::async_write(stream_, *res, [self = shared_from_this(), res, again](beast::error_code ec, size_t) {
            self->busy_ = false;
            if (ec || !again) return self->Close();
            self->Read();
        });
    }

    void Close() {
        if (closed_) return;
        closed_ = true;
        beast::error_code ec;
        stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
        stream_.close();
    }

    beast::tcp_stream stream_;
    beast::flat_buffer buffer_;
    std::optional<http::request_parser<http::string_body>> parser_;
    HttpServer::Impl* srv_;
    std::shared_ptr<std::atomic<bool>> alive_;
    std::string remote_;
    bool keep_alive_ = false, busy_ = false, closed_ = false;
};

void HttpServer::Impl::Accept() {
    acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
        if (ec) {
            if (stopping || !acceptor.is_open()) return;
            // EMFILE and the like: wait a moment rather than spin.
            auto t = std::make_shared<net::steady_timer>(ioc, std::chrono::milliseconds(50));
            t->async_wait([this, t](beast::error_code) { Accept(); });
            return;
        }
        if (stopping) return;
        if (open.load() >= limits.max_connections) {
            ++refused;
            beast::error_code ignored;
            socket.close(ignored);
        } else {
            ++open;
            ++total;
            auto s = std::make_shared<Session>(std::move(socket), this);
            {
                std::lock_guard<std::mutex> lk(mu);
                if (sessions.size() > 64 && sessions.size() > size_t(2 * open.load())) {
                    std::erase_if(sessions, [](const std::weak_ptr<Session>& w) { return w.expired(); });
                }
                sessions.push_back(s);
            }
            s->Start();
        }
        Accept();
    });
}

void HttpServer::Impl::Closed() {
    if (--open == 0 && stopping) {
        net::post(ioc, [this] {
            if (grace) grace->cancel();
        });
    }
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() {
    if (impl_) *impl_->alive = false;
}

std::unique_ptr<HttpServer> HttpServer::Listen(const std::string& host, int port, const HttpLimits& limits,
                                               HttpHandler handler, std::string* error) {
    auto impl = std::make_unique<Impl>();
    impl->limits = limits;
    impl->handler = std::move(handler);
    beast::error_code ec;
    const auto addr = net::ip::make_address(host, ec);
    if (ec) {
        *error = "--host " + host + ": not an IP address (" + ec.message() + ")";
        return nullptr;
    }
    const tcp::endpoint ep(addr, uint16_t(port));
    impl->acceptor.open(ep.protocol(), ec);
    if (!ec) impl->acceptor.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) impl->acceptor.bind(ep, ec);
    if (!ec) impl->acceptor.listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
        *error = "cannot listen on " + host + ":" + std::to_string(port) + ": " + ec.message();
        return nullptr;
    }
    return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

int HttpServer::port() const {
    beast::error_code ec;
    return int(impl_->acceptor.local_endpoint(ec).port());
}

void HttpServer::Run(int io_threads) {
    auto work = net::make_work_guard(impl_->ioc);
    impl_->Accept();
    std::vector<std::thread> extra;
    for (int i = 1; i < io_threads; ++i) extra.emplace_back([this] { impl_->ioc.run(); });
    // The work guard keeps run() going while no connection is open; Shutdown releases it by
    // stopping the context once the last connection has closed (or the grace period ends).
    impl_->ioc.run();
    for (auto& t : extra) t.join();
    (void)work;
}

void HttpServer::Shutdown(std::chrono::milliseconds grace) {
    net::post(impl_->ioc, [this, grace] {
        Impl& s = *impl_;
        if (s.stopping.exchange(true)) return;
        beast::error_code ec;
        s.acceptor.close(ec);
        std::vector<std::shared_ptr<Session>> live;
        {
            std::lock_guard<std::mutex> lk(s.mu);
            for (auto& w : s.sessions) {
                if (auto p = w.lock()) live.push_back(std::move(p));
            }
            s.sessions.clear();
        }
        for (auto& p : live) p->Drain();
        s.grace.emplace(s.ioc, grace);
        s.grace->async_wait(
            [this, live = std::vector<std::weak_ptr<Session>>(live.begin(), live.end())](beast::error_code) {
                for (auto& w : live) {
                    if (auto p = w.lock()) p->ForceClose();
                }
                // Every connection is closed (or being closed): let run() return.
                net::post(impl_->ioc, [this] { impl_->ioc.stop(); });
            });
        if (s.open.load() == 0) s.grace->cancel();
    });
}

HttpCounters HttpServer::counters() const {
    HttpCounters c;
    c.connections_open = impl_->open.load();
    c.connections_total = impl_->total.load();
    c.connections_refused = impl_->refused.load();
    c.timeouts = impl_->timeouts.load();
    return c;
}

}  // namespace tms::server

#include "fanout/serve/http_server.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <mutex>
#include <sstream>
#include <thread>

#include "fanout/core/error.h"

namespace fanout::serve {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

std::string_view sv(beast::string_view s) { return {s.data(), s.size()}; }

std::string lower(std::string_view s) {
    std::string out(s);
    std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
    return out;
}

// The host part of a Host header value: "name[:port]" or "[v6]:port"; "" when malformed.
std::string host_name(std::string_view h) {
    if (!h.empty() && h.front() == '[') {
        const size_t close = h.find(']');
        if (close == std::string_view::npos) return "";
        const std::string_view rest = h.substr(close + 1);
        if (!rest.empty() && rest.front() != ':') return "";
        return lower(h.substr(1, close - 1));
    }
    const size_t colon = h.find(':');
    if (colon != std::string_view::npos) h = h.substr(0, colon);
    std::string name = lower(h);
    if (!name.empty() && name.back() == '.') name.pop_back();  // "localhost." is localhost
    return name;
}

bool is_ip_literal(const std::string& h) {
    boost::system::error_code ec;
    asio::ip::make_address(h, ec);
    return !ec;
}

// The media type of a Content-Type value, lower-case, without parameters.
std::string media_type(std::string_view ct) {
    ct = ct.substr(0, ct.find(';'));
    while (!ct.empty() && (ct.back() == ' ' || ct.back() == '\t')) ct.remove_suffix(1);
    while (!ct.empty() && (ct.front() == ' ' || ct.front() == '\t')) ct.remove_prefix(1);
    return lower(ct);
}

using Parser = http::request_parser<http::string_body>;

void configure(Parser& p, const HttpLimits& limits) {
    p.header_limit(static_cast<std::uint32_t>(std::min<size_t>(limits.max_header_bytes, UINT32_MAX)));
    p.body_limit(limits.max_body_bytes);
}

// What a complete head can still get wrong: a Transfer-Encoding that does not end in chunked
// leaves the body's length unknown (RFC 9112 6.3: 400, and close — reading on would let the body
// pass for the next request). 0 when the head is fine.
int head_error(const Parser& p, std::string* message) {
    const auto& m = p.get();
    if (m.find(http::field::transfer_encoding) != m.end() && !p.chunked()) {
        *message = "malformed HTTP request: a Transfer-Encoding must end in chunked";
        return 400;
    }
    return 0;
}

HttpRequest to_request(http::request<http::string_body>&& m) {
    HttpRequest r;
    r.method = std::string(sv(m.method_string()));
    r.target = std::string(sv(m.target()));
    r.path = r.target.substr(0, r.target.find('?'));
    for (const auto& f : m) r.headers.emplace_back(lower(sv(f.name_string())), std::string(sv(f.value())));
    r.body = std::move(m.body());
    r.version = m.version() == 10 ? 10 : 11;
    return r;
}

// The status and message for a request the parser refused (never for a timeout or a hang-up).
std::pair<int, std::string> parse_error(const beast::error_code& ec, const HttpLimits& limits) {
    if (ec == http::error::body_limit)
        return {413, fmt::format("the request body is larger than the limit of {} bytes", limits.max_body_bytes)};
    if (ec == http::error::header_limit)
        return {431, fmt::format("the request head is larger than the limit of {} bytes", limits.max_header_bytes)};
    if (ec == http::error::bad_content_length) return {400, "malformed HTTP request: bad Content-Length"};
    return {400, fmt::format("malformed HTTP request: {}", ec.message())};
}

// The bytes of a whole response (HEAD: the head alone, with the body's length).
std::string serialize(const HttpResponse& r, bool head_only, bool keep_alive, int version) {
    http::response<http::string_body> m{static_cast<http::status>(r.status), version == 10 ? 10u : 11u};
    m.set(http::field::server, "fanout");
    m.set(http::field::content_type, r.content_type);
    for (const auto& [k, v] : r.headers) m.set(k, v);
    m.keep_alive(keep_alive);
    std::ostringstream os;
    if (head_only) {
        m.content_length(r.body.size());
        os << m.base();
    } else {
        m.body() = r.body;
        m.prepare_payload();
        os << m;
    }
    return os.str();
}

}  // namespace

std::string HttpRequest::header(std::string_view name) const {
    for (const auto& [k, v] : headers)
        if (k == name) return v;
    return "";
}

bool HostPolicy::accepts(std::string_view host_header) const {
    for (const auto& a : allowed)
        if (a == "*") return true;
    const std::string name = host_name(host_header);
    if (name.empty()) return false;
    if (name == "localhost" || is_ip_literal(name) || name == host_name(listen_host)) return true;
    for (const auto& a : allowed)
        if (host_name(a) == name) return true;
    return false;
}

HttpRouter::HttpRouter(HostPolicy hosts, ErrorFormatter error) : hosts_(std::move(hosts)), error_(std::move(error)) {}

void HttpRouter::add(std::string method, std::string path, Handler handler, RouteOptions options) {
    routes_.push_back({std::move(method), std::move(path), std::move(handler), options});
}

const HttpRouter::Route* HttpRouter::find(const HttpRequest& req, std::string* allow) const {
    const std::string& m = req.method == "HEAD" ? std::string("GET") : req.method;
    for (const auto& r : routes_)
        if (r.path == req.path && r.method == m) return &r;
    for (const auto& r : routes_) {
        if (r.path != req.path) continue;
        if (!allow->empty()) *allow += ", ";
        *allow += r.method == "GET" ? "GET, HEAD" : r.method;
    }
    return nullptr;
}

bool HttpRouter::runs_inline(const HttpRequest& req) const {
    std::string allow;
    const Route* r = find(req, &allow);
    return !r || r->options.runs_inline;
}

HttpResponse HttpRouter::dispatch(const HttpRequest& req) const {
    size_t hosts = 0;
    for (const auto& [k, v] : req.headers) hosts += k == "host";
    if (hosts > 1) return error_(400, "more than one Host header");
    if (req.version >= 11 || hosts == 1) {
        const std::string host = req.header("host");
        if (!hosts_.accepts(host))
            return error_(400, fmt::format("the Host header '{}' does not name this server; start it with "
                                           "--allowed-hosts {} (or '*') to accept that name",
                                           host.substr(0, 200), host_name(host).substr(0, 200)));
    }
    std::string allow;
    const Route* r = find(req, &allow);
    if (!r) {
        if (allow.empty()) return error_(404, fmt::format("no route {} {}", req.method, req.path.substr(0, 200)));
        HttpResponse res =
            error_(405, fmt::format("method {} is not allowed on {}; allowed: {}", req.method, req.path, allow));
        res.headers.emplace_back("Allow", allow);
        return res;
    }
    if (r->options.json_body) {
        const std::string ct = req.header("content-type");
        if (media_type(ct) != "application/json")
            return error_(415, fmt::format("Content-Type must be application/json, got '{}'",
                                           ct.empty() ? "(none)" : ct.substr(0, 200)));
    }
    try {
        return r->handler(req);
    } catch (const std::exception& e) {
        return error_(500, fmt::format("internal error: {}", e.what()));
    }
}

ParsedHttp parse_http_request(std::string_view bytes, const HttpLimits& limits) {
    ParsedHttp out;
    Parser p;
    configure(p, limits);
    beast::error_code ec;
    size_t used = 0;
    bool head_checked = false;
    while (!p.is_done() && used < bytes.size()) {
        const size_t n = p.put(asio::buffer(bytes.data() + used, bytes.size() - used), ec);
        if (ec == http::error::need_more) {
            ec = {};
            if (n == 0) break;
        }
        if (ec) break;
        used += n;
        if (p.is_header_done() && !head_checked) {
            head_checked = true;
            if ((out.error_status = head_error(p, &out.error_message))) return out;
        }
    }
    if (ec) {
        std::tie(out.error_status, out.error_message) = parse_error(ec, limits);
        return out;
    }
    if (!p.is_done()) {
        out.incomplete = true;
        return out;
    }
    out.request = to_request(p.release());
    return out;
}

std::string serialize_http_response(const HttpResponse& res, const HttpRequest& req) {
    HttpResponse whole = res;
    if (res.source) {
        whole.source = nullptr;
        while (!res.source->pull(whole.body)) {
        }
        if (!res.streamed) whole.status = res.source->status();
    }
    return serialize(whole, req.method == "HEAD", false, req.version);
}

// ---------------------------------------------------------------------------------------------

namespace {

// What every connection shares: the routes, the limits, the I/O context and the worker pool.
struct ServerState {
    HttpRouter router;
    HttpLimits limits;
    int io_threads;
    std::atomic<int> connections{0}, queued_work{0};
    std::atomic<int> responding{0};  // requests read in full whose response is not yet all written
    std::mutex stop_mutex;
    std::atomic<bool> stopping{false};
    asio::io_context ioc;
    tcp::acceptor acceptor{ioc};
    asio::steady_timer accept_retry{ioc};
    asio::thread_pool workers;

    ServerState(HttpRouter r, HttpLimits l, int io, int work)
        : router(std::move(r)),
          limits(l),
          io_threads(std::max(1, io)),
          workers(static_cast<size_t>(std::max(1, work))) {}

    void accept();
    void refuse(tcp::socket& socket);
};

class Connection : public std::enable_shared_from_this<Connection> {
  public:
    Connection(ServerState& server, tcp::socket socket)
        : srv_(server), stream_(std::move(socket)), write_timer_(stream_.get_executor()) {
        ++srv_.connections;
    }
    ~Connection() {
        if (source_) source_->cancel();
        set_responding(false);
        --srv_.connections;
    }

    void start() {
        beast::error_code ec;
        stream_.socket().set_option(tcp::no_delay(true), ec);
        read_head();
    }

  private:
    using Self = std::shared_ptr<Connection>;

    void read_head() {
        parser_.emplace();
        configure(*parser_, srv_.limits);
        stream_.expires_after(srv_.limits.header_timeout);
        http::async_read_header(stream_, buffer_, *parser_,
                                [self = shared_from_this()](beast::error_code ec, size_t) { self->on_head(ec); });
    }

    void on_head(beast::error_code ec) {
        if (ec) return on_read_error(ec);
        std::string message;
        if (const int status = head_error(*parser_, &message))
            return send_and_close(srv_.router.error(status, message));
        if (lower(sv(parser_->get()[http::field::expect])) == "100-continue") {
            auto msg = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
            return write(msg, [this](Self) { read_body(); });
        }
        read_body();
    }

    void read_body() {
        stream_.expires_after(srv_.limits.body_timeout);
        http::async_read(stream_, buffer_, *parser_,
                         [self = shared_from_this()](beast::error_code ec, size_t) { self->on_body(ec); });
    }

    void on_body(beast::error_code ec) {
        if (ec) return on_read_error(ec);
        stream_.expires_never();
        keep_alive_ = parser_->get().keep_alive();
        auto req = std::make_shared<HttpRequest>(to_request(parser_->release()));
        parser_.reset();
        head_only_ = req->method == "HEAD";
        version_ = req->version;
        set_responding(true);
        if (srv_.stopping) {  // draining: the responses under way finish, new ones are refused
            keep_alive_ = false;
            return respond(srv_.router.error(503, "the server is shutting down; retry on another"));
        }
        if (srv_.router.runs_inline(*req)) return respond(srv_.router.dispatch(*req));
        if (srv_.queued_work.load() >= srv_.limits.max_queued_work)
            return respond(srv_.router.error(503, "the server is busy; retry later"));
        ++srv_.queued_work;
        asio::post(srv_.workers, [self = shared_from_this(), req] {
            --self->srv_.queued_work;
            auto res = std::make_shared<HttpResponse>(self->srv_.router.dispatch(*req));
            asio::post(self->stream_.get_executor(), [self, res] { self->respond(std::move(*res)); });
        });
    }

    void on_read_error(beast::error_code ec) {
        // The client went away (also halfway through a head or body): nobody to answer.
        if (ec == http::error::end_of_stream || ec == http::error::partial_message || ec == asio::error::eof ||
            ec == asio::error::connection_reset || ec == asio::error::operation_aborted)
            return close();
        // A head or body that did not arrive in time: the stream has closed the socket already.
        if (ec == beast::error::timeout) return close();
        const auto [status, message] = parse_error(ec, srv_.limits);
        send_and_close(srv_.router.error(status, message));
    }

    void respond(HttpResponse res) {
        if (closed_) {
            if (res.source) res.source->cancel();
            return;
        }
        if (srv_.stopping) keep_alive_ = false;  // draining: the response says the connection closes
        if (!res.source) {
            auto bytes = std::make_shared<std::string>(serialize(res, head_only_, keep_alive_, version_));
            return write(bytes, [](Self self) { self->next_request(); });
        }
        source_ = res.source;
        streamed_ = res.streamed;
        response_ = std::move(res);
        response_.source = nullptr;
        source_done_ = false;
        source_->on_ready([w = weak_from_this()] {
            if (auto self = w.lock()) self->wake();
        });
        if (streamed_) {
            if (version_ == 10) keep_alive_ = false;  // no chunked encoding: the body ends with the connection
            http::response<http::empty_body> m{static_cast<http::status>(response_.status), version_ == 10 ? 10u : 11u};
            m.set(http::field::server, "fanout");
            m.set(http::field::content_type, response_.content_type);
            for (const auto& [k, v] : response_.headers) m.set(k, v);
            m.keep_alive(keep_alive_);
            if (version_ != 10) m.chunked(true);
            std::ostringstream os;
            os << m.base();
            write(std::make_shared<std::string>(os.str()), [](Self self) { self->pump(); });
        }
        watch();
        pump();
    }

    void wake() {
        if (wake_posted_.exchange(true)) return;
        asio::post(stream_.get_executor(), [self = shared_from_this()] {
            self->wake_posted_ = false;
            self->pump();
        });
    }

    // Moves what the source has into the socket; ends the response when it is complete.
    void pump() {
        if (!source_ || closed_) return;
        if (!source_done_) source_done_ = source_->pull(pending_);
        // A streamed response's chunks wait here for a slow reader, up to the limit. A whole body is
        // produced at once when the source is done and never waits on the reader while it grows.
        if (streamed_ && pending_.size() > srv_.limits.max_pending_output) return close();  // the client is not reading
        if (writing_) return;  // the write in flight calls pump() again when it completes
        if (!streamed_) {
            if (!source_done_) return;
            response_.status = source_->status();
            response_.body = std::move(pending_);
            pending_.clear();
            finish_source();
            auto bytes = std::make_shared<std::string>(serialize(response_, head_only_, keep_alive_, version_));
            return write(bytes, [](Self self) { self->next_request(); });
        }
        if (!pending_.empty()) {
            auto data = std::make_shared<std::string>(std::move(pending_));
            pending_.clear();
            if (head_only_) return pump();
            if (version_ == 10) return write(data, [](Self self) { self->pump(); });
            std::ostringstream os;
            os << std::hex << data->size() << "\r\n";
            auto framed = std::make_shared<std::string>(os.str() + *data + "\r\n");
            return write(framed, [](Self self) { self->pump(); });
        }
        if (source_done_) {
            finish_source();
            if (version_ == 10 || head_only_) return next_request();
            return write(std::make_shared<std::string>("0\r\n\r\n"), [](Self self) { self->next_request(); });
        }
    }

    void finish_source() {
        source_->on_ready(nullptr);
        source_.reset();
    }

    // While a source runs, a read notices the client hanging up (and keeps pipelined bytes).
    void watch() {
        if (watching_ || closed_ || buffer_.size() > (64u << 10)) return;
        watching_ = true;
        stream_.socket().async_read_some(buffer_.prepare(4096),
                                         [self = shared_from_this()](beast::error_code ec, size_t n) {
                                             self->watching_ = false;
                                             if (!ec) {
                                                 self->buffer_.commit(n);
                                                 if (self->source_) return self->watch();
                                                 if (self->resume_after_watch_)
                                                     self->resume_after_watch_ = false, self->read_head();
                                                 return;
                                             }
                                             if (ec == asio::error::operation_aborted) {
                                                 if (self->resume_after_watch_ && !self->closed_)
                                                     self->resume_after_watch_ = false, self->read_head();
                                                 return;
                                             }
                                             self->close();  // the client hung up: close() cancels the source
                                         });
    }

    void next_request() {
        set_responding(false);
        if (closed_) return;
        if (!keep_alive_ || srv_.stopping) return close();
        if (watching_) {  // the watch read must end before the next head is read
            resume_after_watch_ = true;
            beast::error_code ec;
            stream_.socket().cancel(ec);
            return;
        }
        read_head();
    }

    template <class Done>
    void write(std::shared_ptr<std::string> bytes, Done done) {
        writing_ = true;
        write_timer_.expires_after(srv_.limits.write_timeout);
        write_timer_.async_wait([w = weak_from_this()](beast::error_code ec) {
            if (ec) return;
            if (auto self = w.lock()) self->close();  // the client stopped reading
        });
        asio::async_write(stream_.socket(), asio::buffer(*bytes),
                          [self = shared_from_this(), bytes, done](beast::error_code ec, size_t) {
                              self->writing_ = false;
                              self->write_timer_.cancel();
                              if (ec) return self->close();
                              done(self);
                          });
    }

    // An error before the request was read in full: answer, then close gently — stop sending and
    // drain what the client is still sending, for a bounded time, so its kernel does not reset the
    // connection and lose the answer before the client reads it (RFC 9112 9.6; nginx's
    // lingering close). A client that writes its whole body before reading gets its 413.
    void send_and_close(HttpResponse res) {
        keep_alive_ = false;
        auto bytes = std::make_shared<std::string>(serialize(res, false, false, 11));
        write(bytes, [](Self self) { self->linger(); });
    }

    void linger() {
        if (closed_) return;
        beast::error_code ec;
        stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
        write_timer_.expires_after(kLingerTime);
        write_timer_.async_wait([w = weak_from_this()](beast::error_code ec) {
            if (ec) return;
            if (auto self = w.lock()) self->close();
        });
        drain();
    }

    void drain() {
        stream_.socket().async_read_some(asio::buffer(discard_),
                                         [self = shared_from_this()](beast::error_code ec, size_t) {
                                             if (ec) return self->close();
                                             self->drain();
                                         });
    }

    // Counts this connection among those with a response under way (HttpServer::stop's grace).
    void set_responding(bool on) {
        if (on == responding_) return;
        responding_ = on;
        on ? ++srv_.responding : --srv_.responding;
    }

    void close() {
        set_responding(false);
        if (closed_) return;
        closed_ = true;
        if (source_) {
            source_->cancel();
            source_->on_ready(nullptr);
            source_.reset();
        }
        beast::error_code ec;
        stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
        stream_.close();
        write_timer_.cancel();
    }

    static constexpr std::chrono::seconds kLingerTime{5};
    std::array<char, 16384> discard_{};
    ServerState& srv_;
    beast::tcp_stream stream_;
    asio::steady_timer write_timer_;
    beast::flat_buffer buffer_;
    std::optional<Parser> parser_;
    HttpResponse response_;
    std::shared_ptr<ResponseSource> source_;
    std::string pending_;
    std::atomic<bool> wake_posted_{false};
    bool responding_ = false;
    bool streamed_ = false, source_done_ = false, head_only_ = false, keep_alive_ = true;
    bool writing_ = false, watching_ = false, resume_after_watch_ = false, closed_ = false;
    int version_ = 11;
};

void ServerState::accept() {
    acceptor.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
        if (stopping) return;
        if (ec == asio::error::operation_aborted) return;
        if (ec) {
            // Out of descriptors or memory: wait a little instead of spinning on accept.
            accept_retry.expires_after(std::chrono::milliseconds(50));
            accept_retry.async_wait([this](beast::error_code) {
                if (!stopping) accept();
            });
            return;
        }
        if (connections.load() >= limits.max_connections)
            refuse(socket);
        else
            std::make_shared<Connection>(*this, std::move(socket))->start();
        accept();
    });
}

// Past max_connections: a short 503 without waiting on the client, then close.
void ServerState::refuse(tcp::socket& socket) {
    HttpResponse r = router.error(503, "too many open connections; retry later");
    const std::string bytes = serialize(r, false, false, 11);
    beast::error_code ec;
    socket.non_blocking(true, ec);
    socket.write_some(asio::buffer(bytes), ec);
    socket.shutdown(tcp::socket::shutdown_both, ec);
    socket.close(ec);
}

}  // namespace

struct HttpServer::Impl : ServerState {
    using ServerState::ServerState;
};

HttpServer::HttpServer(HttpRouter router, HttpLimits limits, int io_threads, int worker_threads)
    : impl_(std::make_unique<Impl>(std::move(router), limits, io_threads, worker_threads)) {}

HttpServer::~HttpServer() {
    stop();
    impl_->workers.join();
}

int HttpServer::bind(const std::string& host, int port) {
    // Every connection is a descriptor: take what the hard limit allows, and keep max_connections below it.
    rlimit rl{};
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        const rlim_t want = std::min<rlim_t>(rl.rlim_max, 65536);
        if (rl.rlim_cur < want) {
            rl.rlim_cur = want;
            setrlimit(RLIMIT_NOFILE, &rl);
        }
        getrlimit(RLIMIT_NOFILE, &rl);
        if (rl.rlim_cur != RLIM_INFINITY)
            impl_->limits.max_connections =
                std::min<int>(impl_->limits.max_connections, std::max<int>(16, static_cast<int>(rl.rlim_cur) - 128));
    }
    beast::error_code ec;
    tcp::resolver resolver(impl_->ioc);
    const auto results = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
    FANOUT_CHECK(!ec && !results.empty(), "cannot listen on {}:{}: cannot resolve '{}' ({})", host, port, host,
                 ec.message());
    const tcp::endpoint ep = results.begin()->endpoint();
    auto& a = impl_->acceptor;
    a.open(ep.protocol(), ec);
    if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) a.bind(ep, ec);
    if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
    FANOUT_CHECK(!ec, "cannot listen on {}:{} ({}: in use, or not an address of this machine)", host, port,
                 ec.message());
    return a.local_endpoint().port();
}

void HttpServer::serve() {
    impl_->accept();
    std::vector<std::thread> extra;
    for (int i = 1; i < impl_->io_threads; ++i) extra.emplace_back([this] { impl_->ioc.run(); });
    impl_->ioc.run();
    for (auto& t : extra) t.join();
}

void HttpServer::stop(std::chrono::milliseconds grace) {
    std::lock_guard lock(impl_->stop_mutex);  // a second caller returns once the first is done
    if (impl_->stopping.exchange(true)) return;
    asio::post(impl_->ioc, [this] {
        beast::error_code ec;
        impl_->acceptor.close(ec);
        impl_->accept_retry.cancel();
    });
    const auto deadline = std::chrono::steady_clock::now() + grace;
    while (impl_->responding.load() > 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    impl_->ioc.stop();
}

int HttpServer::open_connections() const { return impl_->connections.load(); }

}  // namespace fanout::serve

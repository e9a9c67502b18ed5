// HttpServer: the HTTP/1.1 transport under fanout's public APIs (Boost.Beast over Asio).
//
// Connections are not threads. A few I/O threads run every socket asynchronously; handlers that
// may take time (parsing, tokenizing, submitting) run on a separate worker pool, and cheap routes
// (/health, /metrics) answer on the I/O thread. So a thousand clients that trickle header bytes
// cost a thousand sockets and buffers, never the workers, and /health keeps answering.
//
// What every request goes through, in order, before a handler sees it:
//   * the head must arrive within `header_timeout` of the connection (or of the previous
//     response), at most `max_header_bytes` (431); the body within `body_timeout` (a deadline
//     closes the connection), at most `max_body_bytes` whatever its framing (Content-Length or
//     chunked; 413, checked as bytes arrive);
//   * a malformed head (bad Content-Length, bad chunk sizes, a Transfer-Encoding not ending in
//     chunked, ...) is 400 and the connection closes — after the answer the server stops sending
//     and drains the client's bytes for up to 5 s, so a client still sending its body reads it;
//   * Host must name this server (HostPolicy: against DNS rebinding): 400;
//   * the route must exist (404) and accept the method (405 with Allow; HEAD is served wherever
//     GET is, without a body);
//   * a route that takes JSON needs `Content-Type: application/json` (415), so a web page cannot
//     post to a local server with a "simple" cross-site request.
// Range headers are ignored (every response is whole). Errors are rendered by the owner's
// ErrorFormatter (the OpenAI error shape for the API).
//
// A response is a complete body, or a ResponseSource the server pulls from when woken: `streamed`
// sources (server-sent events) go out chunked as they produce; others are sent whole, with the
// status they end with. While a source runs the connection watches the socket, so a client that
// hangs up cancels its source at once; a client that stops reading for `write_timeout` is cut off.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fanout::serve {

struct HttpLimits {
    size_t max_header_bytes = 16u << 10;
    size_t max_body_bytes = 8u << 20;  // one limit, whatever the framing
    std::chrono::milliseconds header_timeout{10'000};
    std::chrono::milliseconds body_timeout{30'000};
    std::chrono::milliseconds write_timeout{30'000};  // a client that reads nothing for this long is dropped
    size_t max_pending_output = 4u << 20;             // bytes produced but not yet taken by a slow reader
    int max_connections = 8192;                       // past it a connection gets 503 and is closed
    int max_queued_work = 4096;                       // handler calls waiting for a worker; past it 503
};

using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
    std::string method;  // as sent: "GET", "POST", ...
    std::string target;  // as sent, query included
    std::string path;    // target up to '?'
    Headers headers;     // names lower-case, in arrival order
    std::string body;
    int version = 11;  // 10 or 11
    // The first header of that (lower-case) name, or "" when absent.
    std::string header(std::string_view name) const;
};

// A response body produced over time. The server calls on_ready once (the callback may be called
// from any thread, any number of times), then pull() on its own thread after each wake-up.
class ResponseSource {
  public:
    virtual ~ResponseSource() = default;
    virtual void on_ready(std::function<void()> wake) = 0;
    // Appends what is ready to `out`; true once the body is complete (nothing more will come).
    virtual bool pull(std::string& out) = 0;
    // The client went away (or was cut off) before the end: stop producing. May be called at any time.
    virtual void cancel() = 0;
    // For a source that is not streamed: the status to send with its complete body.
    virtual int status() const { return 200; }
};

struct HttpResponse {
    int status = 200;
    std::string content_type = "application/json";
    std::string body;
    Headers headers;
    std::shared_ptr<ResponseSource> source;  // when set, the body comes from it
    bool streamed = false;                   // with a source: send chunks as they come
};

// Which Host header values a request may carry. By default: IP literals, `localhost`, and the
// address the server was asked to listen on; `allowed` adds names ("*" allows every host).
struct HostPolicy {
    std::string listen_host;
    std::vector<std::string> allowed;
    bool accepts(std::string_view host_header) const;
};

// Renders an error response (status, message) in the owner's shape.
using ErrorFormatter = std::function<HttpResponse(int status, const std::string& message)>;

struct RouteOptions {
    bool runs_inline = false;  // cheap: answer on the I/O thread (health, metrics)
    bool json_body = false;    // needs Content-Type: application/json
};

// The route table and every check that does not need a socket; the fuzzer drives it directly.
class HttpRouter {
  public:
    using Handler = std::function<HttpResponse(const HttpRequest&)>;
    HttpRouter(HostPolicy hosts, ErrorFormatter error);
    void add(std::string method, std::string path, Handler handler, RouteOptions options = {});
    // The checks above, then the handler; an exception in the handler becomes a 500.
    HttpResponse dispatch(const HttpRequest& req) const;
    // Whether the request would run inline (after the checks pass).
    bool runs_inline(const HttpRequest& req) const;
    HttpResponse error(int status, const std::string& message) const { return error_(status, message); }

  private:
    struct Route {
        std::string method, path;
        Handler handler;
        RouteOptions options;
    };
    const Route* find(const HttpRequest& req, std::string* allow) const;
    HostPolicy hosts_;
    ErrorFormatter error_;
    std::vector<Route> routes_;
};

// Parses one request from raw bytes with the server's own parser settings and limits: the request,
// or the error response the server would send (with the status the server would use). Used by
// the fuzzer and tests; the server parses incrementally with the same configuration.
struct ParsedHttp {
    std::optional<HttpRequest> request;
    int error_status = 0;  // 400, 413, 431, or 0 when a request was parsed
    std::string error_message;
    bool incomplete = false;  // the bytes end before the request does
};
ParsedHttp parse_http_request(std::string_view bytes, const HttpLimits& limits);

// Serializes a response as the server writes it (a whole body; sources are drained first). For tests.
std::string serialize_http_response(const HttpResponse& res, const HttpRequest& req);

class HttpServer {
  public:
    HttpServer(HttpRouter router, HttpLimits limits, int io_threads, int worker_threads);
    ~HttpServer();
    // Binds and listens; returns the port (the chosen one when port is 0). Error when it cannot.
    int bind(const std::string& host, int port);
    // Serves until stop(); call after bind().
    void serve();
    // Stops accepting, closes every connection, returns once serve() can return (a second caller,
    // once the first has). With `grace` > 0 the responses under way (streams included) first get
    // up to `grace` to finish, each then closing its connection, and a request arriving meanwhile
    // on an open connection gets 503 — so a draining process does not cut a slow reader's stream
    // short. Not from an I/O thread with a grace, and from a handler it waits the whole grace
    // (its own response is under way).
    void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(0));
    int open_connections() const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace fanout::serve

// HttpServer over real loopback sockets: the limits and deadlines hold whatever the framing, slow
// clients cost no worker (health keeps answering), hosts / methods / media types are checked,
// sources stream and are cancelled when the client hangs up. And the socket-free pieces: the
// parser with the server's limits, the router.
#include "fanout/serve/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

namespace fanout::serve {
namespace {

using namespace std::chrono_literals;

HttpResponse plain_error(int status, const std::string& message) {
    HttpResponse r;
    r.status = status;
    r.body = "{\"error\":{\"message\":\"" + message.substr(0, 40) + "\"}}";
    return r;
}

// A raw client: connect, send bytes, read until the server closes or `timeout` passes.
class RawClient {
  public:
    explicit RawClient(int port) {
        fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(static_cast<uint16_t>(port));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    }
    ~RawClient() { close(); }
    bool connected() const { return connected_; }
    bool send(const std::string& bytes) {
        return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
    }
    // Reads until the peer closes (true) or the timeout passes (false); the bytes go to `out`.
    bool read_until_closed(std::string* out, std::chrono::milliseconds timeout) {
        const auto end = std::chrono::steady_clock::now() + timeout;
        char buf[4096];
        while (std::chrono::steady_clock::now() < end) {
            pollfd p{fd_, POLLIN, 0};
            const int left = static_cast<int>(
                std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now()).count());
            if (::poll(&p, 1, std::max(1, left)) <= 0) continue;
            const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
            if (n <= 0) return true;
            out->append(buf, static_cast<size_t>(n));
        }
        return false;
    }
    // Reads until `needle` appears in the output.
    bool read_until(const std::string& needle, std::string* out, std::chrono::milliseconds timeout) {
        const auto end = std::chrono::steady_clock::now() + timeout;
        char buf[4096];
        while (out->find(needle) == std::string::npos && std::chrono::steady_clock::now() < end) {
            pollfd p{fd_, POLLIN, 0};
            if (::poll(&p, 1, 20) <= 0) continue;
            const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
            if (n <= 0) return false;
            out->append(buf, static_cast<size_t>(n));
        }
        return out->find(needle) != std::string::npos;
    }
    void close() {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }

  private:
    int fd_ = -1;
    bool connected_ = false;
};

int status_of(const std::string& response) {
    if (response.rfind("HTTP/1.", 0) != 0 || response.size() < 12) return 0;
    return std::stoi(response.substr(9, 3));
}

// A source that sends `total` pieces, one each time the test calls push(), and records cancellation.
class TestSource : public ResponseSource {
  public:
    void on_ready(std::function<void()> wake) override {
        std::lock_guard<std::mutex> lock(mutex_);
        wake_ = std::move(wake);
    }
    bool pull(std::string& out) override {
        std::lock_guard<std::mutex> lock(mutex_);
        out += ready_;
        ready_.clear();
        return finished_;
    }
    void cancel() override { cancelled = true; }
    void push(const std::string& piece, bool last) {
        std::function<void()> w;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            ready_ += piece;
            finished_ = last;
            w = wake_;
        }
        if (w) w();
    }
    std::atomic<bool> cancelled{false};

  private:
    std::mutex mutex_;
    std::function<void()> wake_;
    std::string ready_;
    bool finished_ = false;
};

class HttpServerTest : public ::testing::Test {
  protected:
    void start(HttpLimits limits = {}) {
        HttpRouter router(HostPolicy{"127.0.0.1", {"api.example"}}, plain_error);
        router.add("GET", "/health",
                   [](const HttpRequest&) {
                       return HttpResponse{200, "application/json", "{}"};
                   },
                   {.runs_inline = true});
        router.add("POST", "/echo",
                   [](const HttpRequest& r) {
                       HttpResponse res;
                       res.body = r.body;
                       return res;
                   },
                   {.json_body = true});
        router.add("POST", "/stream", [this](const HttpRequest&) {
            HttpResponse res;
            res.content_type = "text/event-stream";
            res.source = source;
            res.streamed = true;
            return res;
        });
        router.add("POST", "/whole", [this](const HttpRequest&) {
            HttpResponse res;
            res.source = source;
            return res;
        });
        server = std::make_unique<HttpServer>(std::move(router), limits, 2, 2);
        port = server->bind("127.0.0.1", 0);
        thread = std::thread([this] { server->serve(); });
    }
    void TearDown() override {
        if (server) server->stop();
        if (thread.joinable()) thread.join();
    }
    std::string roundtrip(const std::string& bytes, std::chrono::milliseconds timeout = 5s) {
        RawClient c(port);
        EXPECT_TRUE(c.connected());
        c.send(bytes);
        std::string out;
        c.read_until_closed(&out, timeout);
        return out;
    }
    // GET /health answers within `within`.
    bool health_ok(std::chrono::milliseconds within) {
        const auto t0 = std::chrono::steady_clock::now();
        const std::string r = roundtrip("GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", within);
        return status_of(r) == 200 && std::chrono::steady_clock::now() - t0 < within;
    }

    std::shared_ptr<TestSource> source = std::make_shared<TestSource>();
    std::unique_ptr<HttpServer> server;
    std::thread thread;
    int port = 0;
};

TEST_F(HttpServerTest, ServesKeepAliveAndClose) {
    start();
    RawClient c(port);
    std::string out;
    c.send("GET /health HTTP/1.1\r\nHost: localhost:1\r\n\r\n");
    ASSERT_TRUE(c.read_until("{}", &out, 2s));
    EXPECT_EQ(status_of(out), 200);
    out.clear();
    const std::string body = R"({"a":1})";
    c.send(
        "POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json; charset=utf-8\r\n"
        "Content-Length: 7\r\nConnection: close\r\n\r\n" +
        body);
    ASSERT_TRUE(c.read_until_closed(&out, 2s));
    EXPECT_EQ(status_of(out), 200);
    EXPECT_NE(out.find(body), std::string::npos);
}

TEST_F(HttpServerTest, ChunkedBodyHasTheSameLimit) {
    HttpLimits l;
    l.max_body_bytes = 1000;
    start(l);
    std::string req =
        "POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n";
    for (int i = 0; i < 20; ++i) req += "64\r\n" + std::string(100, 'a') + "\r\n";  // 2,000 bytes in 100-byte chunks
    const std::string out = roundtrip(req + "0\r\n\r\n");
    EXPECT_EQ(status_of(out), 413) << out;
    // Under the limit, chunked is fine.
    const std::string ok = roundtrip(
        "POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
        "Connection: close\r\n\r\n3\r\n{}\n\r\n0\r\n\r\n");
    EXPECT_EQ(status_of(ok), 200) << ok;
    // A declared length past the limit is refused before the body is read.
    const std::string big = roundtrip(
        "POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n", 2s);
    EXPECT_EQ(status_of(big), 413) << big;
}

TEST_F(HttpServerTest, MalformedHeadsAreAnsweredAtOnce) {
    start();
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(status_of(roundtrip("POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: -5\r\n\r\n")), 400);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
    EXPECT_EQ(status_of(roundtrip("GARBAGE\r\n\r\n")), 400);
    EXPECT_EQ(
        status_of(roundtrip("GET /health HTTP/1.1\r\nHost: localhost\r\nX: " + std::string(20000, 'x') + "\r\n\r\n")),
        431);
}

TEST_F(HttpServerTest, RoutesMethodsHostsAndMediaTypes) {
    start();
    const auto get = [&](const std::string& head) { return roundtrip(head + "Connection: close\r\n\r\n"); };
    EXPECT_EQ(status_of(get("GET /nope HTTP/1.1\r\nHost: localhost\r\n")), 404);
    const std::string wrong = get("GET /echo HTTP/1.1\r\nHost: localhost\r\n");
    EXPECT_EQ(status_of(wrong), 405);
    EXPECT_NE(wrong.find("Allow: POST"), std::string::npos) << wrong;
    EXPECT_EQ(status_of(get("GET /health HTTP/1.1\r\nHost: evil.example\r\n")), 400);
    EXPECT_EQ(status_of(get("GET /health HTTP/1.1\r\nHost: api.example:80\r\n")), 200);
    EXPECT_EQ(status_of(get("GET /health HTTP/1.1\r\nHost: [::1]:8000\r\n")), 200);
    EXPECT_EQ(status_of(get("GET /health HTTP/1.1\r\n")), 400);  // HTTP/1.1 requires Host
    EXPECT_EQ(status_of(get("GET /health HTTP/1.0\r\n")), 200);
    EXPECT_EQ(status_of(get("GET /health HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n")), 400);
    const std::string text =
        get("POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\n{}");
    EXPECT_EQ(status_of(text), 415) << text;
    // HEAD: the head of GET, with its length, and no body.
    const std::string head = get("HEAD /health HTTP/1.1\r\nHost: localhost\r\n");
    EXPECT_EQ(status_of(head), 200);
    EXPECT_NE(head.find("Content-Length: 2"), std::string::npos) << head;
    EXPECT_EQ(head.substr(head.find("\r\n\r\n") + 4), "");
    // Range is ignored: the whole body.
    const std::string ranged = get("GET /health HTTP/1.1\r\nHost: localhost\r\nRange: bytes=0-0\r\n");
    EXPECT_EQ(status_of(ranged), 200);
    EXPECT_EQ(ranged.substr(ranged.find("\r\n\r\n") + 4), "{}");
}

TEST_F(HttpServerTest, SlowClientsCostNoWorkersAndAreCutOff) {
    HttpLimits l;
    l.header_timeout = 1500ms;
    start(l);
    // 300 connections that send one header byte each and then trickle: far more than the two
    // I/O and two worker threads.
    std::vector<std::unique_ptr<RawClient>> slow;
    for (int i = 0; i < 300; ++i) {
        slow.push_back(std::make_unique<RawClient>(port));
        ASSERT_TRUE(slow.back()->connected());
        slow.back()->send("P");
    }
    for (int i = 0; i < 5; ++i) {
        EXPECT_TRUE(health_ok(500ms)) << "health while 300 clients trickle, round " << i;
        for (auto& c : slow) c->send("O");
    }
    // Past the head deadline every trickler is disconnected, however it keeps sending.
    std::this_thread::sleep_for(1s);
    int closed = 0;
    for (auto& c : slow) {
        std::string out;
        closed += c->read_until_closed(&out, 1s);
    }
    EXPECT_EQ(closed, 300);
    EXPECT_TRUE(health_ok(500ms));
}

TEST_F(HttpServerTest, SlowBodyIsCutOff) {
    HttpLimits l;
    l.body_timeout = 800ms;
    start(l);
    RawClient c(port);
    c.send("POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{");
    std::string out;
    EXPECT_TRUE(c.read_until_closed(&out, 3s));
}

TEST_F(HttpServerTest, TooManyConnectionsGet503) {
    HttpLimits l;
    l.max_connections = 20;
    start(l);
    std::vector<std::unique_ptr<RawClient>> open;
    for (int i = 0; i < 20; ++i) open.push_back(std::make_unique<RawClient>(port));
    std::this_thread::sleep_for(200ms);
    EXPECT_EQ(status_of(roundtrip("GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n", 2s)), 503);
    open.clear();
    std::this_thread::sleep_for(200ms);
    EXPECT_TRUE(health_ok(1s));
}

TEST_F(HttpServerTest, StreamsChunksAsTheyCome) {
    start();
    RawClient c(port);
    c.send("POST /stream HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n");
    std::string out;
    ASSERT_TRUE(c.read_until("\r\n\r\n", &out, 2s));
    EXPECT_EQ(status_of(out), 200);
    EXPECT_NE(out.find("chunked"), std::string::npos);
    source->push("data: one\n\n", false);
    ASSERT_TRUE(c.read_until("data: one", &out, 2s));
    source->push("data: two\n\n", true);
    ASSERT_TRUE(c.read_until("0\r\n\r\n", &out, 2s));
    EXPECT_FALSE(source->cancelled);
    // The connection stays open for the next request.
    out.clear();
    c.send("GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n");
    ASSERT_TRUE(c.read_until("{}", &out, 2s));
}

TEST_F(HttpServerTest, HangUpCancelsTheSourceAtOnce) {
    start();
    {
        RawClient c(port);
        c.send("POST /whole HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n");
        std::this_thread::sleep_for(200ms);
    }  // the client closes while the source has produced nothing
    for (int i = 0; i < 100 && !source->cancelled; ++i) std::this_thread::sleep_for(10ms);
    EXPECT_TRUE(source->cancelled);
}

TEST_F(HttpServerTest, WholeSourceIsSentWithItsLength) {
    start();
    RawClient c(port);
    c.send("POST /whole HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    std::this_thread::sleep_for(100ms);
    source->push("{\"x\":", false);
    source->push("1}", true);
    std::string out;
    ASSERT_TRUE(c.read_until_closed(&out, 2s));
    EXPECT_EQ(status_of(out), 200);
    EXPECT_NE(out.find("Content-Length: 7"), std::string::npos) << out;
    EXPECT_NE(out.find("{\"x\":1}"), std::string::npos);
}

// A whole (not streamed) body larger than the slow-reader limit on streamed output is still sent
// whole: it is produced at once, when the source is done, not queued for a reader.
TEST_F(HttpServerTest, WholeBodyPastThePendingOutputLimitIsSent) {
    HttpLimits limits;
    limits.max_pending_output = 1u << 20;
    start(limits);
    RawClient c(port);
    c.send("POST /whole HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    std::this_thread::sleep_for(100ms);
    const std::string body(3u << 20, 'x');
    source->push(body, true);
    std::string out;
    ASSERT_TRUE(c.read_until_closed(&out, 5s));
    EXPECT_EQ(status_of(out), 200);
    EXPECT_NE(out.find("Content-Length: " + std::to_string(body.size())), std::string::npos);
    EXPECT_EQ(out.size() - out.find("\r\n\r\n") - 4, body.size());
    EXPECT_FALSE(source->cancelled);
}

// A stop with a grace lets the response under way finish (a stream to its last chunk) and then
// returns; a request arriving meanwhile on an open keep-alive connection gets 503 and the
// connection closes; the listener takes no new connection.
TEST_F(HttpServerTest, StopWithAGraceLetsAStreamFinish) {
    start();
    RawClient kept(port);  // a keep-alive connection with one request answered before the stop
    kept.send("GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n");
    std::string k;
    ASSERT_TRUE(kept.read_until("{}", &k, 2s));
    RawClient c(port);
    c.send("POST /stream HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n");
    std::string out;
    ASSERT_TRUE(c.read_until("\r\n\r\n", &out, 2s));
    source->push("data: one\n\n", false);
    ASSERT_TRUE(c.read_until("data: one", &out, 2s));
    std::atomic<bool> stopped{false};
    std::thread stopper([&] {
        server->stop(5s);
        stopped = true;
    });
    std::this_thread::sleep_for(300ms);
    EXPECT_FALSE(stopped) << "stop waited for the stream";
    k.clear();
    kept.send("GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n");
    kept.read_until_closed(&k, 2s);
    EXPECT_EQ(status_of(k), 503) << k;
    EXPECT_NE(k.find("shutting down"), std::string::npos) << k;
    RawClient late(port);  // the listener is closed: refused, or closed without an answer
    if (late.connected()) {
        late.send("GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n");
        std::string r;
        late.read_until_closed(&r, 1s);
        EXPECT_NE(status_of(r), 200) << r;
    }
    source->push("data: two\n\n", true);
    EXPECT_TRUE(c.read_until("0\r\n\r\n", &out, 2s)) << out;
    EXPECT_NE(out.find("data: two"), std::string::npos);
    stopper.join();  // returns once the stream ended, or after the grace
    EXPECT_TRUE(stopped);
    EXPECT_FALSE(source->cancelled);
}

TEST(HttpParse, UsesTheServerLimits) {
    HttpLimits l;
    l.max_body_bytes = 10;
    const ParsedHttp ok = parse_http_request("POST /a?b=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", l);
    ASSERT_TRUE(ok.request);
    EXPECT_EQ(ok.request->path, "/a");
    EXPECT_EQ(ok.request->header("host"), "x");
    EXPECT_EQ(ok.request->body, "{}");
    EXPECT_EQ(parse_http_request("POST / HTTP/1.1\r\nContent-Length: 11\r\n\r\n", l).error_status, 413);
    EXPECT_EQ(
        parse_http_request("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nb\r\n01234567890\r\n0\r\n\r\n", l)
            .error_status,
        413);
    EXPECT_TRUE(parse_http_request("POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n{}", l).incomplete);
    EXPECT_EQ(parse_http_request("POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n", l).error_status, 400);
}

}  // namespace
}  // namespace fanout::serve

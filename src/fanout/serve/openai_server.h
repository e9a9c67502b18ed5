// OpenAI-compatible HTTP front end for one engine, or the rank 0 of a data-parallel group
// (engine::RequestService).
//
// POST /v1/chat/completions and /v1/completions (streaming as server-sent events ending in
// `data: [DONE]`, or one JSON response), GET /v1/models, /health and /metrics (Prometheus text).
// The transport (serve/http_server.h) bounds every connection — head and body deadlines, one body
// limit whatever the framing, Host and Content-Type checks, connections that are not threads — and
// the protocol (serve/openai_protocol.h) validates each body into engine parameters. Errors use
// OpenAI's shape {"error": {"message", "type", "param", "code"}}: 400 bad requests, 404 unknown
// model or route, 405 wrong method, 408/413/415/431 from the transport, 429 when too many requests
// are in flight. A client that disconnects has its request cancelled at once; nothing one request
// does stops the server serving the others.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fanout/engine/engine.h"
#include "fanout/io/tokenizer.h"
#include "fanout/serve/http_server.h"

namespace fanout::serve {

struct ServerConfig {
    std::string host = "127.0.0.1";
    int port = 8000;  // 0: any free port
    std::string model_name = "tiny";
    int max_in_flight = 1024;                // concurrent completion requests past this get 429
    int64_t default_max_tokens = 4096;       // for requests that name no max_tokens
    std::vector<std::string> allowed_hosts;  // Host names accepted beyond IP literals, localhost and --host
    HttpLimits limits;
    int io_threads = 2;
    int worker_threads = 4;
    std::vector<std::pair<std::string, double>> startup_seconds;  // start-up phases, for /metrics
};

// The name clients must send: refused (Error) when empty, too long or holding control characters.
void validate_model_name(const std::string& name);

class OpenAIServer {
  public:
    OpenAIServer(engine::RequestService& engine, const io::Tokenizer& tokenizer, const ServerConfig& config);
    ~OpenAIServer();
    // Binds the socket; returns the port (the chosen one when config.port is 0).
    int bind();
    // Serves until stop(); call after bind().
    void serve();
    // HttpServer::stop: the responses under way get up to `grace` to finish.
    void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(0));
    // The route table alone (no sockets), for the protocol fuzzer and tests.
    const HttpRouter& router() const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace fanout::serve

// OpenAI-compatible HTTP front end for one engine instance.
//
// POST /v1/chat/completions and /v1/completions (streaming as server-sent events ending in
// `data: [DONE]`, or one JSON response), GET /v1/models, /health and /metrics (Prometheus text).
// Errors use OpenAI's shape {"error": {"message", "type", "param", "code"}} with the right status:
// 400 for bad requests (invalid JSON, unknown or mistyped fields, prompts past the context), 404 for
// an unknown model or route, 413 for oversized bodies, 429 when too many requests are in flight.
// A client that disconnects mid-stream has its request cancelled; nothing one request does stops
// the server serving the others.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "fanout/engine/engine.h"
#include "fanout/io/tokenizer.h"

namespace fanout::serve {

struct ServerConfig {
    std::string host = "127.0.0.1";
    int port = 8000;  // 0: any free port
    std::string model_name = "tiny";
    int max_in_flight = 1024;           // concurrent requests past this get 429
    size_t max_body_bytes = 8u << 20;   // larger bodies get 413
    int http_threads = 64;              // at least max_in_flight + 16 are started: each response holds one
};

class OpenAIServer {
public:
    OpenAIServer(engine::Engine& engine, const io::Tokenizer& tokenizer, const ServerConfig& config);
    ~OpenAIServer();
    // Binds the socket; returns the port (the chosen one when config.port is 0).
    int bind();
    // Serves until stop(); call after bind().
    void serve();
    void stop();

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace fanout::serve

#include "fanout/serve/openai_server.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>

#include "fanout/io/json_util.h"
#include "fanout/serve/metrics.h"
#include "fanout/serve/openai_protocol.h"

namespace fanout::serve {
namespace {

using nlohmann::json;

int64_t unix_now() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

HttpResponse json_response(int status, const json& body) {
    HttpResponse r;
    r.status = status;
    r.body = dump_json(body);
    return r;
}

// Counts a request in flight from acceptance until its response is fully sent.
struct InFlight {
    std::atomic<int64_t>& n;
    explicit InFlight(std::atomic<int64_t>& c) : n(c) { ++n; }
    ~InFlight() { --n; }
};

// One request's output as the HTTP server pulls it: SSE chunks as events arrive, or the whole
// body at the end. The engine wakes the connection through the handle; nothing blocks.
class CompletionSource : public ResponseSource {
  public:
    CompletionSource(std::shared_ptr<engine::RequestHandle> handle, CompletionRenderer renderer, bool streamed,
                     std::shared_ptr<InFlight> slot)
        : handle_(std::move(handle)), renderer_(std::move(renderer)), streamed_(streamed), slot_(std::move(slot)) {}
    ~CompletionSource() override { handle_->on_event(nullptr); }

    void on_ready(std::function<void()> wake) override { handle_->on_event(std::move(wake)); }
    bool pull(std::string& out) override {
        if (streamed_ && !started_) out += renderer_.stream_start();
        started_ = true;
        engine::RequestEvent ev;
        while (handle_->next(&ev, std::chrono::milliseconds(0))) {
            if (streamed_)
                out += renderer_.stream_event(ev);
            else
                renderer_.add(ev);
            if (!ev.finished) continue;
            if (!streamed_) out += renderer_.body();
            return true;
        }
        return false;
    }
    void cancel() override { handle_->cancel(); }
    int status() const override { return renderer_.status(); }

  private:
    std::shared_ptr<engine::RequestHandle> handle_;
    CompletionRenderer renderer_;
    bool streamed_, started_ = false;
    std::shared_ptr<InFlight> slot_;
};

}  // namespace

void validate_model_name(const std::string& name) {
    FANOUT_CHECK(!name.empty(), "the served model name is empty; pass --served-model-name");
    FANOUT_CHECK(name.size() <= 256, "the served model name is {} bytes long; at most 256", name.size());
    for (const unsigned char c : name)
        FANOUT_CHECK(c >= 0x20 && c != 0x7f, "the served model name '{}' contains a control character (byte 0x{:02x})",
                     io::describe_json(name), c);
    FANOUT_CHECK(io::utf8_invalid_offset(name) == std::string::npos, "the served model name is not valid UTF-8");
}

struct OpenAIServer::Impl {
    engine::RequestService& engine;
    ServerConfig config;
    PromptEncoder encoder;
    ApiModel model;
    HttpRouter router;
    std::unique_ptr<HttpServer> http;
    std::atomic<int64_t> in_flight{0}, next_id{1}, http_requests{0}, http_errors{0};

    Impl(engine::RequestService& e, const io::Tokenizer& t, const ServerConfig& c)
        : engine(e),
          config(c),
          router(HostPolicy{c.host, c.allowed_hosts}, [this](int status, const std::string& message) {
              return error(ApiError{status, message, "", "", ""});
          }) {
        validate_model_name(config.model_name);
        encoder.tokenizer = &t;
        try {
            encoder.chat_format = io::detect_chat_format(t.chat_template());
        } catch (const Error& err) {
            encoder.chat_format_error = err.what();  // completions still work; chat requests get a clear error
        }
        model.name = config.model_name;
        model.max_context = engine.max_context();
        model.vocab_size = engine.vocab_size();
        model.default_max_tokens = config.default_max_tokens;
        routes();
    }

    HttpResponse error(ApiError e) {
        if (e.type.empty()) e.type = error_type_for(e.status);
        ++http_errors;
        return json_response(e.status, error_json(e));
    }

    HttpResponse completion(const HttpRequest& req, bool chat) {
        ++http_requests;
        auto slot = std::make_shared<InFlight>(in_flight);
        try {
            if (in_flight > config.max_in_flight)
                throw ApiError{429,
                               fmt::format("too many requests in flight (limit {}); retry later", config.max_in_flight),
                               "rate_limit_error", "", "too_many_requests"};
            // The context as the engine has it now (a router's: its smallest healthy engine's).
            ApiModel limits = model;
            limits.max_context = engine.max_context();
            CompletionRequest r = parse_completion_request(parse_body(req.body), chat, encoder, limits);
            std::shared_ptr<engine::RequestHandle> handle;
            try {
                handle = engine.submit(std::move(r.params));
            } catch (const engine::ServiceUnavailable& e) {
                throw ApiError{e.status(), e.what(), e.status() == 429 ? "rate_limit_error" : "server_error", "",
                               e.status() == 429 ? "too_many_requests" : "service_unavailable"};
            } catch (const Error& e) {
                throw engine_error(e.what());
            }
            HttpResponse res;
            res.streamed = r.stream;
            if (r.stream) {
                res.content_type = "text/event-stream";
                res.headers.emplace_back("Cache-Control", "no-cache");
            }
            CompletionRenderer renderer(fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", next_id++), chat,
                                        r.include_usage, config.model_name, unix_now());
            res.source = std::make_shared<CompletionSource>(std::move(handle), std::move(renderer), r.stream, slot);
            return res;
        } catch (const ApiError& e) {
            return error(e);
        } catch (const nlohmann::json::exception& e) {  // a field of the wrong JSON type somewhere
            return error({400, fmt::format("malformed request: {}", e.what()), "invalid_request_error", "", ""});
        }
    }

    void routes() {
        const RouteOptions api{.runs_inline = false, .json_body = true};
        const RouteOptions cheap{.runs_inline = true, .json_body = false};
        router.add(
            "POST", "/v1/chat/completions", [this](const HttpRequest& r) { return completion(r, true); }, api);
        router.add(
            "POST", "/v1/completions", [this](const HttpRequest& r) { return completion(r, false); }, api);
        router.add(
            "GET", "/v1/models",
            [this](const HttpRequest&) {
                const json m = {{"id", config.model_name},
                                {"object", "model"},
                                {"created", unix_now()},
                                {"owned_by", "fanout"},
                                {"max_model_len", engine.max_context()}};
                return json_response(200, {{"object", "list"}, {"data", json::array({m})}});
            },
            cheap);
        router.add(
            "GET", "/health",
            [](const HttpRequest&) {
                return json_response(200, {{"status", "ok"}});
            },
            cheap);
        router.add(
            "GET", "/metrics",
            [this](const HttpRequest&) {
                HttpStats h{http_requests.load(), http_errors.load(), in_flight.load(),
                            http ? http->open_connections() : 0};
                HttpResponse r;
                r.content_type = "text/plain; version=0.0.4";
                r.body =
                    render_metrics(config.model_name, engine.stats(), h, config.startup_seconds, engine.rank_stats());
                return r;
            },
            cheap);
    }
};

OpenAIServer::OpenAIServer(engine::RequestService& engine, const io::Tokenizer& tokenizer, const ServerConfig& config)
    : impl_(std::make_unique<Impl>(engine, tokenizer, config)) {}

OpenAIServer::~OpenAIServer() { stop(); }

int OpenAIServer::bind() {
    auto& c = impl_->config;
    impl_->http = std::make_unique<HttpServer>(impl_->router, c.limits, c.io_threads, c.worker_threads);
    return impl_->http->bind(c.host, c.port);
}

void OpenAIServer::serve() {
    FANOUT_CHECK(impl_->http != nullptr, "OpenAIServer::serve() before bind()");
    impl_->http->serve();
}

void OpenAIServer::stop(std::chrono::milliseconds grace) {
    if (impl_->http) impl_->http->stop(grace);
}

const HttpRouter& OpenAIServer::router() const { return impl_->router; }

}  // namespace fanout::serve

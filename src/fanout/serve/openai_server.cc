#include "fanout/serve/openai_server.h"

#include <httplib.h>

#include <sys/socket.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "fanout/io/chat_template.h"
#include "fanout/io/json_util.h"

namespace fanout::serve {
namespace {

using nlohmann::json;

// A request the client got wrong: becomes an OpenAI error response.
struct ApiError {
    int status;
    std::string message, type, param, code;
};

// fanout::Error messages end with " (file.cc:NN)"; clients get the message alone.
std::string client_message(std::string m) {
    const size_t open = m.rfind(" (");
    if (open != std::string::npos && m.back() == ')' && m.find(".cc:", open) != std::string::npos) m.resize(open);
    return m;
}

[[noreturn]] void bad_request(std::string message, std::string param = "", std::string code = "") {
    throw ApiError{400, client_message(std::move(message)), "invalid_request_error", std::move(param), std::move(code)};
}

json error_body(const ApiError& e) {
    return {{"error",
             {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

// Response bodies never fail to serialize: invalid UTF-8 (e.g. echoed from a bad request) is replaced.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(dump(error_body(e)), "application/json");
}

int64_t unix_now() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// Fields each endpoint accepts. Known OpenAI fields fanout does not implement are accepted only
// at their neutral values (checked below); anything else is an error naming the field.
const std::set<std::string> kCommonFields = {
    "model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "stream_options", "n",
    "ignore_eos", "presence_penalty", "frequency_penalty", "logprobs", "user", "logit_bias", "skip_special_tokens"};
const std::set<std::string> kChatFields = {"messages", "max_completion_tokens", "top_logprobs", "response_format",
                                           "tools", "tool_choice", "parallel_tool_calls"};
const std::set<std::string> kCompletionFields = {"prompt", "echo", "best_of", "suffix"};

double number_field(const json& b, const char* key, double fallback, double lo, double hi) {
    if (!b.contains(key) || b[key].is_null()) return fallback;
    if (!b[key].is_number()) bad_request(fmt::format("'{}' must be a number, got {}", key, io::describe_json(b[key])), key);
    const double v = b[key].get<double>();
    if (!(v >= lo && v <= hi)) bad_request(fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, v), key);
    return v;
}

int64_t int_field(const json& b, const char* key, int64_t fallback, int64_t lo, int64_t hi) {
    if (!b.contains(key) || b[key].is_null()) return fallback;
    if (!b[key].is_number_integer())
        bad_request(fmt::format("'{}' must be an integer, got {}", key, io::describe_json(b[key])), key);
    if (b[key].is_number_unsigned() && b[key].get<uint64_t>() > static_cast<uint64_t>(hi))
        bad_request(fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, b[key].dump()), key);
    const int64_t v = b[key].get<int64_t>();
    if (v < lo || v > hi) bad_request(fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, v), key);
    return v;
}

bool bool_field(const json& b, const char* key, bool fallback) {
    if (!b.contains(key) || b[key].is_null()) return fallback;
    if (!b[key].is_boolean()) bad_request(fmt::format("'{}' must be true or false, got {}", key, io::describe_json(b[key])), key);
    return b[key].get<bool>();
}

// Debian's prebuilt cpp-httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG is fixed in
// the library), so a burst of connections waits out SYN retries; listening again on the bound
// socket raises it (Linux allows this).
class BacklogServer : public httplib::Server {
public:
    void raise_backlog(int backlog) { FANOUT_CHECK(::listen(svr_sock_, backlog) == 0, "listen(backlog={}) failed", backlog); }
};

struct ParsedRequest {
    engine::RequestParams params;
    bool stream = false, include_usage = false;
};

}  // namespace

struct OpenAIServer::Impl {
    engine::Engine& engine;
    const io::Tokenizer& tokenizer;
    ServerConfig config;
    BacklogServer http;
    std::atomic<int> in_flight{0};
    std::atomic<int64_t> next_id{1};
    std::atomic<int64_t> http_requests{0}, http_errors{0};
    std::optional<io::ChatFormat> chat_format;
    std::string chat_format_error;

    Impl(engine::Engine& e, const io::Tokenizer& t, const ServerConfig& c) : engine(e), tokenizer(t), config(c) {
        try {
            chat_format = io::detect_chat_format(tokenizer.chat_template());
        } catch (const Error& err) {
            chat_format_error = err.what();  // completions still work; chat requests get a clear error
        }
    }

    json parse_body(const httplib::Request& req) const {
        json b;
        try {
            b = json::parse(req.body);
        } catch (const json::exception& e) {
            bad_request(fmt::format("the body is not valid JSON (or not valid UTF-8): {}", e.what()));
        }
        if (!b.is_object()) bad_request(fmt::format("the body must be a JSON object, got {}", io::describe_json(b)));
        return b;
    }

    ParsedRequest parse_common(const json& b, const std::set<std::string>& extra, int64_t prompt_len_hint) {
        for (const auto& [key, value] : b.items())
            if (!kCommonFields.count(key) && !extra.count(key))
                bad_request(fmt::format("unknown field '{}'", key), key);
        if (int_field(b, "n", 1, 1, 1) != 1) bad_request("only n = 1 is supported", "n");
        if (int_field(b, "best_of", 1, 1, 1) != 1) bad_request("only best_of = 1 is supported", "best_of");
        for (const char* k : {"presence_penalty", "frequency_penalty"})
            if (number_field(b, k, 0.0, -2.0, 2.0) != 0.0) bad_request(fmt::format("'{}' is not supported", k), k);
        if (bool_field(b, "logprobs", false) || (b.contains("logprobs") && b["logprobs"].is_number_integer()))
            bad_request("logprobs are not supported yet", "logprobs");
        if (bool_field(b, "echo", false)) bad_request("echo is not supported", "echo");
        if (b.contains("tools") && !b["tools"].is_null() && !(b["tools"].is_array() && b["tools"].empty()))
            bad_request("tool calling is not supported yet", "tools");
        if (b.contains("response_format") && !b["response_format"].is_null() &&
            !(b["response_format"].is_object() && b["response_format"].contains("type") &&
              b["response_format"]["type"] == "text"))
            bad_request("only response_format {\"type\": \"text\"} is supported", "response_format");
        if (b.contains("suffix") && !b["suffix"].is_null()) bad_request("suffix is not supported", "suffix");
        ParsedRequest r;
        auto& p = r.params;
        p.sampling.temperature = static_cast<float>(number_field(b, "temperature", 1.0, 0.0, 100.0));
        p.sampling.top_p = static_cast<float>(number_field(b, "top_p", 1.0, 1e-9, 1.0));
        p.sampling.top_k = static_cast<int>(int_field(b, "top_k", 0, -1, 1 << 30));
        if (p.sampling.top_k < 0) p.sampling.top_k = 0;  // vLLM spells "off" as -1
        p.sampling.seed = b.contains("seed") && !b["seed"].is_null()
                              ? static_cast<uint64_t>(int_field(b, "seed", 0, INT64_MIN, INT64_MAX))
                              : std::random_device{}();
        p.ignore_eos = bool_field(b, "ignore_eos", false);
        p.skip_special_tokens = bool_field(b, "skip_special_tokens", true);
        const int64_t room = engine.max_context() - prompt_len_hint;
        const char* max_key = b.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
        p.max_tokens = int_field(b, max_key, std::max<int64_t>(room, 1), 1, engine.max_context());
        if (b.contains("stop") && !b["stop"].is_null()) {
            const json& s = b["stop"];
            if (s.is_string()) p.stop.push_back(s.get<std::string>());
            else if (s.is_array() && s.size() <= 16) {
                for (const auto& x : s) {
                    if (!x.is_string()) bad_request("'stop' entries must be strings", "stop");
                    p.stop.push_back(x.get<std::string>());
                }
            } else {
                bad_request("'stop' must be a string or an array of at most 16 strings", "stop");
            }
            for (const auto& x : p.stop)
                if (x.empty()) bad_request("'stop' strings must not be empty", "stop");
        }
        r.stream = bool_field(b, "stream", false);
        if (b.contains("stream_options") && !b["stream_options"].is_null()) {
            if (!b["stream_options"].is_object()) bad_request("'stream_options' must be an object", "stream_options");
            r.include_usage = bool_field(b["stream_options"], "include_usage", false);
        }
        return r;
    }

    void check_model(const json& b) const {
        if (!b.contains("model") || !b["model"].is_string()) bad_request("'model' is required (a string)", "model");
        if (b["model"].get<std::string>() != config.model_name)
            throw ApiError{404, fmt::format("model '{}' does not exist; this server serves '{}'",
                                            b["model"].get<std::string>(), config.model_name),
                           "invalid_request_error", "model", "model_not_found"};
    }

    std::vector<int32_t> chat_prompt(const json& b) {
        if (!chat_format) throw ApiError{400, chat_format_error, "invalid_request_error", "messages", ""};
        if (!b.contains("messages")) bad_request("'messages' is required", "messages");
        if (b["messages"].is_array() && b["messages"].empty()) bad_request("'messages' must not be empty", "messages");
        std::vector<io::ChatMessage> messages;
        try {
            messages = io::parse_chat_messages(b["messages"]);
        } catch (const Error& e) {
            bad_request(e.what(), "messages");
        }
        return tokenizer.encode(io::render_chat(*chat_format, messages, true, tokenizer.bos_token()), false);
    }

    std::vector<int32_t> completion_prompt(const json& b) {
        if (!b.contains("prompt")) bad_request("'prompt' is required", "prompt");
        const json& p = b["prompt"];
        if (p.is_string()) return tokenizer.encode(p.get<std::string>(), true);
        if (p.is_array() && p.size() == 1 && p[0].is_string()) return tokenizer.encode(p[0].get<std::string>(), true);
        if (p.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), [](const json& x) { return x.is_number_integer(); })) {
            std::vector<int32_t> ids;
            for (const auto& x : p) {
                const int64_t v = x.get<int64_t>();
                if (v < 0 || v > INT32_MAX) bad_request(fmt::format("token id {} is out of range", v), "prompt");
                ids.push_back(static_cast<int32_t>(v));
            }
            return ids;
        }
        bad_request("'prompt' must be a string, a one-string array, or an array of token ids (batches are not "
                    "supported)", "prompt");
    }

    void handle(const httplib::Request& req, httplib::Response& res, bool chat) {
        ++http_requests;
        // Counts this request until its response is fully sent (streams: until the stream ends).
        struct Slot {
            std::atomic<int>& n;
            explicit Slot(std::atomic<int>& c) : n(c) { ++n; }
            ~Slot() { --n; }
        };
        auto slot = std::make_shared<Slot>(in_flight);
        try {
            if (in_flight > config.max_in_flight)
                throw ApiError{429, fmt::format("too many requests in flight (limit {}); retry later", config.max_in_flight),
                               "rate_limit_error", "", "too_many_requests"};
            const json b = parse_body(req);
            check_model(b);
            std::vector<int32_t> prompt;
            try {
                prompt = chat ? chat_prompt(b) : completion_prompt(b);
            } catch (const Error& e) {  // e.g. text that is not valid UTF-8
                bad_request(e.what(), chat ? "messages" : "prompt");
            }
            ParsedRequest r = parse_common(b, chat ? kChatFields : kCompletionFields, static_cast<int64_t>(prompt.size()));
            r.params.prompt = std::move(prompt);
            std::shared_ptr<engine::RequestHandle> handle;
            try {
                handle = engine.submit(r.params);
            } catch (const Error& e) {
                const std::string msg = e.what();
                bad_request(msg, "", msg.find("exceeds the context") != std::string::npos ? "context_length_exceeded" : "");
            }
            const std::string id = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", next_id++);
            if (r.stream) stream_response(res, handle, id, chat, r.include_usage, slot);
            else full_response(res, handle, id, chat, slot);
        } catch (const ApiError& e) {
            ++http_errors;
            send_error(res, e);
        } catch (const nlohmann::json::exception& e) {  // a field of the wrong JSON type somewhere
            ++http_errors;
            send_error(res, {400, fmt::format("malformed request: {}", e.what()), "invalid_request_error", "", ""});
        }
    }

    json usage_json(const engine::RequestEvent& ev) const {
        return {{"prompt_tokens", ev.prompt_tokens},
                {"completion_tokens", ev.completion_tokens},
                {"total_tokens", ev.prompt_tokens + ev.completion_tokens},
                {"prompt_tokens_details", {{"cached_tokens", ev.cached_tokens}}}};
    }

    // A non-streaming answer is still sent through a content provider, so a client that hangs up
    // while the request runs is noticed (within ~400 ms) and its request cancelled. The status is
    // 200 once generation starts; an engine failure after that becomes an error object body.
    void full_response(httplib::Response& res, std::shared_ptr<engine::RequestHandle> h, const std::string& id,
                       bool chat, std::shared_ptr<void> slot) {
        auto text = std::make_shared<std::string>();
        auto last_write = std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
        res.set_chunked_content_provider(
            "application/json",
            [=, this](size_t, httplib::DataSink& sink) {
                // A socket the peer closed still looks writable until a write fails, so every
                // 200 ms a space goes out (JSON allows leading whitespace): the second write after
                // a hang-up fails and the request is cancelled.
                const auto now = std::chrono::steady_clock::now();
                if (now - *last_write > std::chrono::milliseconds(200)) {
                    *last_write = now;
                    if (!sink.is_writable() || !sink.write(" ", 1)) {
                        h->cancel();  // the client went away
                        return false;
                    }
                }
                engine::RequestEvent ev;
                if (!h->next(&ev, std::chrono::milliseconds(200))) return true;
                *text += ev.text;
                if (!ev.finished) return true;
                json body;
                if (ev.finish_reason == "error" || ev.finish_reason == "abort") {
                    body = error_body({500, "generation failed in the engine; see the server log", "server_error", "", ""});
                } else {
                    json choice = {{"index", 0}, {"finish_reason", ev.finish_reason}};
                    if (chat) choice["message"] = {{"role", "assistant"}, {"content", *text}};
                    else choice["text"] = *text, choice["logprobs"] = nullptr;
                    body = {{"id", id},
                            {"object", chat ? "chat.completion" : "text_completion"},
                            {"created", unix_now()},
                            {"model", config.model_name},
                            {"choices", json::array({choice})},
                            {"usage", usage_json(ev)}};
                }
                const std::string out = dump(body);
                sink.write(out.data(), out.size());
                sink.done();
                return true;
            },
            [h, slot](bool success) {
                if (!success) h->cancel();
            });
    }

    void stream_response(httplib::Response& res, std::shared_ptr<engine::RequestHandle> h, const std::string& id,
                         bool chat, bool include_usage, std::shared_ptr<void> slot) {
        const int64_t created = unix_now();
        const std::string model = config.model_name;
        auto chunk = [=](json delta_or_text, json finish) {
            json choice = {{"index", 0}, {"finish_reason", finish}};
            if (chat) choice["delta"] = std::move(delta_or_text);
            else choice["text"] = std::move(delta_or_text), choice["logprobs"] = nullptr;
            return json{{"id", id},
                        {"object", chat ? "chat.completion.chunk" : "text_completion"},
                        {"created", created},
                        {"model", model},
                        {"choices", json::array({choice})}};
        };
        auto started = std::make_shared<bool>(false);
        auto done = std::make_shared<bool>(false);
        res.set_header("Cache-Control", "no-cache");
        res.set_chunked_content_provider(
            "text/event-stream",
            [=, this](size_t, httplib::DataSink& sink) {
                const auto send = [&](const json& j) {
                    const std::string s = "data: " + dump(j) + "\n\n";
                    return sink.write(s.data(), s.size());
                };
                if (*done) return false;
                if (!*started) {
                    *started = true;
                    if (chat && !send(chunk({{"role", "assistant"}, {"content", ""}}, nullptr))) return h->cancel(), false;
                }
                engine::RequestEvent ev;
                if (!h->next(&ev, std::chrono::milliseconds(200))) {
                    if (!sink.is_writable()) {  // the client went away while we waited
                        h->cancel();
                        return false;
                    }
                    return true;
                }
                if (!ev.text.empty() && !send(chunk(chat ? json{{"content", ev.text}} : json(ev.text), nullptr))) {
                    h->cancel();
                    return false;
                }
                if (ev.finished && (ev.finish_reason == "error" || ev.finish_reason == "abort")) {
                    // An error event, as OpenAI's API sends one mid-stream; the clients raise it.
                    send(error_body({500, "generation failed in the engine; see the server log", "server_error", "", ""}));
                    *done = true;
                    sink.done();
                    return true;
                }
                if (ev.finished) {
                    send(chunk(chat ? json::object() : json(""), ev.finish_reason));
                    if (include_usage) {
                        json u = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"},
                                  {"created", created}, {"model", model}, {"choices", json::array()},
                                  {"usage", usage_json(ev)}};
                        send(u);
                    }
                    const std::string end = "data: [DONE]\n\n";
                    sink.write(end.data(), end.size());
                    *done = true;
                    sink.done();
                }
                return true;
            },
            [h, slot](bool success) {
                if (!success) h->cancel();  // the stream broke off: stop generating for it
            });
    }

    std::string metrics() const {
        const engine::EngineStats s = engine.stats();
        std::string out;
        const std::string label = fmt::format("{{model=\"{}\"}}", config.model_name);
        const auto metric = [&](const char* name, const char* type, const char* help, double v) {
            out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{} {}\n", name, help, name, type, name, label, v);
        };
        metric("fanout_requests_received_total", "counter", "Requests accepted by the engine.", s.requests_received);
        metric("fanout_requests_finished_total", "counter", "Requests finished (any reason).", s.requests_finished);
        metric("fanout_requests_aborted_total", "counter", "Requests cancelled (client gone).", s.requests_aborted);
        metric("fanout_requests_failed_total", "counter", "Requests failed by an engine error.", s.requests_failed);
        metric("fanout_http_requests_total", "counter", "HTTP requests to the API routes.", http_requests.load());
        metric("fanout_http_errors_total", "counter", "API requests answered with an error.", http_errors.load());
        metric("fanout_prompt_tokens_total", "counter", "Prompt tokens received.", s.prompt_tokens);
        metric("fanout_generation_tokens_total", "counter", "Tokens generated.", s.generation_tokens);
        metric("fanout_prefix_cache_hit_tokens_total", "counter", "Prompt tokens served from the prefix cache.",
               s.cached_prompt_tokens);
        metric("fanout_prefix_cache_hit_rate", "gauge", "Cached prompt tokens / prompt tokens, finished requests.",
               s.prompt_tokens ? double(s.cached_prompt_tokens) / s.prompt_tokens : 0.0);
        metric("fanout_queue_depth", "gauge", "Requests waiting to be scheduled.", s.waiting);
        metric("fanout_running_sequences", "gauge", "Sequences in the running batch.", s.running);
        metric("fanout_http_in_flight", "gauge", "HTTP requests being served.", in_flight.load());
        metric("fanout_kv_cache_usage", "gauge", "Fraction of KV blocks in use or cached.",
               s.kv_blocks_total ? double(s.kv_blocks_used) / s.kv_blocks_total : 0.0);
        metric("fanout_kv_cache_cached_blocks", "gauge", "KV blocks held by the prefix cache.", s.kv_blocks_cached);
        metric("fanout_preemptions_total", "counter", "Sequences preempted (recompute).", s.preemptions);
        metric("fanout_engine_steps_total", "counter", "Engine steps run.", s.steps);
        const auto histogram = [&](const char* name, const char* help, const engine::EngineStats::Histogram& h) {
            out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
            int64_t cum = 0;
            for (int i = 0; i < engine::EngineStats::kNumBuckets; ++i) {
                cum += h.counts[i];
                out += fmt::format("{}_bucket{{model=\"{}\",le=\"{}\"}} {}\n", name, config.model_name,
                                   engine::EngineStats::kBuckets[i], cum);
            }
            out += fmt::format("{}_bucket{{model=\"{}\",le=\"+Inf\"}} {}\n", name, config.model_name, h.count);
            out += fmt::format("{}_sum{} {}\n{}_count{} {}\n", name, label, h.sum, name, label, h.count);
        };
        histogram("fanout_time_to_first_token_seconds", "Time from request to first token.", s.ttft);
        histogram("fanout_inter_token_latency_seconds", "Time between a request's tokens.", s.itl);
        histogram("fanout_e2e_request_latency_seconds", "Time from request to its last token.", s.e2e);
        return out;
    }

    void routes() {
        http.set_payload_max_length(config.max_body_bytes);
        // Every request in flight can hold a worker (streams do), plus a few for /health and /metrics,
        // so the 429 limit fires before connections queue silently.
        const int threads = std::max(config.http_threads, config.max_in_flight + 16);
        http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
        http.Post("/v1/chat/completions", [this](const auto& req, auto& res) { handle(req, res, true); });
        http.Post("/v1/completions", [this](const auto& req, auto& res) { handle(req, res, false); });
        http.Get("/v1/models", [this](const auto&, auto& res) {
            const json m = {{"id", config.model_name}, {"object", "model"}, {"created", unix_now()},
                            {"owned_by", "fanout"}, {"max_model_len", engine.max_context()}};
            res.set_content(json{{"object", "list"}, {"data", json::array({m})}}.dump(), "application/json");
        });
        http.Get("/health", [](const auto&, auto& res) { res.set_content(R"({"status":"ok"})", "application/json"); });
        http.Get("/metrics", [this](const auto&, auto& res) { res.set_content(metrics(), "text/plain; version=0.0.4"); });
        // Errors httplib raises itself (unknown route 404, oversized body 413, ...) in OpenAI's shape.
        http.set_error_handler([](const auto& req, auto& res) {
            if (!res.body.empty()) return;
            const std::string msg = res.status == 404   ? fmt::format("no route {} {}", req.method, req.path)
                                    : res.status == 413 ? "the request body is too large"
                                                        : fmt::format("HTTP {}", res.status);
            res.set_content(dump(error_body({res.status, msg, res.status >= 500 ? "server_error" : "invalid_request_error",
                                             "", ""})),
                            "application/json");
        });
        http.set_exception_handler([](const auto&, auto& res, std::exception_ptr ep) {
            std::string msg = "internal error";
            try {
                std::rethrow_exception(ep);
            } catch (const std::exception& e) {
                msg = e.what();
            } catch (...) {
            }
            res.status = 500;
            res.set_content(dump(error_body({500, msg, "server_error", "", ""})), "application/json");
        });
    }
};

OpenAIServer::OpenAIServer(engine::Engine& engine, const io::Tokenizer& tokenizer, const ServerConfig& config)
    : impl_(std::make_unique<Impl>(engine, tokenizer, config)) {
    impl_->routes();
}

OpenAIServer::~OpenAIServer() { stop(); }

int OpenAIServer::bind() {
    const int port = impl_->config.port == 0 ? impl_->http.bind_to_any_port(impl_->config.host)
                                             : (impl_->http.bind_to_port(impl_->config.host, impl_->config.port)
                                                    ? impl_->config.port
                                                    : -1);
    FANOUT_CHECK(port > 0, "cannot listen on {}:{} (in use, or not an address of this machine)", impl_->config.host,
                 impl_->config.port);
    impl_->http.raise_backlog(1024);
    return port;
}

void OpenAIServer::serve() { impl_->http.listen_after_bind(); }
void OpenAIServer::stop() { impl_->http.stop(); }

}  // namespace fanout::serve

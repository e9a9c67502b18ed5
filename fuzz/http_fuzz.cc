// libFuzzer target: the public HTTP surface, without sockets.
//
// Raw bytes go through the server's own HTTP parser settings and limits (parse_http_request), the
// server's route table (Host, method, Content-Type checks) and the OpenAI handlers of a real
// OpenAIServer over a real Engine with a small fake model (DeepSeek-V3's tokenizer and chat
// template, so prompts are tokenized and rendered as in production). The first byte picks the
// framing: raw HTTP bytes, or the rest as a JSON body POSTed to /v1/chat/completions or
// /v1/completions with valid headers (so the fuzzer spends its time inside the protocol).
//
// Every outcome must be one of: an error response in OpenAI's shape ({"error": {"message": str,
// "type": str, ...}}, status 4xx/5xx), or a 200 whose body is a complete completion (whole) or a
// well-formed event stream ending in [DONE] (streamed) — produced within a bounded number of
// engine steps (a request that asks for many tokens is cancelled after them, as a client hanging
// up). Anything else traps.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "fanout/engine/engine.h"
#include "fanout/io/tokenizer.h"
#include "fanout/serve/http_server.h"
#include "fanout/serve/openai_server.h"

namespace {

using fanout::serve::HttpRequest;
using fanout::serve::HttpResponse;
using nlohmann::json;

// Next token = a function of the last one and the position, as a one-hot logit over the tokenizer's vocabulary.
class FakeRunner : public fanout::engine::ModelRunner {
  public:
    explicit FakeRunner(int64_t vocab) : vocab_(vocab) {}
    int64_t vocab_size() const override { return vocab_; }
    int64_t max_context() const override { return 2048; }
    std::vector<int64_t> eos_ids() const override { return {1}; }
    fanout::kv::KvCacheConfig kv_cache_config(int64_t num_blocks) const override {
        return {1, 1, 64, num_blocks, fanout::DType::kF32};
    }
    fanout::Tensor forward(const fanout::model::StepBatch& b, fanout::kv::PagedKvCache&) override {
        fanout::Tensor logits =
            fanout::Tensor::zeros({static_cast<int64_t>(b.logit_rows.size()), vocab_}, fanout::DType::kF32);
        for (size_t i = 0; i < b.logit_rows.size(); ++i) {
            const int32_t r = b.logit_rows[i];
            const int64_t next = (7 * static_cast<int64_t>(b.tokens[r]) + b.positions[r] + 1000) % vocab_;
            logits.data_as<float>()[i * vocab_ + next] = 1.0f;
        }
        return logits;
    }

  private:
    int64_t vocab_;
};

struct World {
    fanout::io::Tokenizer tokenizer;
    std::unique_ptr<fanout::engine::Engine> engine;
    std::unique_ptr<fanout::serve::OpenAIServer> server;
    fanout::serve::HttpLimits limits;
};

World& world() {
    static World* w = [] {
        auto* w = new World{fanout::io::Tokenizer::load([] {
                                const char* env = std::getenv("FANOUT_TOKENIZER_DIR");
                                return std::string(env && *env ? env : FANOUT_DEFAULT_TOKENIZER_DIR);
                            }()),
                            nullptr,
                            nullptr,
                            {}};
        fanout::engine::EngineConfig ec;
        ec.num_kv_blocks = 64;
        w->engine = std::make_unique<fanout::engine::Engine>(std::make_unique<FakeRunner>(w->tokenizer.vocab_size()),
                                                             &w->tokenizer, ec);
        fanout::serve::ServerConfig sc;
        sc.model_name = "tiny";
        sc.limits.max_body_bytes = 64 << 10;
        sc.max_in_flight = 1 << 20;
        w->limits = sc.limits;
        w->server = std::make_unique<fanout::serve::OpenAIServer>(*w->engine, w->tokenizer, sc);
        return w;
    }();
    return *w;
}

void check(bool ok) {
    if (!ok) __builtin_trap();
}

void check_error_body(int status, const std::string& body) {
    check(status >= 400 && status < 600);
    const json j = json::parse(body, nullptr, false);
    check(j.is_object() && j.contains("error") && j["error"].is_object());
    check(j["error"].contains("message") && j["error"]["message"].is_string());
    check(j["error"].contains("type") && j["error"]["type"].is_string());
}

// Pulls a source to its end, stepping the engine; cancels (a client hanging up) after a few steps.
std::string drain(fanout::serve::ResponseSource& source, fanout::engine::Engine& engine) {
    std::string out;
    source.on_ready([] {});
    for (int step = 0; step < 64; ++step) {
        if (source.pull(out)) return out;
        if (step == 6) source.cancel();
        engine.step();
    }
    __builtin_trap();  // a cancelled request must end
}

void check_response(const HttpRequest& req, HttpResponse& res, fanout::engine::Engine& engine) {
    if (!res.source) {
        if (res.status >= 400)
            check_error_body(res.status, res.body);
        else
            check(json::parse(res.body, nullptr, false).is_object() || res.content_type.starts_with("text/plain"));
        return;
    }
    check(res.status == 200 && req.method == "POST");
    const std::string body = drain(*res.source, engine);
    if (!res.streamed) {
        const int status = res.source->status();
        if (status != 200) return check_error_body(status, body);
        const json j = json::parse(body, nullptr, false);
        check(j.is_object() && j.contains("choices") && j["choices"].size() == 1 && j.contains("usage"));
        return;
    }
    // data: <json>\n\n ... data: [DONE]\n\n, or an error event (the request failed or was cancelled).
    size_t at = 0;
    bool done = false, errored = false;
    while (at < body.size()) {
        check(!done && body.compare(at, 6, "data: ") == 0);
        const size_t end = body.find("\n\n", at);
        check(end != std::string::npos);
        const std::string payload = body.substr(at + 6, end - at - 6);
        if (payload == "[DONE]") {
            done = true;
        } else {
            const json j = json::parse(payload, nullptr, false);
            check(j.is_object() && (j.contains("choices") || j.contains("error")));
            errored |= j.contains("error");
        }
        at = end + 2;
    }
    check(done || errored);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    World& w = world();
    const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
    std::string bytes;
    if (data[0] % 3 == 0) {
        bytes = rest;
    } else {
        const char* path = data[0] % 3 == 1 ? "/v1/chat/completions" : "/v1/completions";
        bytes = std::string("POST ") + path +
                " HTTP/1.1\r\nHost: localhost:8000\r\nContent-Type: application/json\r\n" +
                "Content-Length: " + std::to_string(rest.size()) + "\r\n\r\n" + rest;
    }
    const fanout::serve::ParsedHttp parsed = fanout::serve::parse_http_request(bytes, w.limits);
    const auto& router = w.server->router();
    if (parsed.incomplete) return 0;
    if (!parsed.request) {
        check(parsed.error_status >= 400 && parsed.error_status < 500);
        HttpResponse e = router.error(parsed.error_status, parsed.error_message);
        check_error_body(e.status, e.body);
        return 0;
    }
    HttpResponse res = router.dispatch(*parsed.request);
    check_response(*parsed.request, res, *w.engine);
    // The bytes the server would write for it must serialize (sources were drained above).
    res.source = nullptr;
    (void)fanout::serve::serialize_http_response(res, *parsed.request);
    return 0;
}

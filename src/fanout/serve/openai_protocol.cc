#include "fanout/serve/openai_protocol.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <set>

#include "fanout/io/json_util.h"

namespace fanout::serve {
namespace {

using nlohmann::json;

// fanout::Error messages end with " (file.cc:NN)"; clients get the message alone.
std::string client_message(std::string m) {
    const size_t open = m.rfind(" (");
    const bool located = open != std::string::npos && m.back() == ')' &&
                         (m.find(".cc:", open) != std::string::npos || m.find(".h:", open) != std::string::npos);
    if (located) m.resize(open);
    return m;
}

[[noreturn]] void bad_request(std::string message, std::string param = "", std::string code = "") {
    throw ApiError{400, client_message(std::move(message)), "invalid_request_error", std::move(param), std::move(code)};
}

// Fields each endpoint accepts. Known OpenAI fields fanout does not implement are accepted only
// at their neutral values (checked below); anything else is an error naming the field.
const std::set<std::string> kCommonFields = {"model",
                                             "max_tokens",
                                             "temperature",
                                             "top_p",
                                             "top_k",
                                             "seed",
                                             "stop",
                                             "stream",
                                             "stream_options",
                                             "n",
                                             "ignore_eos",
                                             "presence_penalty",
                                             "frequency_penalty",
                                             "logprobs",
                                             "user",
                                             "logit_bias",
                                             "skip_special_tokens"};
const std::set<std::string> kChatFields = {"messages", "max_completion_tokens", "top_logprobs",       "response_format",
                                           "tools",    "tool_choice",           "parallel_tool_calls"};
const std::set<std::string> kCompletionFields = {"prompt", "echo", "best_of", "suffix"};

bool present(const json& b, const char* key) { return b.contains(key) && !b[key].is_null(); }

double number_field(const json& b, const char* key, double fallback, double lo, double hi) {
    if (!present(b, key)) return fallback;
    if (!b[key].is_number())
        bad_request(fmt::format("'{}' must be a number, got {}", key, io::describe_json(b[key])), key);
    const double v = b[key].get<double>();
    if (!(v >= lo && v <= hi)) bad_request(fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, v), key);
    return v;
}

int64_t int_field(const json& b, const char* key, int64_t fallback, int64_t lo, int64_t hi) {
    if (!present(b, key)) return fallback;
    if (!b[key].is_number_integer())
        bad_request(fmt::format("'{}' must be an integer, got {}", key, io::describe_json(b[key])), key);
    if (b[key].is_number_unsigned() && b[key].get<uint64_t>() > static_cast<uint64_t>(hi))
        bad_request(fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, b[key].dump()), key);
    const int64_t v = b[key].get<int64_t>();
    if (v < lo || v > hi) bad_request(fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, v), key);
    return v;
}

bool bool_field(const json& b, const char* key, bool fallback) {
    if (!present(b, key)) return fallback;
    if (!b[key].is_boolean())
        bad_request(fmt::format("'{}' must be true or false, got {}", key, io::describe_json(b[key])), key);
    return b[key].get<bool>();
}

void string_field(const json& b, const char* key) {
    if (present(b, key) && !b[key].is_string())
        bad_request(fmt::format("'{}' must be a string, got {}", key, io::describe_json(b[key])), key);
}

// OpenAI's logit_bias: {"token id": bias in [-100, 100]}, at most 300 entries.
std::vector<std::pair<int32_t, float>> logit_bias_field(const json& b, int64_t vocab) {
    if (!present(b, "logit_bias")) return {};
    const json& m = b["logit_bias"];
    if (!m.is_object())
        bad_request(fmt::format("'logit_bias' must be an object of token id → bias, got {}", io::describe_json(m)),
                    "logit_bias");
    if (m.size() > 300) bad_request(fmt::format("'logit_bias' has {} entries; at most 300", m.size()), "logit_bias");
    std::vector<std::pair<int32_t, float>> out;
    for (const auto& [key, value] : m.items()) {
        int64_t id = -1;
        const bool digits = !key.empty() && key.size() <= 10 &&
                            std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (digits) id = std::stoll(key);
        if (!digits || id >= vocab)
            bad_request(fmt::format("'logit_bias' key '{}' is not a token id in [0, {})", key.substr(0, 40), vocab),
                        "logit_bias");
        if (!value.is_number() || !(value.get<double>() >= -100 && value.get<double>() <= 100))
            bad_request(fmt::format("'logit_bias' value for token {} must be a number in [-100, 100], got {}", id,
                                    io::describe_json(value)),
                        "logit_bias");
        out.emplace_back(static_cast<int32_t>(id), static_cast<float>(value.get<double>()));
    }
    std::sort(out.begin(), out.end());
    for (size_t i = 1; i < out.size(); ++i)
        if (out[i].first == out[i - 1].first)
            bad_request(fmt::format("'logit_bias' names token {} twice", out[i].first), "logit_bias");
    return out;
}

void check_model(const json& b, const ApiModel& model) {
    if (!b.contains("model") || !b["model"].is_string()) bad_request("'model' is required (a string)", "model");
    const std::string name = b["model"].get<std::string>();
    if (name != model.name)
        throw ApiError{
            404, fmt::format("model '{}' does not exist; this server serves '{}'", name.substr(0, 200), model.name),
            "invalid_request_error", "model", "model_not_found"};
}

// Known OpenAI options fanout does not implement: accepted at their neutral values only.
void check_unsupported(const json& b) {
    if (int_field(b, "n", 1, 1, 128) != 1) bad_request("only n = 1 is supported", "n");
    if (int_field(b, "best_of", 1, 1, 128) != 1) bad_request("only best_of = 1 is supported", "best_of");
    for (const char* k : {"presence_penalty", "frequency_penalty"})
        if (number_field(b, k, 0.0, -2.0, 2.0) != 0.0) bad_request(fmt::format("'{}' is not supported", k), k);
    if (present(b, "logprobs")) {
        const json& l = b["logprobs"];
        // chat: a boolean; completions: an integer 0..5
        if (!(l.is_boolean() || l.is_number_integer()))
            bad_request(fmt::format("'logprobs' must be a boolean or an integer, got {}", io::describe_json(l)),
                        "logprobs");
        if ((l.is_boolean() && l.get<bool>()) || (l.is_number_integer() && l.get<int64_t>() != 0))
            bad_request("logprobs are not supported yet", "logprobs");
    }
    if (int_field(b, "top_logprobs", 0, 0, 20) != 0) bad_request("logprobs are not supported yet", "top_logprobs");
    if (bool_field(b, "echo", false)) bad_request("echo is not supported", "echo");
    if (present(b, "tools") && !(b["tools"].is_array() && b["tools"].empty()))
        bad_request("tool calling is not supported yet", "tools");
    if (present(b, "tool_choice")) {
        const json& t = b["tool_choice"];
        if (!t.is_string() && !t.is_object())
            bad_request(fmt::format("'tool_choice' must be a string or an object, got {}", io::describe_json(t)),
                        "tool_choice");
        if (!(t.is_string() && (t == "none" || t == "auto")))
            bad_request(
                "'tool_choice' needs 'tools', and tool calling is not supported yet; only \"none\" or "
                "\"auto\" are accepted",
                "tool_choice");
    }
    bool_field(b, "parallel_tool_calls", true);
    string_field(b, "user");
    if (present(b, "response_format") && !(b["response_format"].is_object() && b["response_format"].contains("type") &&
                                           b["response_format"]["type"] == "text"))
        bad_request("only response_format {\"type\": \"text\"} is supported", "response_format");
    if (present(b, "suffix")) bad_request("suffix is not supported", "suffix");
}

std::vector<std::string> stop_field(const json& b) {
    std::vector<std::string> stop;
    if (!present(b, "stop")) return stop;
    const json& s = b["stop"];
    if (s.is_string()) {
        stop.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 16) {
        for (const auto& x : s) {
            if (!x.is_string()) bad_request("'stop' entries must be strings", "stop");
            stop.push_back(x.get<std::string>());
        }
    } else {
        bad_request("'stop' must be a string or an array of at most 16 strings", "stop");
    }
    for (const auto& x : stop) {
        if (x.empty()) bad_request("'stop' strings must not be empty", "stop");
        if (io::utf8_invalid_offset(x) != std::string::npos) bad_request("'stop' strings must be valid UTF-8", "stop");
    }
    return stop;
}

std::vector<int32_t> chat_prompt(const json& b, const PromptEncoder& enc) {
    if (!enc.chat_format) throw ApiError{400, enc.chat_format_error, "invalid_request_error", "messages", ""};
    if (!b.contains("messages")) bad_request("'messages' is required", "messages");
    if (b["messages"].is_array() && b["messages"].empty()) bad_request("'messages' must not be empty", "messages");
    std::vector<io::ChatMessage> messages;
    try {
        messages = io::parse_chat_messages(b["messages"]);
    } catch (const Error& e) {
        bad_request(e.what(), "messages");
    }
    return enc.tokenizer->encode(io::render_chat(*enc.chat_format, messages, true, enc.tokenizer->bos_token()), false);
}

std::vector<int32_t> completion_prompt(const json& b, const PromptEncoder& enc) {
    if (!b.contains("prompt")) bad_request("'prompt' is required", "prompt");
    const json& p = b["prompt"];
    if (p.is_string()) return enc.tokenizer->encode(p.get<std::string>(), true);
    if (p.is_array() && p.size() == 1 && p[0].is_string()) return enc.tokenizer->encode(p[0].get<std::string>(), true);
    if (p.is_array() && !p.empty() &&
        std::all_of(p.begin(), p.end(), [](const json& x) { return x.is_number_integer(); })) {
        std::vector<int32_t> ids;
        for (const auto& x : p) {
            if (x.is_number_unsigned() && x.get<uint64_t>() > INT32_MAX)
                bad_request(fmt::format("token id {} is out of range", x.dump()), "prompt");
            const int64_t v = x.get<int64_t>();
            if (v < 0 || v > INT32_MAX) bad_request(fmt::format("token id {} is out of range", v), "prompt");
            ids.push_back(static_cast<int32_t>(v));
        }
        return ids;
    }
    bad_request(
        "'prompt' must be a string, a one-string array, or an array of token ids (batches are not "
        "supported)",
        "prompt");
}

}  // namespace

std::string error_type_for(int status) {
    if (status == 429) return "rate_limit_error";
    if (status == 404) return "invalid_request_error";
    if (status >= 500) return "server_error";
    return "invalid_request_error";
}

json error_json(const ApiError& e) {
    return {{"error",
             {{"message", e.message},
              {"type", e.type.empty() ? error_type_for(e.status) : e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json parse_body(std::string_view body) {
    json b;
    try {
        b = io::parse_json_bounded(body, "the request body");
    } catch (const Error& e) {
        bad_request(e.what());
    }
    if (!b.is_object()) bad_request(fmt::format("the body must be a JSON object, got {}", io::describe_json(b)));
    return b;
}

CompletionRequest parse_completion_request(const json& b, bool chat, const PromptEncoder& enc, const ApiModel& model) {
    check_model(b, model);
    const auto& extra = chat ? kChatFields : kCompletionFields;
    for (const auto& [key, value] : b.items())
        if (!kCommonFields.count(key) && !extra.count(key))
            bad_request(fmt::format("unknown field '{}'", key.substr(0, 100)), key.substr(0, 100));
    check_unsupported(b);
    CompletionRequest r;
    r.chat = chat;
    auto& p = r.params;
    p.sampling.temperature = static_cast<float>(number_field(b, "temperature", 1.0, 0.0, 100.0));
    p.sampling.top_p = static_cast<float>(number_field(b, "top_p", 1.0, 1e-9, 1.0));
    p.sampling.top_k = static_cast<int>(int_field(b, "top_k", 0, -1, 1 << 30));
    if (p.sampling.top_k < 0) p.sampling.top_k = 0;  // vLLM spells "off" as -1
    p.sampling.seed = present(b, "seed") ? static_cast<uint64_t>(int_field(b, "seed", 0, INT64_MIN, INT64_MAX))
                                         : std::random_device{}();
    p.sampling.logit_bias = logit_bias_field(b, model.vocab_size);
    p.ignore_eos = bool_field(b, "ignore_eos", false);
    p.skip_special_tokens = bool_field(b, "skip_special_tokens", true);
    p.stop = stop_field(b);
    // OpenAI's newer name and the older one: each checked when sent; the newer wins (as vLLM takes
    // it), so a client that sends both for compatibility is served.
    const int64_t asked_new = int_field(b, "max_completion_tokens", 0, 1, model.max_context),
                  asked_old = int_field(b, "max_tokens", 0, 1, model.max_context);
    const int64_t asked = present(b, "max_completion_tokens") ? asked_new : asked_old;
    r.stream = bool_field(b, "stream", false);
    if (present(b, "stream_options")) {
        if (!b["stream_options"].is_object())
            bad_request(
                fmt::format("'stream_options' must be an object, got {}", io::describe_json(b["stream_options"])),
                "stream_options");
        if (!r.stream) bad_request("'stream_options' is only allowed with \"stream\": true", "stream_options");
        for (const auto& [key, value] : b["stream_options"].items())
            if (key != "include_usage")
                bad_request(fmt::format("unknown field 'stream_options.{}'", key.substr(0, 100)), "stream_options");
        r.include_usage = bool_field(b["stream_options"], "include_usage", false);
    }
    // The prompt last: tokenizing is the expensive part, and every cheap check has passed.
    try {
        p.prompt = chat ? chat_prompt(b, enc) : completion_prompt(b, enc);
    } catch (const Error& e) {  // e.g. text that is not valid UTF-8
        bad_request(e.what(), chat ? "messages" : "prompt");
    }
    const int64_t room = model.max_context - static_cast<int64_t>(p.prompt.size());
    p.max_tokens = asked > 0 ? asked : std::clamp<int64_t>(room, 1, model.default_max_tokens);
    return r;
}

ApiError engine_error(const std::string& what) {
    return {400, client_message(what), "invalid_request_error", "",
            what.find("exceeds the context") != std::string::npos ? "context_length_exceeded" : ""};
}

json usage_json(const engine::RequestEvent& ev) {
    json u = {{"prompt_tokens", ev.prompt_tokens},
              {"completion_tokens", ev.completion_tokens},
              {"total_tokens", ev.prompt_tokens + ev.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", ev.cached_tokens}}}};
    // MTP speculative decoding, in OpenAI's fields for predicted tokens: drafts the model accepted
    // and those it rejected (only when the server drafts).
    if (ev.draft_tokens > 0)
        u["completion_tokens_details"] = {{"accepted_prediction_tokens", ev.accepted_draft_tokens},
                                          {"rejected_prediction_tokens", ev.draft_tokens - ev.accepted_draft_tokens}};
    return u;
}

bool is_failure(const engine::RequestEvent& ev) {
    return ev.finished &&
           (ev.finish_reason == "error" || ev.finish_reason == "abort" || ev.finish_reason == "unavailable");
}

CompletionRenderer::CompletionRenderer(std::string id, bool chat, bool include_usage, std::string model,
                                       int64_t created)
    : id_(std::move(id)), model_(std::move(model)), chat_(chat), include_usage_(include_usage), created_(created) {}

json CompletionRenderer::chunk(json delta_or_text, json finish) const {
    json choice = {{"index", 0}, {"finish_reason", std::move(finish)}};
    if (chat_)
        choice["delta"] = std::move(delta_or_text);
    else
        choice["text"] = std::move(delta_or_text), choice["logprobs"] = nullptr;
    return {{"id", id_},
            {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
            {"created", created_},
            {"model", model_},
            {"choices", json::array({std::move(choice)})}};
}

namespace {
std::string sse(const json& j) { return "data: " + dump_json(j) + "\n\n"; }
const ApiError kEngineFailure{500, "generation failed in the engine; see the server log", "server_error", "", ""};
const ApiError kEngineUnavailable{503, "the engine serving this request became unavailable; retry the request",
                                  "server_error", "", "service_unavailable"};
// The error a failed request ends with: "unavailable" (its engine went away: retrying may work)
// or a failure in the engine.
const ApiError& failure_error(const engine::RequestEvent& ev) {
    return ev.finish_reason == "unavailable" ? kEngineUnavailable : kEngineFailure;
}
}  // namespace

std::string CompletionRenderer::stream_start() const {
    return chat_ ? sse(chunk({{"role", "assistant"}, {"content", ""}}, nullptr)) : "";
}

std::string CompletionRenderer::stream_event(const engine::RequestEvent& ev) const {
    std::string out;
    if (!ev.text.empty()) out += sse(chunk(chat_ ? json{{"content", ev.text}} : json(ev.text), nullptr));
    if (!ev.finished) return out;
    if (is_failure(ev)) return out + sse(error_json(failure_error(ev)));  // as OpenAI's API errors mid-stream
    out += sse(chunk(chat_ ? json::object() : json(""), ev.finish_reason));
    if (include_usage_) {
        out += sse({{"id", id_},
                    {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
                    {"created", created_},
                    {"model", model_},
                    {"choices", json::array()},
                    {"usage", usage_json(ev)}});
    }
    return out + "data: [DONE]\n\n";
}

void CompletionRenderer::add(const engine::RequestEvent& ev) {
    text_ += ev.text;
    if (ev.finished) last_ = ev;
}

int CompletionRenderer::status() const { return last_ && is_failure(*last_) ? failure_error(*last_).status : 200; }

std::string CompletionRenderer::body() const {
    FANOUT_CHECK(last_.has_value(), "the response is not complete");
    if (is_failure(*last_)) return dump_json(error_json(failure_error(*last_)));
    json choice = {{"index", 0}, {"finish_reason", last_->finish_reason}};
    if (chat_)
        choice["message"] = {{"role", "assistant"}, {"content", text_}};
    else
        choice["text"] = text_, choice["logprobs"] = nullptr;
    return dump_json({{"id", id_},
                      {"object", chat_ ? "chat.completion" : "text_completion"},
                      {"created", created_},
                      {"model", model_},
                      {"choices", json::array({std::move(choice)})},
                      {"usage", usage_json(*last_)}});
}

}  // namespace fanout::serve

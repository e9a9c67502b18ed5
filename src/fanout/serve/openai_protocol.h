// The OpenAI API as data: request bodies validated into engine parameters, responses, stream
// chunks and errors rendered. No sockets and no engine here: the HTTP server (`serve`), the router
// (later) and the protocol fuzzer all go through these functions.
//
// Every body is parsed once, with bounds (io::parse_json_bounded: depth, NUL bytes), before
// anything walks it. Fields fanout does not implement are accepted only at their neutral values;
// anything else — unknown fields, wrong types, values out of range — is a 400 naming the field,
// as vLLM answers. Errors have OpenAI's shape {"error": {"message", "type", "param", "code"}}.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "fanout/engine/engine.h"
#include "fanout/io/chat_template.h"
#include "fanout/io/tokenizer.h"

namespace fanout::serve {

// A request the client got wrong (or a refusal): becomes an OpenAI error response.
struct ApiError {
    int status = 400;
    std::string message, type = "invalid_request_error", param, code;
};

// The error type OpenAI uses for a status: invalid_request_error, rate_limit_error, server_error, ...
std::string error_type_for(int status);
nlohmann::json error_json(const ApiError& e);
// Bodies never fail to serialize: invalid UTF-8 (e.g. echoed from a bad request) is replaced.
std::string dump_json(const nlohmann::json& j);

// What the API serves, and its defaults.
struct ApiModel {
    std::string name;
    int64_t max_context = 0;
    int64_t vocab_size = 0;
    int64_t default_max_tokens = 4096;  // when a request names none (DeepSeek's API default), capped by the context
};

// Parses a request body: a JSON object, at most 64 levels deep, no NUL bytes; else ApiError 400.
nlohmann::json parse_body(std::string_view body);

struct CompletionRequest {
    engine::RequestParams params;
    bool chat = false;
    bool stream = false, include_usage = false;
};

// What turns text into prompt ids: the tokenizer and, for chat, the chat format (or why none).
struct PromptEncoder {
    const io::Tokenizer* tokenizer = nullptr;
    std::optional<io::ChatFormat> chat_format;
    std::string chat_format_error;  // set when chat_format is empty
};

// A /v1/chat/completions (chat) or /v1/completions body → engine parameters; ApiError when invalid
// (404 for another model's name). The engine still validates what only it knows (vocabulary,
// context), and its errors become 400s through engine_error().
CompletionRequest parse_completion_request(const nlohmann::json& body, bool chat, const PromptEncoder& encoder,
                                           const ApiModel& model);
// An engine::submit refusal as the client sees it.
ApiError engine_error(const std::string& what);

// Renders one request's output, streamed (server-sent events) or whole.
class CompletionRenderer {
  public:
    CompletionRenderer(std::string id, bool chat, bool include_usage, std::string model, int64_t created);
    // The stream's opening (chat: the assistant role), before any event.
    std::string stream_start() const;
    // The SSE text for one engine event (the last one closes the stream with [DONE]).
    std::string stream_event(const engine::RequestEvent& ev) const;
    // For a whole response: accumulate an event; after the finished one, body() and status().
    void add(const engine::RequestEvent& ev);
    std::string body() const;
    int status() const;

  private:
    nlohmann::json chunk(nlohmann::json delta_or_text, nlohmann::json finish) const;
    std::string id_, model_;
    bool chat_, include_usage_;
    int64_t created_;
    std::string text_;
    std::optional<engine::RequestEvent> last_;
};

nlohmann::json usage_json(const engine::RequestEvent& ev);
// True when an engine event ends the request with a failure (not a normal finish).
bool is_failure(const engine::RequestEvent& ev);

}  // namespace fanout::serve

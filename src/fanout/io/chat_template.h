// Chat rendering: OpenAI-style `messages` into the prompt text the model was trained on.
//
// No C++ Jinja engine is packaged in Debian 12 (inja lacks Jinja's namespace() and `is none`), so
// fanout implements DeepSeek-V3's chat template natively, statement for statement — quirks
// included (with exactly one tool call in an assistant turn the template never writes
// <｜tool▁calls▁end｜>; `ns.is_first` is never reset between turns). It is tested against
// @huggingface/jinja applying the template text itself (tests/fixtures/tokenizer). A tokenizer
// whose chat_template is not one fanout knows is an Error, never a silent mis-rendering.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace fanout::io {

struct ToolCall {
    std::string type = "function";
    std::string name;
    std::string arguments;  // JSON text, as OpenAI sends it
};

struct ChatMessage {
    std::string role;                    // system, user, assistant, tool
    std::optional<std::string> content;  // null only for an assistant turn with tool calls
    std::vector<ToolCall> tool_calls;
};

// Validates an OpenAI `messages` array; errors name the message index and field. Content may be
// a string or a list of {"type": "text", "text": ...} parts (joined by newlines, as vLLM); tool-call arguments may be
// a string or a JSON object (serialized).
std::vector<ChatMessage> parse_chat_messages(const nlohmann::json& messages);

enum class ChatFormat { kDeepSeekV3 };

// Which native renderer matches this chat_template text; Error when none does.
ChatFormat detect_chat_format(const std::string& chat_template);

std::string render_chat(ChatFormat format, const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                        const std::string& bos_token);

}  // namespace fanout::io

#include "fanout/io/chat_template.h"

#include "fanout/core/error.h"
#include "fanout/io/json_util.h"

namespace fanout::io {
namespace {

using nlohmann::json;

uint64_t fnv1a(const std::string& s) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return h;
}

// FNV-1a of the chat_template in deepseek-ai/DeepSeek-V3's tokenizer_config.json (2145 bytes).
constexpr uint64_t kDeepSeekV3TemplateHash = 0xf9e4bbe11a2467acull;

std::string content_text(const json& c, const std::string& where) {
    if (c.is_string()) return c.get<std::string>();
    FANOUT_CHECK(c.is_array(), "{}: 'content' must be a string, an array of text parts, or null; found {}", where,
                 describe_json(c));
    std::string out;
    for (size_t i = 0; i < c.size(); ++i) {
        const json& part = c[i];
        FANOUT_CHECK(
            part.is_object() && part.contains("type") && part["type"] == "text" && part.contains("text") &&
                part["text"].is_string(),
            "{}: content[{}] must be {{\"type\": \"text\", \"text\": \"...\"}} (only text parts are supported)", where,
            i);
        if (i > 0) out += '\n';  // vLLM joins a message's text parts with newlines
        out += part["text"].get<std::string>();
    }
    return out;
}

}  // namespace

std::vector<ChatMessage> parse_chat_messages(const json& messages) {
    FANOUT_CHECK(messages.is_array(), "'messages' must be an array, found {}", describe_json(messages));
    std::vector<ChatMessage> out;
    for (size_t i = 0; i < messages.size(); ++i) {
        const std::string where = fmt::format("messages[{}]", i);
        const json& m = messages[i];
        FANOUT_CHECK(m.is_object(), "{} must be an object, found {}", where, describe_json(m));
        FANOUT_CHECK(m.contains("role") && m["role"].is_string(), "{}: missing string field 'role'", where);
        ChatMessage msg;
        msg.role = m["role"].get<std::string>();
        FANOUT_CHECK(msg.role == "system" || msg.role == "user" || msg.role == "assistant" || msg.role == "tool",
                     "{}: role '{}' is not one of system, user, assistant, tool", where, msg.role);
        const bool has_content = m.contains("content") && !m["content"].is_null();
        if (has_content) msg.content = content_text(m["content"], where);
        if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
            FANOUT_CHECK(msg.role == "assistant", "{}: only assistant messages carry tool_calls", where);
            const json& calls = m["tool_calls"];
            FANOUT_CHECK(calls.is_array(), "{}: 'tool_calls' must be an array", where);
            for (size_t k = 0; k < calls.size(); ++k) {
                const std::string cw = fmt::format("{}.tool_calls[{}]", where, k);
                const json& c = calls[k];
                FANOUT_CHECK(c.is_object() && c.contains("function") && c["function"].is_object(),
                             "{}: missing object field 'function'", cw);
                const json& f = c["function"];
                FANOUT_CHECK(f.contains("name") && f["name"].is_string(), "{}.function: missing string 'name'", cw);
                ToolCall tc;
                if (c.contains("type") && c["type"].is_string()) tc.type = c["type"].get<std::string>();
                tc.name = f["name"].get<std::string>();
                if (f.contains("arguments"))
                    tc.arguments =
                        f["arguments"].is_string() ? f["arguments"].get<std::string>() : f["arguments"].dump();
                msg.tool_calls.push_back(std::move(tc));
            }
        }
        FANOUT_CHECK(msg.content || (msg.role == "assistant" && !msg.tool_calls.empty()),
                     "{}: 'content' is missing or null (allowed only for an assistant message with tool_calls)", where);
        out.push_back(std::move(msg));
    }
    return out;
}

ChatFormat detect_chat_format(const std::string& chat_template) {
    FANOUT_CHECK(!chat_template.empty(), "the tokenizer has no chat_template (tokenizer_config.json)");
    FANOUT_CHECK(fnv1a(chat_template) == kDeepSeekV3TemplateHash,
                 "chat_template ({} bytes) is not one fanout renders; fanout implements DeepSeek-V3's template "
                 "natively (docs/DECISIONS.md)",
                 chat_template.size());
    return ChatFormat::kDeepSeekV3;
}

// DeepSeek-V3's chat_template, statement for statement.
std::string render_chat(ChatFormat format, const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                        const std::string& bos_token) {
    FANOUT_CHECK(format == ChatFormat::kDeepSeekV3, "unknown chat format");
    struct {
        bool is_first = false, is_tool = false, is_output_first = true, is_first_sp = true;
        std::string system_prompt;
    } ns;
    for (const auto& m : messages) {
        if (m.role != "system") continue;
        if (ns.is_first_sp) {
            ns.system_prompt += *m.content;
            ns.is_first_sp = false;
        } else {
            ns.system_prompt += "\n\n" + *m.content;
        }
    }
    std::string out = bos_token + ns.system_prompt;
    for (const auto& m : messages) {
        if (m.role == "user") {
            ns.is_tool = false;
            out += "<｜User｜>" + *m.content;
        }
        if (m.role == "assistant" && !m.content) {
            ns.is_tool = false;
            for (const auto& tool : m.tool_calls) {
                const std::string call = tool.type + "<｜tool▁sep｜>" + tool.name + "\n```json\n" + tool.arguments +
                                         "\n```<｜tool▁call▁end｜>";
                if (!ns.is_first) {
                    out += "<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>" + call;
                    ns.is_first = true;
                } else {
                    out += "\n<｜tool▁call▁begin｜>" + call + "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>";
                }
            }
        }
        if (m.role == "assistant" && m.content) {
            if (ns.is_tool) {
                out += "<｜tool▁outputs▁end｜>" + *m.content + "<｜end▁of▁sentence｜>";
                ns.is_tool = false;
            } else {
                out += "<｜Assistant｜>" + *m.content + "<｜end▁of▁sentence｜>";
            }
        }
        if (m.role == "tool") {
            ns.is_tool = true;
            if (ns.is_output_first) {
                out += "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>" + *m.content + "<｜tool▁output▁end｜>";
                ns.is_output_first = false;
            } else {
                out += "\n<｜tool▁output▁begin｜>" + *m.content + "<｜tool▁output▁end｜>";
            }
        }
    }
    if (ns.is_tool) out += "<｜tool▁outputs▁end｜>";
    if (add_generation_prompt && !ns.is_tool) out += "<｜Assistant｜>";
    return out;
}

}  // namespace fanout::io

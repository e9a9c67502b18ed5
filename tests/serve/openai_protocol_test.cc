// The OpenAI protocol as data: bodies parsed with bounds, every field validated (the inputs a
// security review found silently accepted are refused or implemented), defaults, rendering, and
// Prometheus label escaping.
#include "fanout/serve/openai_protocol.h"

#include <gtest/gtest.h>

#include "fanout/serve/metrics.h"

namespace fanout::serve {
namespace {

using nlohmann::json;

class ProtocolTest : public ::testing::Test {
  protected:
    static void SetUpTestSuite() { tokenizer_ = new io::Tokenizer(io::Tokenizer::load(FANOUT_DEFAULT_TOKENIZER_DIR)); }
    ProtocolTest() {
        encoder.tokenizer = tokenizer_;
        encoder.chat_format = io::detect_chat_format(tokenizer_->chat_template());
        model = {"tiny", 4096, tokenizer_->vocab_size(), 4096};
    }
    CompletionRequest chat(json extra) {
        json b = {{"model", "tiny"}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
        b.update(extra);
        return parse_completion_request(b, true, encoder, model);
    }
    // The status and param of the error `extra` causes (0 when accepted).
    std::pair<int, std::string> chat_error(json extra) {
        try {
            chat(std::move(extra));
        } catch (const ApiError& e) {
            return {e.status, e.param};
        }
        return {0, ""};
    }
    static io::Tokenizer* tokenizer_;
    PromptEncoder encoder;
    ApiModel model;
};
io::Tokenizer* ProtocolTest::tokenizer_ = nullptr;

// MTP drafts appear in usage as OpenAI's predicted-output counts, only when the server drafted.
TEST(Usage, DraftsAreAcceptedAndRejectedPredictionTokens) {
    engine::RequestEvent ev;
    ev.prompt_tokens = 12;
    ev.completion_tokens = 9;
    ev.cached_tokens = 4;
    json u = usage_json(ev);
    EXPECT_EQ(u["total_tokens"], 21);
    EXPECT_EQ(u["prompt_tokens_details"]["cached_tokens"], 4);
    EXPECT_FALSE(u.contains("completion_tokens_details"));
    ev.draft_tokens = 10;
    ev.accepted_draft_tokens = 7;
    u = usage_json(ev);
    EXPECT_EQ(u["completion_tokens_details"]["accepted_prediction_tokens"], 7);
    EXPECT_EQ(u["completion_tokens_details"]["rejected_prediction_tokens"], 3);
}

TEST_F(ProtocolTest, BodiesAreParsedWithBounds) {
    const int n = 100000;
    const std::string deep = "{\"a\":" + std::string(n, '[') + std::string(n, ']') + "}";
    try {
        parse_body(deep);
        FAIL() << "accepted";
    } catch (const ApiError& e) {
        EXPECT_EQ(e.status, 400);
        EXPECT_NE(e.message.find("nested deeper"), std::string::npos) << e.message;
    }
    EXPECT_THROW(parse_body(std::string("{\"model\":\"tiny\"}\0", 17)), ApiError);  // a NUL after the body
    EXPECT_THROW(parse_body("[1]"), ApiError);
    EXPECT_THROW(parse_body("{bad"), ApiError);
    EXPECT_TRUE(parse_body(R"({"a":[[[1]]]})").is_object());
}

TEST_F(ProtocolTest, DeepToolCallArgumentsAreRefusedNotRendered) {
    std::string args = std::string(100000, '[') + std::string(100000, ']');
    const std::string body =
        R"({"model":"tiny","messages":[{"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{"name":"f","arguments":)" +
        args + R"(}}]},{"role":"user","content":"x"}]})";
    EXPECT_THROW(parse_body(body), ApiError);
}

TEST_F(ProtocolTest, SilentlyAcceptedInputsAreRefused) {
    EXPECT_EQ(chat_error({{"top_logprobs", -3}}), std::make_pair(400, std::string("top_logprobs")));
    EXPECT_EQ(chat_error({{"top_logprobs", 2}}), std::make_pair(400, std::string("top_logprobs")));
    EXPECT_EQ(chat_error({{"top_logprobs", 0}}).first, 0);
    EXPECT_EQ(chat_error({{"tool_choice", "required"}}), std::make_pair(400, std::string("tool_choice")));
    EXPECT_EQ(chat_error({{"tool_choice", {{"type", "function"}}}}).first, 400);
    EXPECT_EQ(chat_error({{"tool_choice", 3}}).first, 400);
    EXPECT_EQ(chat_error({{"tool_choice", "none"}}).first, 0);
    EXPECT_EQ(chat_error({{"user", 5}}), std::make_pair(400, std::string("user")));
    EXPECT_EQ(chat_error({{"user", "alice"}}).first, 0);
    EXPECT_EQ(chat_error({{"parallel_tool_calls", "yes"}}), std::make_pair(400, std::string("parallel_tool_calls")));
    EXPECT_EQ(chat_error({{"stream_options", {{"include_usage", true}}}}).first, 400);  // without stream
    EXPECT_EQ(chat_error({{"stream", true}, {"stream_options", {{"bogus", 1}}}}).first, 400);
    EXPECT_EQ(chat_error({{"logprobs", "x"}}).first, 400);
    EXPECT_EQ(chat_error({{"n", 2}}).first, 400);
    EXPECT_EQ(chat_error({{"model", "other"}}).first, 404);
}

TEST_F(ProtocolTest, LogitBiasIsParsed) {
    const CompletionRequest r = chat({{"logit_bias", {{"100", 5}, {"7", -100}}}});
    ASSERT_EQ(r.params.sampling.logit_bias.size(), 2u);
    EXPECT_EQ(r.params.sampling.logit_bias[0], std::make_pair(int32_t{7}, -100.0f));
    EXPECT_EQ(r.params.sampling.logit_bias[1], std::make_pair(int32_t{100}, 5.0f));
    EXPECT_EQ(chat_error({{"logit_bias", {{"7", 101}}}}).first, 400);
    EXPECT_EQ(chat_error({{"logit_bias", {{"-1", 1}}}}).first, 400);
    EXPECT_EQ(chat_error({{"logit_bias", {{"x", 1}}}}).first, 400);
    EXPECT_EQ(chat_error({{"logit_bias", {{"99999999", 1}}}}).first, 400);  // past the vocabulary
    EXPECT_EQ(chat_error({{"logit_bias", {{"1", "a"}}}}).first, 400);
    EXPECT_EQ(chat_error({{"logit_bias", json::array()}}).first, 400);
}

TEST_F(ProtocolTest, MaxTokensDefaultIsBounded) {
    EXPECT_EQ(chat(json::object()).params.max_tokens,
              4096 - static_cast<int64_t>(chat(json::object()).params.prompt.size()));
    model.max_context = 200000;
    EXPECT_EQ(chat(json::object()).params.max_tokens, 4096);  // not the 199,990 tokens left in the context
    EXPECT_EQ(chat({{"max_tokens", 10}}).params.max_tokens, 10);
    EXPECT_EQ(chat({{"max_completion_tokens", 11}}).params.max_tokens, 11);
    // Both names: each is checked, and the newer wins.
    EXPECT_EQ(chat({{"max_completion_tokens", 12}, {"max_tokens", 20}}).params.max_tokens, 12);
    EXPECT_EQ(chat_error({{"max_completion_tokens", 5}, {"max_tokens", "abc"}}),
              std::make_pair(400, std::string("max_tokens")));
    EXPECT_EQ(chat_error({{"max_completion_tokens", 5}, {"max_tokens", -7}}),
              std::make_pair(400, std::string("max_tokens")));
    EXPECT_EQ(chat_error({{"max_completion_tokens", 0}, {"max_tokens", 6}}),
              std::make_pair(400, std::string("max_completion_tokens")));
}

TEST_F(ProtocolTest, RendersStreamsAndWholeBodies) {
    CompletionRenderer r("chatcmpl-1", true, true, "tiny", 123);
    engine::RequestEvent a;
    a.text = "he";
    engine::RequestEvent b;
    b.text = "llo";
    b.finished = true;
    b.finish_reason = "length";
    b.prompt_tokens = 3;
    b.completion_tokens = 2;
    const std::string s = r.stream_start() + r.stream_event(a) + r.stream_event(b);
    EXPECT_NE(s.find("\"role\":\"assistant\""), std::string::npos);
    EXPECT_NE(s.find("\"finish_reason\":\"length\""), std::string::npos);
    EXPECT_NE(s.find("\"total_tokens\":5"), std::string::npos);
    EXPECT_TRUE(s.ends_with("data: [DONE]\n\n"));
    r.add(a);
    r.add(b);
    EXPECT_EQ(r.status(), 200);
    EXPECT_EQ(json::parse(r.body())["choices"][0]["message"]["content"], "hello");
    CompletionRenderer f("cmpl-2", false, false, "tiny", 1);
    b.finish_reason = "error";
    f.add(b);
    EXPECT_EQ(f.status(), 500);
    EXPECT_EQ(json::parse(f.body())["error"]["type"], "server_error");
}

TEST(Metrics, LabelValuesAreEscaped) {
    EXPECT_EQ(prometheus_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    const std::string text = render_metrics("evil\"} 1\nfake_metric{x=\"", engine::EngineStats{}, HttpStats{});
    // Every line is a comment or starts with a fanout_ metric: no injected line.
    size_t at = 0;
    while (at < text.size()) {
        const size_t end = text.find('\n', at);
        const std::string line = text.substr(at, end - at);
        EXPECT_TRUE(line.starts_with("# ") || line.starts_with("fanout_")) << line;
        at = end + 1;
    }
}

}  // namespace
}  // namespace fanout::serve

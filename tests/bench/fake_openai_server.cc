#include "fake_openai_server.h"

#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <sstream>
#include <stdexcept>

namespace fanout::testing {
namespace {

using nlohmann::json;

std::vector<std::string> split_words(const std::string& text) {
    std::istringstream in(text);
    std::vector<std::string> words;
    for (std::string w; in >> w;) words.push_back(w);
    return words;
}

std::string prompt_text(bool chat, const json& body) {
    if (!chat) return body.value("prompt", std::string());
    std::string text;
    for (const json& m : body.value("messages", json::array())) text += m.value("content", std::string()) + " ";
    return text;
}

// One SSE event: a chunk whose only choice carries `text` (chat delta or completions text).
std::string text_event(bool chat, const std::string& text, const char* finish_reason) {
    json choice = {{"index", 0}, {"finish_reason", finish_reason ? json(finish_reason) : json(nullptr)}};
    if (chat)
        choice["delta"] = {{"content", text}};
    else
        choice["text"] = text;
    const json chunk = {{"id", "fake-1"},
                        {"object", chat ? "chat.completion.chunk" : "text_completion"},
                        {"model", FakeOpenAIServer::kModel},
                        {"choices", json::array({choice})}};
    return "data: " + chunk.dump() + "\n\n";
}

std::string error_json(const std::string& message) {
    return json{{"error", {{"message", message}, {"type", "fake_error"}}}}.dump();
}

// The deepest nesting of arrays and objects in `text`, strings skipped.
int nesting_depth(const std::string& text) {
    int depth = 0, deepest = 0;
    bool in_string = false, escaped = false;
    for (const char c : text) {
        if (in_string) {
            if (escaped)
                escaped = false;
            else if (c == '\\')
                escaped = true;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            deepest = std::max(deepest, ++depth);
        } else if (c == ']' || c == '}') {
            --depth;
        }
    }
    return deepest;
}

// What is wrong with a completion body, or "" when it is what the benchmark sends.
std::string body_problem(const std::string& raw, const json& body, bool chat) {
    if (raw.find('\0') != std::string::npos) return "NUL byte in the body";
    if (nesting_depth(raw) > 64) return "nested too deep";
    if (body.is_discarded() || !body.is_object()) return "not a JSON object";
    static const std::set<std::string> known = {"model",  "messages",       "prompt",     "max_tokens",
                                                "stream", "stream_options", "ignore_eos", "temperature"};
    for (const auto& [key, value] : body.items()) {
        if (!known.contains(key)) return "unknown field '" + key + "'";
    }
    if (!body.contains("model") || !body["model"].is_string()) return "model must be a string";
    if (!body.contains("max_tokens") || !body["max_tokens"].is_number_integer() || body["max_tokens"].get<int>() < 1)
        return "max_tokens must be an integer >= 1";
    if (!body.contains("stream") || !body["stream"].is_boolean()) return "stream must be a boolean";
    if (body.contains("temperature") && !body["temperature"].is_number()) return "temperature must be a number";
    if (body.contains("ignore_eos") && !body["ignore_eos"].is_boolean()) return "ignore_eos must be a boolean";
    if (chat ? !body.contains("messages") || !body["messages"].is_array()
             : !body.contains("prompt") || !body["prompt"].is_string())
        return chat ? "messages must be an array" : "prompt must be a string";
    return "";
}

}  // namespace

void BacklogServer::set_listen_backlog(int backlog) {
    const int rc = ::listen(svr_sock_, backlog);
    if (rc != 0) throw std::runtime_error("listen() to raise the backlog failed");
}

FakeOpenAIServer::FakeOpenAIServer(FakeServerOptions opts) : opts_(opts) {
    const int num_threads = opts_.num_threads;
    server_.new_task_queue = [num_threads] { return new httplib::ThreadPool(num_threads); };
    server_.set_tcp_nodelay(true);
    server_.set_read_timeout(std::chrono::milliseconds(opts_.read_timeout_ms));
    server_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
        const json models = {{"object", "list"}, {"data", json::array({{{"id", kModel}, {"object", "model"}}})}};
        res.set_content(models.dump(), "application/json");
    });
    server_.Post("/v1/chat/completions",
                 [this](const httplib::Request& req, httplib::Response& res) { handle_completion(true, req, res); });
    server_.Post("/v1/completions",
                 [this](const httplib::Request& req, httplib::Response& res) { handle_completion(false, req, res); });
    port_ = server_.bind_to_any_port("127.0.0.1");
    if (port_ < 0) throw std::runtime_error("fake server: cannot bind a port");
    server_.set_listen_backlog(1024);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

FakeOpenAIServer::~FakeOpenAIServer() {
    server_.stop();
    thread_.join();
}

std::vector<json> FakeOpenAIServer::requests() const {
    std::lock_guard lock(mutex_);
    return requests_;
}

int64_t FakeOpenAIServer::record_prompt(const json& body, const std::vector<std::string>& words, int64_t* arrival) {
    std::lock_guard lock(mutex_);
    int64_t best = 0;
    for (const auto& seen : prompts_) {
        const auto [a, b] = std::mismatch(words.begin(), words.end(), seen.begin(), seen.end());
        best = std::max<int64_t>(best, a - words.begin());
    }
    requests_.push_back(body);
    prompts_.push_back(words);
    *arrival = static_cast<int64_t>(requests_.size());
    return best;
}

void FakeOpenAIServer::handle_completion(bool chat, const httplib::Request& req, httplib::Response& res) {
    const json body = json::parse(req.body, nullptr, false);
    if (const std::string problem = body_problem(req.body, body, chat); !problem.empty()) {
        ++refused_;
        res.status = opts_.malformed_status;
        if (opts_.malformed_error_shape)
            res.set_content(error_json(problem), "application/json");
        else
            res.set_content(problem, "text/plain");
        return;
    }
    const bool stream = body["stream"].get<bool>();
    const bool valid = (!stream || body.value("stream_options", json::object()).value("include_usage", false)) &&
                       body["model"].get<std::string>() == kModel;
    if (!valid) {
        res.status = 400;
        res.set_content(error_json("need stream_options.include_usage with stream, and model " + std::string(kModel)),
                        "application/json");
        return;
    }
    const std::vector<std::string> words = split_words(prompt_text(chat, body));
    int64_t arrival = 0;  // 1-based
    const int64_t cached = record_prompt(body, words, &arrival);
    if (opts_.fail_every > 0 && arrival % opts_.fail_every == 0) {
        res.status = 500;
        res.set_content(error_json("injected failure"), "application/json");
        return;
    }
    const int num_tokens = body["max_tokens"].get<int>();
    const int64_t num_prompt = static_cast<int64_t>(words.size());
    if (!stream) {  // the same text and delays, as one body
        std::this_thread::sleep_for(std::chrono::milliseconds(opts_.ttft_ms + opts_.itl_ms * (num_tokens - 1)));
        std::string text;
        for (int t = 0; t < num_tokens; ++t) text += " w" + std::to_string(t);
        json choice = {{"index", 0}, {"finish_reason", "length"}};
        if (chat)
            choice["message"] = {{"role", "assistant"}, {"content", text}};
        else
            choice["text"] = text;
        const json out = {{"id", "fake-1"},
                          {"object", chat ? "chat.completion" : "text_completion"},
                          {"model", kModel},
                          {"choices", json::array({choice})},
                          {"usage",
                           {{"prompt_tokens", num_prompt},
                            {"completion_tokens", num_tokens},
                            {"total_tokens", num_prompt + num_tokens},
                            {"prompt_tokens_details", {{"cached_tokens", cached}}}}}};
        res.set_content(out.dump(), "application/json");
        return;
    }
    const int now = ++in_flight_;
    for (int m = max_in_flight_.load(); now > m && !max_in_flight_.compare_exchange_weak(m, now);) {
    }
    const FakeServerOptions o = opts_;
    res.set_chunked_content_provider(
        "text/event-stream", [this, o, chat, num_tokens, num_prompt, cached](size_t, httplib::DataSink& sink) {
            // The request stops counting as in flight before the stream's end is sent, so that a
            // client's next request (sent after this one ends) never overlaps it here.
            const auto leave = [this] {
                --in_flight_;
                ++cut_streams_;
                return false;
            };
            const auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
            json role = json::parse(text_event(chat, "", nullptr).substr(6));
            if (chat) role["choices"][0]["delta"] = {{"role", "assistant"}, {"content", ""}};
            if (!write("data: " + role.dump() + "\n\n")) return leave();
            std::this_thread::sleep_for(std::chrono::milliseconds(o.ttft_ms));
            for (int t = 0; t < num_tokens; ++t) {
                if (t > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.itl_ms));
                const std::string ev = text_event(chat, " w" + std::to_string(t), nullptr);
                const size_t cut = o.split_events ? ev.size() / 2 : ev.size();
                if (!write(ev.substr(0, cut))) return leave();
                if (cut < ev.size() && !write(ev.substr(cut))) return leave();
            }
            std::string tail = text_event(chat, "", "length");
            if (o.send_usage) {
                const json usage = {{"id", "fake-1"},
                                    {"choices", json::array()},
                                    {"usage",
                                     {{"prompt_tokens", num_prompt},
                                      {"completion_tokens", num_tokens},
                                      {"total_tokens", num_prompt + num_tokens},
                                      {"prompt_tokens_details", {{"cached_tokens", cached}}}}}};
                tail += "data: " + usage.dump() + "\n\n";
            }
            tail += "data: [DONE]\n\n";
            --in_flight_;
            if (!write(tail)) {
                ++cut_streams_;
                return false;
            }
            sink.done();
            return true;
        });
}

}  // namespace fanout::testing

#include "fake_openai_server.h"

#include <sys/socket.h>

#include <algorithm>
#include <chrono>
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

}  // namespace

void BacklogServer::set_listen_backlog(int backlog) {
    const int rc = ::listen(svr_sock_, backlog);
    if (rc != 0) throw std::runtime_error("listen() to raise the backlog failed");
}

FakeOpenAIServer::FakeOpenAIServer(FakeServerOptions opts) : opts_(opts) {
    const int num_threads = opts_.num_threads;
    server_.new_task_queue = [num_threads] { return new httplib::ThreadPool(num_threads); };
    server_.set_tcp_nodelay(true);
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
    const bool valid = !body.is_discarded() && body.value("stream", false) &&
                       body.value("stream_options", json::object()).value("include_usage", false) &&
                       body.value("model", std::string()) == kModel && body.value("max_tokens", 0) >= 1;
    if (!valid) {
        res.status = 400;
        res.set_content(error_json("need stream, stream_options.include_usage, model and max_tokens"),
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
            leave();
            if (!write(tail)) return false;
            sink.done();
            return true;
        });
}

}  // namespace fanout::testing

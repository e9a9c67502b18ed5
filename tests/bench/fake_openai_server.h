// A tiny OpenAI-compatible server for testing `fanout bench serve`: it generates nothing and
// streams `max_tokens` SSE chunks on a fixed timetable, so the benchmark's measurements can be
// checked against known delays. It is not a model server and checks only what the benchmark sends.
//
// Per streamed request: a role chunk with empty content at once (as vLLM sends), the first text
// chunk after `ttft_ms`, one more every `itl_ms`, then a finish chunk, a usage chunk with
// choices: [], and `data: [DONE]`. Usage counts prompt words as prompt tokens and reports as cached
// the longest word prefix the prompt shares with any earlier prompt (a perfect prefix cache).
// A request with "stream": false gets the same text as one JSON body after the same total delay.
// Bodies that are not valid JSON, hold a NUL byte, nest deeper than 64 levels, carry a field the
// benchmark never sends or a wrong type get `malformed_status` with OpenAI's error shape.
#pragma once

#include <httplib.h>

#include <atomic>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace fanout::testing {

struct FakeServerOptions {
    int ttft_ms = 20;                   // from the response headers to the first text chunk
    int itl_ms = 5;                     // between text chunks
    int fail_every = 0;                 // > 0: the k-th, 2k-th, ... request received gets HTTP 500
    bool send_usage = true;             // false: no usage chunk (the client must count chunks)
    bool split_events = true;           // write each text event in two pieces, cut inside the JSON
    int num_threads = 64;               // server workers: the most requests streamed at once
    int read_timeout_ms = 5000;         // a client silent this long while sending its request is dropped
    int malformed_status = 400;         // the answer to a malformed body
    bool malformed_error_shape = true;  // false: that answer is plain text, not {"error": {...}}
};

// httplib::Server with a listen backlog beyond the 5 that Debian's libcpp-httplib was compiled
// with (CPPHTTPLIB_LISTEN_BACKLOG): with 5, a burst of connects loses SYNs and the kernel's 1 s
// SYN retransmit shows up in the client's TTFT.
class BacklogServer : public httplib::Server {
  public:
    void set_listen_backlog(int backlog);  // after bind_to_any_port; Linux lets listen() run again
};

class FakeOpenAIServer {
  public:
    explicit FakeOpenAIServer(FakeServerOptions opts = {});
    ~FakeOpenAIServer();  // stops the server and joins its thread
    FakeOpenAIServer(const FakeOpenAIServer&) = delete;
    FakeOpenAIServer& operator=(const FakeOpenAIServer&) = delete;

    std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }
    static constexpr const char* kModel = "fake-model";

    // Bodies of the completion requests received, in arrival order.
    std::vector<nlohmann::json> requests() const;
    // The most requests that were streaming at the same time.
    int max_in_flight() const { return max_in_flight_.load(); }
    // Streams the client closed before their end (a write failed).
    int cut_streams() const { return cut_streams_.load(); }
    // Malformed bodies answered with malformed_status.
    int refused() const { return refused_.load(); }

  private:
    void handle_completion(bool chat, const httplib::Request& req, httplib::Response& res);
    // Records the request; returns the longest word prefix its prompt shares with an earlier one,
    // and in `arrival` its 1-based position among the requests received.
    int64_t record_prompt(const nlohmann::json& body, const std::vector<std::string>& words, int64_t* arrival);

    FakeServerOptions opts_;
    BacklogServer server_;
    std::thread thread_;
    int port_ = -1;
    mutable std::mutex mutex_;
    std::vector<nlohmann::json> requests_;           // guarded by mutex_
    std::vector<std::vector<std::string>> prompts_;  // guarded by mutex_: words of every prompt seen
    std::atomic<int> in_flight_{0}, max_in_flight_{0}, cut_streams_{0}, refused_{0};
};

}  // namespace fanout::testing

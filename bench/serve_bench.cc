// `fanout bench serve`: workload → one thread per in-flight request → SSE timing → report.
//
// The flow reads top to bottom: make_workload() builds every request up front from the seed (its
// kind too: streamed, plain, cancelled or malformed); run_serve_bench() releases them on a Poisson
// (or all-at-once) schedule, each on its own thread once a concurrency slot is free; send_one()
// sends one request through httplib and SseStream timestamps every chunk that carries text;
// summarize() and print_report() turn the per-request records into the table and the JSON. Slow
// clients and the server's /proc sampler (serve_soak.h) run beside the requests when asked for.
#include "serve_bench.h"

#include <fmt/format.h>
#include <httplib.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <semaphore>
#include <string_view>
#include <thread>
#include <vector>

#include "fanout/core/error.h"
#include "serve_soak.h"

namespace fanout::bench {
namespace {

using clock_type = std::chrono::steady_clock;
using nlohmann::json;

double seconds_between(clock_type::time_point a, clock_type::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}

// ---------------------------------------------------------------------------------------------
// Workload

// Common English words; prompts are drawn from them so that any tokenizer sees ordinary text at
// roughly one token per word.
constexpr const char* kWords[] = {
    "the",      "of",    "and",     "to",     "in",     "is",     "you",     "that",    "it",     "he",
    "was",      "for",   "on",      "are",    "as",     "with",   "his",     "they",    "at",     "be",
    "this",     "have",  "from",    "or",     "one",    "had",    "by",      "word",    "but",    "not",
    "what",     "all",   "were",    "we",     "when",   "your",   "can",     "said",    "there",  "use",
    "an",       "each",  "which",   "she",    "do",     "how",    "their",   "if",      "will",   "up",
    "other",    "about", "out",     "many",   "then",   "them",   "these",   "so",      "some",   "her",
    "would",    "make",  "like",    "him",    "into",   "time",   "has",     "look",    "two",    "more",
    "write",    "go",    "see",     "number", "no",     "way",    "could",   "people",  "my",     "than",
    "first",    "water", "been",    "call",   "who",    "oil",    "its",     "now",     "find",   "long",
    "down",     "day",   "did",     "get",    "come",   "made",   "may",     "part",    "over",   "new",
    "sound",    "take",  "only",    "little", "work",   "know",   "place",   "year",    "live",   "me",
    "back",     "give",  "most",    "very",   "after",  "thing",  "our",     "just",    "name",   "good",
    "sentence", "man",   "think",   "say",    "great",  "where",  "help",    "through", "much",   "before",
    "line",     "right", "too",     "mean",   "old",    "any",    "same",    "tell",    "boy",    "follow",
    "came",     "want",  "show",    "also",   "around", "form",   "three",   "small",   "set",    "put",
    "end",      "does",  "another", "well",   "large",  "must",   "big",     "even",    "such",   "because",
    "turn",     "here",  "why",     "ask",    "went",   "men",    "read",    "need",    "land",   "different",
    "home",     "us",    "move",    "try",    "kind",   "hand",   "picture", "again",   "change", "off",
    "play",     "spell", "air",     "away",   "animal", "house",  "point",   "page",    "letter", "mother",
    "answer",   "found", "study",   "still",  "learn",  "should", "world",   "high",    "every",  "near",
};
constexpr int kNumWords = sizeof(kWords) / sizeof(kWords[0]);

enum class Kind { kStreamed, kPlain, kCancelled, kMalformed };
constexpr int kNumKinds = 4;
constexpr const char* kKindNames[kNumKinds] = {"streamed", "plain", "cancelled", "malformed"};
const char* name_of(Kind k) { return kKindNames[static_cast<int>(k)]; }

std::array<double, kNumKinds> weights_of(const RequestMix& m) {
    return {m.streamed, m.plain, m.cancelled, m.malformed};
}

// The bad bodies a malformed request sends, in turn.
constexpr const char* kMalformedVariants[] = {"invalid_json", "wrong_type", "unknown_field", "deep_nesting",
                                              "nul_byte"};
constexpr int kNumMalformedVariants = sizeof(kMalformedVariants) / sizeof(kMalformedVariants[0]);

struct RequestSpec {
    std::string prompt;  // the user message (chat) or the prompt (completions)
    int prompt_words = 0;
    int max_tokens = 0;
    int group = -1;  // shared-prefix group, -1 when none
    Kind kind = Kind::kStreamed;
    int variant = -1;  // malformed: index into kMalformedVariants
};

// Appends `num_words` pseudo-random words: sentences of 5 to 16 words, capitalized, with a period.
void append_words(std::mt19937_64& rng, int num_words, std::string& out) {
    int left_in_sentence = 0;
    for (int w = 0; w < num_words; ++w) {
        std::string word = kWords[rng() % kNumWords];
        if (left_in_sentence == 0) {
            left_in_sentence = 5 + static_cast<int>(rng() % 12);
            word[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(word[0])));
        }
        if (!out.empty()) out += ' ';
        out += word;
        if (--left_in_sentence == 0 || w + 1 == num_words) out += '.';
    }
}

int uniform_len(std::mt19937_64& rng, int len, int range) {
    const int lo = std::max(1, len - range), hi = std::max(lo, len + range);
    return std::uniform_int_distribution<int>(lo, hi)(rng);
}

// The kind of each request: counts in proportion to the weights (largest remainder), shuffled
// by their own generator so that the prompts do not depend on the mix.
std::vector<Kind> assign_kinds(const RequestMix& mix, int n, uint64_t seed) {
    if (mix.only_streamed()) return std::vector<Kind>(n, Kind::kStreamed);
    const auto w = weights_of(mix);
    double sum = 0;
    for (double x : w) sum += x;
    std::array<int64_t, kNumKinds> count{};
    std::array<double, kNumKinds> frac{};
    int64_t given = 0;
    for (int k = 0; k < kNumKinds; ++k) {
        const double exact = static_cast<double>(n) * w[k] / sum;
        count[k] = static_cast<int64_t>(std::floor(exact));
        frac[k] = w[k] > 0 ? exact - static_cast<double>(count[k]) : -1;
        given += count[k];
    }
    for (; given < n; ++given) {
        const int k = static_cast<int>(std::max_element(frac.begin(), frac.end()) - frac.begin());
        ++count[k];
        frac[k] = -1;
    }
    std::vector<Kind> kinds;
    for (int k = 0; k < kNumKinds; ++k) kinds.insert(kinds.end(), count[k], static_cast<Kind>(k));
    std::mt19937_64 rng(seed ^ 0x6a09e667f3bcc909ULL);
    std::shuffle(kinds.begin(), kinds.end(), rng);
    return kinds;
}

// Every request, decided up front from the seed alone (independent of rate and concurrency).
std::vector<RequestSpec> make_workload(const ServeBenchOptions& o) {
    std::mt19937_64 rng(o.seed);
    std::vector<std::string> prefixes(o.prefix_groups);
    for (auto& p : prefixes) append_words(rng, o.prefix_len, p);
    std::vector<RequestSpec> specs(o.num_requests);
    for (int i = 0; i < o.num_requests; ++i) {
        RequestSpec& s = specs[i];
        const bool opening = o.turns > 1 && i % o.turns == 0 && o.first_turn_len > 0;
        const int unique_words = uniform_len(rng, opening ? o.first_turn_len : o.prompt_len, o.prompt_len_range);
        s.max_tokens = uniform_len(rng, o.output_len, o.output_len_range);
        if (o.turns > 1 && i % o.turns > 0) {  // a later turn: the previous prompt and new words
            s.group = specs[i - 1].group;
            s.prompt = specs[i - 1].prompt;
            s.prompt_words = specs[i - 1].prompt_words;
        } else if (o.prefix_groups > 0) {
            s.group = (o.turns > 1 ? i / o.turns : i) % o.prefix_groups;
            s.prompt = prefixes[s.group];
            s.prompt_words = o.prefix_len;
        }
        append_words(rng, unique_words, s.prompt);
        s.prompt_words += unique_words;
    }
    const std::vector<Kind> kinds = assign_kinds(o.mix, o.num_requests, o.seed);
    int num_malformed = 0;
    for (int i = 0; i < o.num_requests; ++i) {
        specs[i].kind = kinds[i];
        if (kinds[i] == Kind::kMalformed) specs[i].variant = num_malformed++ % kNumMalformedVariants;
    }
    return specs;
}

json request_body(const ServeBenchOptions& o, const std::string& model, const RequestSpec& s, bool stream = true) {
    json body = {{"model", model}, {"max_tokens", s.max_tokens}, {"temperature", 0.0}, {"stream", stream}};
    if (stream) body["stream_options"] = {{"include_usage", true}};
    if (o.endpoint == "chat")
        body["messages"] = json::array({{{"role", "user"}, {"content", s.prompt}}});
    else
        body["prompt"] = s.prompt;
    if (o.ignore_eos) body["ignore_eos"] = true;
    return body;
}

// A streamed request's body spoiled one way: every OpenAI-compatible server must refuse it with a 4xx.
std::string malformed_body(const ServeBenchOptions& o, const std::string& model, const RequestSpec& s) {
    json body = request_body(o, model, s);
    const std::string field = o.endpoint == "chat" ? "messages" : "prompt";
    std::string text;
    switch (s.variant) {
        case 0:  // invalid JSON: cut in the middle
            text = body.dump();
            return text.substr(0, text.size() / 2);
        case 1:  // a wrong type: max_tokens as a string
            body["max_tokens"] = std::to_string(s.max_tokens);
            return body.dump();
        case 2:  // a field no API has
            body["frobnicate"] = true;
            return body.dump();
        case 3:  // the prompt field nested 10,000 arrays deep
            body.erase(field);
            text = body.dump();
            text.pop_back();
            return text + ",\"" + field + "\":" + std::string(10000, '[') + std::string(10000, ']') + "}";
        default: {  // a raw NUL byte inside the prompt string
            text = body.dump();
            const size_t at = text.find(json(s.prompt).dump());
            text.insert(at == std::string::npos ? text.size() / 2 : at + 2, 1, '\0');
            return text;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One request

struct Target {
    std::string origin;  // "http://host:port", what httplib::Client takes
    std::string prefix;  // path prefix before /v1/..., "" or "/something"
};

// "http://h:p", "http://h:p/", "http://h:p/v1" (OpenAI SDK style) and "http://h:p/proxy" all work.
Target parse_base_url(const std::string& url) {
    constexpr std::string_view kScheme = "http://";
    FANOUT_CHECK(url.starts_with(kScheme) && url.size() > kScheme.size(),
                 "base_url '{}' must look like http://host:port (https is not supported)", url);
    const size_t slash = url.find('/', kScheme.size());
    Target t{url.substr(0, slash), slash == std::string::npos ? "" : url.substr(slash)};
    while (!t.prefix.empty() && t.prefix.back() == '/') t.prefix.pop_back();
    if (t.prefix.ends_with("/v1")) t.prefix.resize(t.prefix.size() - 3);
    return t;
}

struct RequestResult {
    Kind kind = Kind::kStreamed;
    bool ok = false;
    int status = 0;  // HTTP status, 0 when no response head came
    std::string error;
    double start_s = 0;           // send time, from the benchmark start
    double end_s = 0;             // last byte, from the benchmark start
    double latency_s = 0;         // end_s - start_s
    std::vector<double> chunk_s;  // arrival of each chunk that carried text, from the send time
    int64_t prompt_tokens = -1, completion_tokens = -1, cached_tokens = -1;  // -1: not in usage
    int64_t accepted_predictions = -1, rejected_predictions = -1;            // MTP drafts (-1: not in usage)
    double ttft_s() const { return chunk_s.empty() ? 0 : chunk_s.front(); }
    // Seconds per output token after the first; < 0 when there is at most one token.
    double tpot_s() const {
        const int64_t n = output_tokens();
        return n > 1 ? (latency_s - ttft_s()) / static_cast<double>(n - 1) : -1;
    }
    int64_t output_tokens() const {
        return completion_tokens >= 0 ? completion_tokens : static_cast<int64_t>(chunk_s.size());
    }
};

// The token counts of a `usage` object.
void read_usage(const json& u, RequestResult& r) {
    const auto count = [](const json& obj, const char* key) -> int64_t {
        const auto it = obj.find(key);
        return it != obj.end() && it->is_number_integer() ? it->get<int64_t>() : -1;
    };
    r.prompt_tokens = count(u, "prompt_tokens");
    r.completion_tokens = count(u, "completion_tokens");
    if (const auto d = u.find("prompt_tokens_details"); d != u.end() && d->is_object()) {
        r.cached_tokens = count(*d, "cached_tokens");
    }
    if (const auto d = u.find("completion_tokens_details"); d != u.end() && d->is_object()) {
        r.accepted_predictions = count(*d, "accepted_prediction_tokens");
        r.rejected_predictions = count(*d, "rejected_prediction_tokens");
    }
}

// Incremental parser of an OpenAI streaming response. Line-based, like vLLM's benchmark: each
// `data:` line holds one JSON chunk; `data: [DONE]` ends the stream; comments, `event:` and blank
// lines are skipped. Bytes may arrive split anywhere, including inside a line.
class SseStream {
  public:
    SseStream(bool chat, RequestResult& r) : chat_(chat), r_(r) {}

    // Consumes bytes received `t_s` seconds after the send. False (with error() set) on bad data.
    bool feed(const char* data, size_t n, double t_s) {
        if (head_.size() < 200) head_.append(data, std::min(n, 200 - head_.size()));
        buf_.append(data, n);
        size_t begin = 0;
        for (size_t nl; (nl = buf_.find('\n', begin)) != std::string::npos; begin = nl + 1) {
            if (!on_line(std::string_view(buf_).substr(begin, nl - begin), t_s)) return false;
        }
        buf_.erase(0, begin);
        return true;
    }

    // After the last byte: a line without its newline still counts.
    bool finish(double t_s) {
        if (!buf_.empty() && !on_line(buf_, t_s)) return false;
        buf_.clear();
        if (!done_) error_ = fmt::format("stream ended without 'data: [DONE]' (response began: {:?})", head_);
        return done_;
    }

    const std::string& error() const { return error_; }

  private:
    bool on_line(std::string_view line, double t_s) {
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (done_ || !line.starts_with("data:")) return true;
        line.remove_prefix(5);
        while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
        if (line == "[DONE]") {
            done_ = true;
            return true;
        }
        const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (j.is_discarded() || !j.is_object()) {
            error_ = fmt::format("bad SSE data: {:?}", line.substr(0, 200));
            return false;
        }
        if (j.contains("error")) {
            error_ = fmt::format("error in stream: {}", j["error"].dump().substr(0, 300));
            return false;
        }
        if (const auto u = j.find("usage"); u != j.end() && u->is_object()) read_usage(*u, r_);
        if (const auto c = j.find("choices"); c != j.end() && c->is_array() && !c->empty()) {
            if (!text_of((*c)[0]).empty()) r_.chunk_s.push_back(t_s);
        }
        return true;
    }

    // The text a choice adds: delta.content (and delta.reasoning_content, which reasoning models
    // stream first) for chat, text for completions. Null or absent fields add nothing.
    std::string text_of(const json& choice) const {
        const auto str = [](const json& obj, const char* key) {
            const auto it = obj.find(key);
            return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
        };
        if (!chat_) return str(choice, "text");
        const auto d = choice.find("delta");
        if (d == choice.end() || !d->is_object()) return {};
        return str(*d, "content") + str(*d, "reasoning_content");
    }

    bool chat_;
    RequestResult& r_;
    std::string buf_;   // bytes after the last complete line
    std::string head_;  // the first 200 bytes, for error messages
    std::string error_;
    bool done_ = false;
};

// A plain (stream: false) response: "" when it carries a choice with text, else what is wrong.
std::string read_plain_response(bool chat, const std::string& body, RequestResult& r) {
    const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return fmt::format("bad JSON response: {:?}", body.substr(0, 200));
    if (j.contains("error")) return fmt::format("error in response: {}", j["error"].dump().substr(0, 300));
    if (const auto u = j.find("usage"); u != j.end() && u->is_object()) read_usage(*u, r);
    const auto c = j.find("choices");
    if (c == j.end() || !c->is_array() || c->empty() || !(*c)[0].is_object())
        return fmt::format("response has no choices: {:?}", body.substr(0, 200));
    const json& choice = (*c)[0];
    const json* holder = &choice;
    if (chat) {
        const auto m = choice.find("message");
        if (m == choice.end() || !m->is_object()) return "response has no choices[0].message";
        holder = &*m;
    }
    const char* key = chat ? "content" : "text";
    const auto t = holder->find(key);
    const bool has_text = t != holder->end() && t->is_string() && !t->get_ref<const std::string&>().empty();
    if (!has_text && r.completion_tokens <= 0) return fmt::format("response carried no text in '{}'", key);
    return "";
}

// A malformed request's answer: "" when it is a 4xx with OpenAI's error shape, else what is wrong.
std::string check_refusal(int status, const std::string& body, const std::string& transport_error) {
    if (status == 0) return fmt::format("no response: {}", transport_error);
    if (status < 400 || status >= 500)
        return fmt::format("expected a 4xx refusal, got HTTP {}: {:?}", status, body.substr(0, 300));
    const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    const auto is_string = [](const json& obj, const char* key) {
        const auto it = obj.find(key);
        return it != obj.end() && it->is_string();
    };
    const bool shaped = !j.is_discarded() && j.is_object() && j.contains("error") && j["error"].is_object() &&
                        is_string(j["error"], "message") && is_string(j["error"], "type");
    if (!shaped)
        return fmt::format("HTTP {} without OpenAI's error shape {{\"error\": {{\"message\", \"type\"}}}}: {:?}",
                           status, body.substr(0, 300));
    return "";
}

// Sends one request of any kind; never throws. Times are measured from `bench_start`.
RequestResult send_one(const Target& target, const std::string& path, const std::string& body, Kind kind, bool chat,
                       double timeout_s, clock_type::time_point bench_start) {
    RequestResult r;
    r.kind = kind;
    httplib::Client cli(target.origin);
    const auto timeout_us = std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6));
    cli.set_connection_timeout(timeout_us);
    cli.set_read_timeout(timeout_us);
    cli.set_write_timeout(timeout_us);
    cli.set_tcp_nodelay(true);

    const bool streamed = kind == Kind::kStreamed || kind == Kind::kCancelled;
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body;
    // NOTE: identity said outright (httplib sends no Accept-Encoding): a server or proxy that
    // compressed the stream would hold chunks back in its encoder and blur every timestamp.
    req.headers = {{"Content-Type", "application/json"},
                   {"Accept", streamed ? "text/event-stream" : "application/json"},
                   {"Accept-Encoding", "identity"}};
    int status = 0;
    std::string whole;  // a plain or malformed request's response, or an error page (capped)
    constexpr size_t kMaxWhole = 4u << 20;
    bool timed_out = false, hung_up = false;
    SseStream sse(chat, r);
    // NOTE: httplib hands the body of *every* status to content_receiver (res.body stays empty),
    // so the status captured by response_handler decides whether bytes are SSE or a whole body.
    req.response_handler = [&](const httplib::Response& res) {
        status = res.status;
        return true;
    };
    const auto t0 = clock_type::now();
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
        const double t_s = seconds_between(t0, clock_type::now());
        if (t_s > timeout_s) {
            timed_out = true;
            return false;
        }
        if (!streamed || status != 200) {
            if (whole.size() < kMaxWhole) whole.append(data, std::min(n, kMaxWhole - whole.size()));
            return true;
        }
        if (!sse.feed(data, n, t_s)) return false;
        if (kind == Kind::kCancelled && !r.chunk_s.empty()) {
            hung_up = true;  // the client walks away after its first text: httplib closes the socket
            return false;
        }
        return true;
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    const bool sent = cli.send(req, res, err);
    const auto t1 = clock_type::now();
    r.status = status;
    r.start_s = seconds_between(bench_start, t0);
    r.end_s = seconds_between(bench_start, t1);
    r.latency_s = seconds_between(t0, t1);

    if (timed_out || (!sent && r.latency_s >= timeout_s * 0.99)) {
        r.error = fmt::format("timeout after {:.3g} s", timeout_s);
    } else if (kind == Kind::kMalformed) {
        r.error = check_refusal(status, whole, sent ? std::string() : httplib::to_string(err));
        r.ok = r.error.empty();
    } else if (status != 0 && status != 200) {
        r.error = fmt::format("HTTP {}: {}", status, whole.substr(0, 300));
    } else if (hung_up) {
        r.ok = true;  // cancelled after its first text chunk, as intended
    } else if (!sent) {
        r.error = sse.error().empty() ? fmt::format("request failed: {}", httplib::to_string(err)) : sse.error();
    } else if (kind == Kind::kPlain) {
        r.error = read_plain_response(chat, whole, r);
        r.ok = r.error.empty();
    } else if (!sse.finish(r.latency_s)) {
        r.error = sse.error();
    } else if (r.chunk_s.empty()) {
        r.error = "stream carried no text";
    } else {
        r.ok = true;
    }
    return r;
}

// GET /v1/models and take the first id; its timeout is timeout_s kept within [10, 60] s.
std::string discover_model(const Target& target, double timeout_s) {
    httplib::Client cli(target.origin);
    const auto timeout_us = std::chrono::microseconds(static_cast<int64_t>(std::clamp(timeout_s, 10.0, 60.0) * 1e6));
    cli.set_connection_timeout(timeout_us);
    cli.set_read_timeout(timeout_us);
    const std::string path = target.prefix + "/v1/models";
    const auto res = cli.Get(path);
    FANOUT_CHECK(res, "GET {}{} failed: {}; is the server up?", target.origin, path, httplib::to_string(res.error()));
    FANOUT_CHECK(res->status == 200, "GET {}{}: HTTP {}: {}", target.origin, path, res->status,
                 res->body.substr(0, 300));
    const json j = json::parse(res->body, nullptr, false);
    FANOUT_CHECK(!j.is_discarded() && j.contains("data") && j["data"].is_array() && !j["data"].empty() &&
                     j["data"][0].contains("id") && j["data"][0]["id"].is_string(),
                 "GET {}{} lists no model: {}", target.origin, path, res->body.substr(0, 300));
    return j["data"][0]["id"].get<std::string>();
}

// ---------------------------------------------------------------------------------------------
// Report

struct Dist {
    double mean = 0, p50 = 0, p90 = 0, p99 = 0;
    size_t count = 0;
};

// Linear interpolation between closest ranks (numpy's default), in milliseconds.
Dist distribution_ms(std::vector<double> v_s) {
    Dist d;
    d.count = v_s.size();
    if (v_s.empty()) return d;
    std::sort(v_s.begin(), v_s.end());
    const auto pct = [&](double q) {
        const double pos = q / 100.0 * static_cast<double>(v_s.size() - 1);
        const size_t lo = static_cast<size_t>(pos), hi = std::min(lo + 1, v_s.size() - 1);
        return 1e3 * (v_s[lo] + (pos - static_cast<double>(lo)) * (v_s[hi] - v_s[lo]));
    };
    double sum = 0;
    for (double x : v_s) sum += x;
    d.mean = 1e3 * sum / static_cast<double>(v_s.size());
    d.p50 = pct(50);
    d.p90 = pct(90);
    d.p99 = pct(99);
    return d;
}

json to_json(const Dist& d) {
    return {{"mean", d.mean}, {"p50", d.p50}, {"p90", d.p90}, {"p99", d.p99}, {"count", d.count}};
}

std::string mix_string(const RequestMix& m) {
    const auto w = weights_of(m);
    std::string out;
    for (int k = 0; k < kNumKinds; ++k) {
        if (w[k] <= 0) continue;
        out += fmt::format("{}{}={:g}", out.empty() ? "" : ",", kKindNames[k], w[k]);
    }
    return out;
}

json to_json(const ServeBenchOptions& o) {
    return {{"base_url", o.base_url},
            {"model", o.model},
            {"endpoint", o.endpoint},
            {"num_requests", o.num_requests},
            {"request_rate", o.request_rate},
            {"max_concurrency", o.max_concurrency},
            {"prompt_len", o.prompt_len},
            {"prompt_len_range", o.prompt_len_range},
            {"output_len", o.output_len},
            {"output_len_range", o.output_len_range},
            {"prefix_groups", o.prefix_groups},
            {"turns", o.turns},
            {"first_turn_len", o.first_turn_len},
            {"kv_block_size", o.kv_block_size},
            {"prefix_len", o.prefix_len},
            {"slo_ttft_ms", o.slo_ttft_ms},
            {"slo_tpot_ms", o.slo_tpot_ms},
            {"seed", o.seed},
            {"ignore_eos", o.ignore_eos},
            {"timeout_s", o.timeout_s},
            {"mix", mix_string(o.mix)},
            {"slow_clients", o.slow_clients},
            {"slow_client_interval_s", o.slow_client_interval_s},
            {"server_pid", o.server_pid},
            {"sample_interval_s", o.sample_interval_s}};
}

json to_json(const RequestResult& r, const RequestSpec& s) {
    json j = {{"ok", r.ok},
              {"kind", name_of(s.kind)},
              {"start_ms", 1e3 * r.start_s},
              {"e2e_ms", 1e3 * r.latency_s},
              {"prompt_words", s.prompt_words},
              {"max_tokens", s.max_tokens},
              {"prompt_tokens", r.prompt_tokens},
              {"completion_tokens", r.completion_tokens},
              {"cached_tokens", r.cached_tokens},
              {"text_chunks", r.chunk_s.size()}};
    if (r.accepted_predictions >= 0) {
        j["accepted_prediction_tokens"] = r.accepted_predictions;
        j["rejected_prediction_tokens"] = r.rejected_predictions;
    }
    if (s.group >= 0) j["prefix_group"] = s.group;
    if (s.kind != Kind::kStreamed) j["status"] = r.status;
    if (s.kind == Kind::kMalformed) j["variant"] = kMalformedVariants[s.variant];
    if (r.ok) {
        if (!r.chunk_s.empty()) j["ttft_ms"] = 1e3 * r.ttft_s();
        if (s.kind == Kind::kStreamed && r.tpot_s() >= 0) j["tpot_ms"] = 1e3 * r.tpot_s();
    } else {
        j["error"] = r.error;
    }
    return j;
}

// Counts, failures and latencies per kind of request (only with a mix).
json summarize_kinds(const ServeBenchOptions& o, const std::vector<RequestSpec>& specs,
                     const std::vector<RequestResult>& results) {
    json out = json::object();
    const auto w = weights_of(o.mix);
    for (int k = 0; k < kNumKinds; ++k) {
        const Kind kind = static_cast<Kind>(k);
        if (w[k] <= 0) continue;
        int64_t count = 0, ok = 0;
        std::vector<double> ttft, tpot, e2e;
        const RequestResult* first_failure = nullptr;
        std::vector<int64_t> variant_count(kNumMalformedVariants), variant_failed(kNumMalformedVariants);
        std::map<std::string, int64_t> statuses;
        for (size_t i = 0; i < results.size(); ++i) {
            const RequestResult& r = results[i];
            if (r.kind != kind) continue;
            ++count;
            if (kind == Kind::kMalformed) {
                ++variant_count[specs[i].variant];
                variant_failed[specs[i].variant] += !r.ok;
                ++statuses[std::to_string(r.status)];
            }
            if (!r.ok) {
                if (first_failure == nullptr || r.end_s < first_failure->end_s) first_failure = &r;
                continue;
            }
            ++ok;
            e2e.push_back(r.latency_s);
            if (!r.chunk_s.empty()) ttft.push_back(r.ttft_s());
            if (kind == Kind::kStreamed && r.tpot_s() >= 0) tpot.push_back(r.tpot_s());
        }
        json j = {{"count", count},
                  {"ok", ok},
                  {"failed", count - ok},
                  {"first_error", first_failure ? first_failure->error : ""},
                  {"e2e_ms", to_json(distribution_ms(e2e))}};
        if (kind == Kind::kStreamed || kind == Kind::kCancelled) j["ttft_ms"] = to_json(distribution_ms(ttft));
        if (kind == Kind::kStreamed) j["tpot_ms"] = to_json(distribution_ms(tpot));
        if (kind == Kind::kMalformed) {
            j["variants"] = json::object();
            for (int v = 0; v < kNumMalformedVariants; ++v)
                j["variants"][kMalformedVariants[v]] = {{"count", variant_count[v]}, {"failed", variant_failed[v]}};
            j["statuses"] = statuses;
        }
        out[kKindNames[k]] = j;
    }
    return out;
}

// Everything the table and the JSON show, from the per-request records. The latencies, tokens and
// goodput are those of the normal requests: TTFT, TPOT, ITL and E2E of the streamed ones, tokens of
// streamed and plain ones (a plain request meets the SLO when its E2E meets the TTFT bound);
// requests_ok / requests_failed count every kind.
json summarize(const ServeBenchOptions& o, const std::vector<RequestSpec>& specs,
               const std::vector<RequestResult>& results) {
    std::vector<double> ttft, tpot, itl, e2e;
    int64_t num_ok = 0, num_normal_ok = 0, prompt_tokens = 0, output_tokens = 0, cached_tokens = 0,
            num_cached_reported = 0, num_usage_missing = 0, num_good = 0;
    int64_t drafts = 0, accepted_drafts = 0, num_drafting = 0;  // MTP, from usage.completion_tokens_details
    std::vector<double> accepted_length;  // per drafting request: tokens per step, completion / (completion - accepted)
    double duration_s = 0;
    const RequestResult* first_failure = nullptr;
    for (const RequestResult& r : results) {
        duration_s = std::max(duration_s, r.end_s);
        if (!r.ok) {
            if (first_failure == nullptr || r.end_s < first_failure->end_s) first_failure = &r;
            continue;
        }
        ++num_ok;
        if (r.kind != Kind::kStreamed && r.kind != Kind::kPlain) continue;
        ++num_normal_ok;
        output_tokens += r.output_tokens();
        prompt_tokens += std::max<int64_t>(0, r.prompt_tokens);
        num_usage_missing += r.completion_tokens < 0;
        if (r.cached_tokens >= 0) {
            cached_tokens += r.cached_tokens;
            ++num_cached_reported;
        }
        if (r.accepted_predictions >= 0 && r.rejected_predictions >= 0) {
            drafts += r.accepted_predictions + r.rejected_predictions;
            accepted_drafts += r.accepted_predictions;
            ++num_drafting;
            if (r.completion_tokens > r.accepted_predictions)
                accepted_length.push_back(static_cast<double>(r.completion_tokens) /
                                          static_cast<double>(r.completion_tokens - r.accepted_predictions));
        }
        if (r.kind == Kind::kPlain) {
            num_good += o.slo_ttft_ms <= 0 || 1e3 * r.latency_s <= o.slo_ttft_ms;
            continue;
        }
        ttft.push_back(r.ttft_s());
        e2e.push_back(r.latency_s);
        if (r.tpot_s() >= 0) tpot.push_back(r.tpot_s());
        for (size_t k = 1; k < r.chunk_s.size(); ++k) itl.push_back(r.chunk_s[k] - r.chunk_s[k - 1]);
        const bool ttft_met = o.slo_ttft_ms <= 0 || 1e3 * r.ttft_s() <= o.slo_ttft_ms;
        const bool tpot_met = o.slo_tpot_ms <= 0 || r.tpot_s() < 0 || 1e3 * r.tpot_s() <= o.slo_tpot_ms;
        num_good += ttft_met && tpot_met;
    }
    const double per_s = duration_s > 0 ? 1.0 / duration_s : 0.0;
    json j;
    j["benchmark"] = "serve";
    j["options"] = to_json(o);
    j["requests_ok"] = num_ok;
    j["requests_failed"] = static_cast<int64_t>(results.size()) - num_ok;
    j["first_error"] = first_failure ? first_failure->error : "";
    j["duration_s"] = duration_s;
    j["request_throughput"] = num_ok * per_s;
    j["output_throughput"] = output_tokens * per_s;
    j["total_token_throughput"] = (prompt_tokens + output_tokens) * per_s;
    j["total_prompt_tokens"] = prompt_tokens;
    j["total_output_tokens"] = output_tokens;
    j["requests_without_usage"] = num_usage_missing;
    j["goodput"] = num_good * per_s;
    j["requests_meeting_slo"] = num_good;
    j["mean_cached_tokens"] = num_normal_ok > 0 ? static_cast<double>(cached_tokens) / num_normal_ok : 0.0;
    j["cached_tokens_reported"] = num_cached_reported;
    j["cache_hit_rate"] = prompt_tokens > 0 ? static_cast<double>(cached_tokens) / prompt_tokens : 0.0;
    if (num_drafting > 0) {  // MTP: drafts checked and accepted, and tokens per step, over the requests
        j["mtp_draft_tokens"] = drafts;
        j["mtp_accepted_tokens"] = accepted_drafts;
        j["mtp_acceptance_rate"] = drafts > 0 ? static_cast<double>(accepted_drafts) / drafts : 0.0;
        double mean = 0;
        for (double l : accepted_length) mean += l / static_cast<double>(accepted_length.size());
        j["mtp_mean_accepted_length"] = mean;
    }
    if (o.turns > 1) {
        // The best any placement could do: each later turn reusing its conversation's previous
        // prompt, whole blocks of it (the engine caches whole blocks).
        int64_t best = 0;
        for (size_t i = 0; i < results.size(); ++i)
            if (i % static_cast<size_t>(o.turns) > 0 && results[i].ok && results[i - 1].ok)
                best += std::max<int64_t>(0, results[i - 1].prompt_tokens) / o.kv_block_size * o.kv_block_size;
        j["best_cache_hit_rate"] = prompt_tokens > 0 ? static_cast<double>(best) / prompt_tokens : 0.0;
    }
    j["ttft_ms"] = to_json(distribution_ms(ttft));
    j["tpot_ms"] = to_json(distribution_ms(tpot));
    j["itl_ms"] = to_json(distribution_ms(itl));
    j["e2e_ms"] = to_json(distribution_ms(e2e));
    if (!o.mix.only_streamed()) j["by_kind"] = summarize_kinds(o, specs, results);
    j["requests"] = json::array();
    for (size_t i = 0; i < results.size(); ++i) j["requests"].push_back(to_json(results[i], specs[i]));
    return j;
}

// The per-kind table, in the order of kKindNames (the JSON object is sorted by name).
void print_kinds(const json& kinds) {
    fmt::print("{:<10} {:>6} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}\n", "by kind", "count", "failed", "TTFT p50",
               "p90", "p99", "E2E p50", "p90", "p99");
    const auto cells = [](const json& kind, const char* key) {
        if (!kind.contains(key) || kind[key]["count"].get<int64_t>() == 0)
            return fmt::format("{:>9} {:>9} {:>9}", "-", "-", "-");
        const json& d = kind[key];
        return fmt::format("{:>9.2f} {:>9.2f} {:>9.2f}", d["p50"].get<double>(), d["p90"].get<double>(),
                           d["p99"].get<double>());
    };
    for (const char* name : kKindNames) {
        if (!kinds.contains(name)) continue;
        const json& kind = kinds[name];
        fmt::print("{:<10} {:>6} {:>6} {} {}\n", name, kind["count"].get<int64_t>(), kind["failed"].get<int64_t>(),
                   cells(kind, "ttft_ms"), cells(kind, "e2e_ms"));
    }
    for (const char* name : kKindNames) {
        if (kinds.contains(name) && kinds[name]["failed"].get<int64_t>() > 0)
            fmt::print("{:<24} {}\n", fmt::format("first error, {}", name),
                       kinds[name]["first_error"].get<std::string>());
    }
    if (kinds.contains("malformed")) {
        std::string line;
        for (const char* variant : kMalformedVariants) {
            const json& v = kinds["malformed"]["variants"][variant];
            line += fmt::format("{}{} {}/{}", line.empty() ? "" : ", ", variant,
                                v["count"].get<int64_t>() - v["failed"].get<int64_t>(), v["count"].get<int64_t>());
        }
        std::string statuses;
        for (const auto& [status, n] : kinds["malformed"]["statuses"].items())
            statuses += fmt::format("{}{} x{}", statuses.empty() ? "" : ", ", status, n.get<int64_t>());
        fmt::print("{:<24} refused properly / sent: {}; HTTP {}\n", "malformed", line, statuses);
    }
}

void print_soak(const json& j) {
    if (j.contains("slow_clients")) {
        const json& s = j["slow_clients"];
        fmt::print(
            "{:<24} {}: {:.1f} open on average (min {}, max {}), {} reconnects after {} drops ({} answered), "
            "{} connect failures\n",
            "slow clients", s["clients"].get<int>(), s["mean_open"].get<double>(), s["min_open"].get<int>(),
            s["max_open"].get<int>(), s["reconnects"].get<int64_t>(), s["drops"].get<int64_t>(),
            s["responses"].get<int64_t>(), s["connect_failures"].get<int64_t>());
    }
    if (j.contains("server_process")) {
        const json& p = j["server_process"];
        if (p["exited_during_run"].get<bool>())
            fmt::print("{:<24} the server process {} went away during the run\n", "warning", p["pid"].get<int>());
        if (!p.contains("first")) return;
        const auto row = [&](const char* label, const char* key, double scale, int decimals) {
            const auto v = [&](const json& s) {
                return fmt::format("{:.{}f}", s[key].get<double>() * scale, decimals);
            };
            fmt::print("{:<24} {} / {} / {} / {}\n", label, v(p["first"]), v(p["after_warmup"]), v(p["last"]),
                       v(p["max"]));
        };
        fmt::print("{:<24} first / after warm-up ({} requests done) / last / max, {} samples\n",
                   fmt::format("server pid {}", p["pid"].get<int>()), p["after_warmup"]["requests_done"].get<int64_t>(),
                   p["num_samples"].get<int64_t>());
        row("  RSS MiB", "rss_kb", 1.0 / 1024, 1);
        row("  threads", "threads", 1, 0);
        row("  open fds", "fds", 1, 0);
    }
}

void print_report(const ServeBenchOptions& o, const json& j) {
    const auto num = [&](const char* key) { return j[key].get<double>(); };
    const auto slo = [&] {
        if (o.slo_ttft_ms <= 0 && o.slo_tpot_ms <= 0) return std::string("no SLO set: all ok requests");
        std::string s = "SLO";
        if (o.slo_ttft_ms > 0) s += fmt::format(" TTFT<={:g}ms", o.slo_ttft_ms);
        if (o.slo_tpot_ms > 0) s += fmt::format(" TPOT<={:g}ms", o.slo_tpot_ms);
        return s;
    };
    fmt::print("{:<24} {} / {}\n", "requests ok / failed", j["requests_ok"].get<int64_t>(),
               j["requests_failed"].get<int64_t>());
    if (j["requests_failed"].get<int64_t>() > 0)
        fmt::print("{:<24} {}\n", "first error", j["first_error"].get<std::string>());
    fmt::print("{:<24} {:.2f} s\n", "duration", num("duration_s"));
    fmt::print("{:<24} {:.2f} req/s\n", "request throughput", num("request_throughput"));
    fmt::print("{:<24} {:.1f} tok/s ({} tokens)\n", "output throughput", num("output_throughput"),
               j["total_output_tokens"].get<int64_t>());
    fmt::print("{:<24} {:.1f} tok/s ({} prompt tokens)\n", "total throughput", num("total_token_throughput"),
               j["total_prompt_tokens"].get<int64_t>());
    fmt::print("{:<24} {:.2f} req/s ({})\n", "goodput", num("goodput"), slo());
    if (j["cached_tokens_reported"].get<int64_t>() > 0) {
        fmt::print("{:<24} {:.1f} ({:.1f}% of prompt tokens)\n", "cached prompt tok/req", num("mean_cached_tokens"),
                   100 * num("cache_hit_rate"));
        if (j.contains("best_cache_hit_rate"))
            fmt::print("{:<24} {:.1f}% (every turn reusing its conversation's previous prompt)\n", "best hit rate",
                       100 * num("best_cache_hit_rate"));
    } else {
        fmt::print("{:<24} not reported by the server\n", "cached prompt tok/req");
    }
    if (j.contains("mtp_acceptance_rate"))
        fmt::print("{:<24} {:.1f}% of {:.0f} drafts; {:.2f} tokens per step per request (mean)\n", "MTP acceptance",
                   100 * num("mtp_acceptance_rate"), num("mtp_draft_tokens"), num("mtp_mean_accepted_length"));
    if (const int64_t n = j["requests_without_usage"].get<int64_t>(); n > 0) {
        fmt::print("{:<24} {} requests sent no usage; their tokens are counted as text chunks\n", "note", n);
    }
    if (j["requests_ok"].get<int64_t>() == 0) {
        fmt::print("no request succeeded: no latencies to show\n");
    } else if (j["e2e_ms"]["count"].get<int64_t>() > 0) {
        fmt::print("{:<10} {:>10} {:>10} {:>10} {:>10}{}\n", "ms", "mean", "p50", "p90", "p99",
                   j.contains("by_kind") ? "   (streamed requests)" : "");
        for (const auto& [name, key] :
             {std::pair{"TTFT", "ttft_ms"}, {"TPOT", "tpot_ms"}, {"ITL", "itl_ms"}, {"E2E", "e2e_ms"}}) {
            const json& d = j[key];
            fmt::print("{:<10} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f}\n", name, d["mean"].get<double>(),
                       d["p50"].get<double>(), d["p90"].get<double>(), d["p99"].get<double>());
        }
    }
    if (j.contains("by_kind")) print_kinds(j["by_kind"]);
    print_soak(j);
}

void check_options(const ServeBenchOptions& o) {
    FANOUT_CHECK(o.endpoint == "chat" || o.endpoint == "completions", "endpoint '{}' must be chat or completions",
                 o.endpoint);
    // Upper bounds a load test never needs, so no size below overflows or asks for terabytes.
    constexpr int64_t kMaxWords = 1 << 20, kMaxRequests = 1 << 24, kMaxTotalWords = int64_t{1} << 27;
    FANOUT_CHECK(o.num_requests >= 1 && o.num_requests <= kMaxRequests, "num_requests={} must be in 1..{}",
                 o.num_requests, kMaxRequests);
    FANOUT_CHECK(o.turns >= 1 && o.num_requests % o.turns == 0,
                 "turns={} must be >= 1 and divide num_requests={} (whole conversations)", o.turns, o.num_requests);
    FANOUT_CHECK(o.turns == 1 || o.mix.only_streamed(), "turns > 1 sends streamed requests only");
    FANOUT_CHECK(o.first_turn_len >= 0 && o.first_turn_len <= kMaxWords, "first_turn_len={} must be in 0..{}",
                 o.first_turn_len, kMaxWords);
    FANOUT_CHECK(o.first_turn_len == 0 || o.turns > 1, "first_turn_len={} needs turns > 1", o.first_turn_len);
    FANOUT_CHECK(o.kv_block_size >= 1, "kv_block_size={} must be >= 1", o.kv_block_size);
    FANOUT_CHECK(o.request_rate >= 0 && std::isfinite(o.request_rate), "request_rate={} must be >= 0", o.request_rate);
    FANOUT_CHECK(o.max_concurrency >= 0, "max_concurrency={} must be >= 0", o.max_concurrency);
    FANOUT_CHECK(
        o.prompt_len >= 1 && o.prompt_len <= kMaxWords && o.prompt_len_range >= 0 && o.prompt_len_range <= kMaxWords,
        "prompt_len={} must be in 1..{}, range={} in 0..{}", o.prompt_len, kMaxWords, o.prompt_len_range, kMaxWords);
    // The workload's prompts are built up front: their words in all, a conversation's turns each
    // repeating the history before them.
    const double opening = o.first_turn_len > 0 ? o.first_turn_len : o.prompt_len;
    const double total_words = double(o.num_requests) * (double(o.prefix_len) + opening + o.prompt_len_range +
                                                         double(o.prompt_len) * (o.turns - 1) / 2.0);
    FANOUT_CHECK(total_words <= double(kMaxTotalWords),
                 "num_requests={}, turns={}, prompt_len={}, prefix_len={}: ~{:.3g} prompt words in all, past {} "
                 "(the prompts are built before the run)",
                 o.num_requests, o.turns, o.prompt_len, o.prefix_len, total_words, kMaxTotalWords);
    FANOUT_CHECK(
        o.output_len >= 1 && o.output_len <= kMaxWords && o.output_len_range >= 0 && o.output_len_range <= kMaxWords,
        "output_len={} must be in 1..{}, range={} in 0..{}", o.output_len, kMaxWords, o.output_len_range, kMaxWords);
    FANOUT_CHECK(
        o.prefix_groups >= 0 && o.prefix_groups <= kMaxRequests && o.prefix_len >= 0 && o.prefix_len <= kMaxWords,
        "prefix_groups={} (0..{}) and prefix_len={} (0..{}) out of range", o.prefix_groups, kMaxRequests, o.prefix_len,
        kMaxWords);
    FANOUT_CHECK(
        std::isfinite(o.slo_ttft_ms) && o.slo_ttft_ms >= 0 && std::isfinite(o.slo_tpot_ms) && o.slo_tpot_ms >= 0,
        "slo_ttft_ms={} and slo_tpot_ms={} must be finite and >= 0 (0: none)", o.slo_ttft_ms, o.slo_tpot_ms);
    FANOUT_CHECK((o.prefix_groups > 0) == (o.prefix_len > 0),
                 "prefix_groups={} and prefix_len={} must be both set or both 0", o.prefix_groups, o.prefix_len);
    FANOUT_CHECK(o.timeout_s > 0, "timeout_s={} must be > 0", o.timeout_s);
    double sum = 0;
    for (double w : weights_of(o.mix)) {
        FANOUT_CHECK(w >= 0 && std::isfinite(w), "mix weights must be >= 0 (mix {})", mix_string(o.mix));
        sum += w;
    }
    FANOUT_CHECK(sum > 0, "mix weights must not all be 0");
    FANOUT_CHECK(o.slow_clients >= 0, "slow_clients={} must be >= 0", o.slow_clients);
    FANOUT_CHECK(o.slow_client_interval_s > 0, "slow_client_interval_s={} must be > 0", o.slow_client_interval_s);
    FANOUT_CHECK(o.server_pid >= 0, "server_pid={} must be >= 0", o.server_pid);
    FANOUT_CHECK(o.sample_interval_s > 0, "sample_interval_s={} must be > 0", o.sample_interval_s);
}

// Each request in flight holds a socket: raise the soft open-file limit (often 1024) to the hard
// one when the run could need more.
void ensure_fd_limit(int max_in_flight) {
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
    const rlim_t want = static_cast<rlim_t>(max_in_flight) + 64;
    if (lim.rlim_cur >= want) return;
    lim.rlim_cur = lim.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &lim);
    if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < want) {
        fmt::print(
            "warning: open-file limit {} < {} connections at once; expect connection failures "
            "(lower --max-concurrency or --slow-clients)\n",
            lim.rlim_cur, max_in_flight);
    }
}

// host and port of "http://host:port" (80 when none; IPv6 in brackets).
std::pair<std::string, int> host_port(const Target& t) {
    const std::string rest = t.origin.substr(std::string_view("http://").size());
    std::string host = rest, port = "80";
    if (rest.starts_with('[')) {
        const size_t close = rest.find(']');
        FANOUT_CHECK(close != std::string::npos, "base_url '{}': unclosed [", t.origin);
        host = rest.substr(1, close - 1);
        if (close + 1 < rest.size() && rest[close + 1] == ':') port = rest.substr(close + 2);
    } else if (const size_t colon = rest.rfind(':'); colon != std::string::npos) {
        host = rest.substr(0, colon);
        port = rest.substr(colon + 1);
    }
    int p = 0;
    const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
    FANOUT_CHECK(ec == std::errc() && end == port.data() + port.size() && p > 0 && p < 65536,
                 "base_url '{}': bad port '{}'", t.origin, port);
    return {host, p};
}

}  // namespace

RequestMix parse_request_mix(const std::string& text) {
    FANOUT_CHECK(!text.empty(), "the mix is empty: expected e.g. streamed=5,plain=2,cancelled=2,malformed=1");
    std::array<double, kNumKinds> w{};
    std::array<bool, kNumKinds> seen{};
    for (size_t begin = 0; begin <= text.size();) {
        const size_t comma = std::min(text.find(',', begin), text.size());
        const std::string item = text.substr(begin, comma - begin);
        begin = comma + 1;
        const size_t eq = item.find('=');
        FANOUT_CHECK(eq != std::string::npos,
                     "mix item '{}' must be KIND=WEIGHT (kinds: streamed, plain, cancelled, malformed)", item);
        const std::string name = item.substr(0, eq), value = item.substr(eq + 1);
        const auto it = std::find(std::begin(kKindNames), std::end(kKindNames), name);
        FANOUT_CHECK(it != std::end(kKindNames),
                     "mix: unknown kind '{}' (kinds: streamed, plain, cancelled, malformed)", name);
        const int k = static_cast<int>(it - std::begin(kKindNames));
        FANOUT_CHECK(!seen[k], "mix names '{}' twice", name);
        seen[k] = true;
        double x = 0;
        const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), x);
        FANOUT_CHECK(!value.empty() && ec == std::errc() && end == value.data() + value.size() && x >= 0 && x <= 1e6,
                     "mix: the weight of {} must be a number in [0, 1e6], not '{}'", name, value);
        w[k] = x;
    }
    FANOUT_CHECK(w[0] + w[1] + w[2] + w[3] > 0, "mix '{}': the weights must not all be 0", text);
    return {w[0], w[1], w[2], w[3]};
}

int run_serve_bench(const ServeBenchOptions& opts) {
    check_options(opts);
    ServeBenchOptions o = opts;
    const Target target = parse_base_url(o.base_url);
    if (o.model.empty()) o.model = discover_model(target, o.timeout_s);
    const bool chat = o.endpoint == "chat";
    const std::string path = target.prefix + (chat ? "/v1/chat/completions" : "/v1/completions");
    const std::vector<RequestSpec> specs = make_workload(o);
    std::vector<std::string> bodies;
    for (const RequestSpec& s : specs) {
        if (s.kind == Kind::kMalformed)
            bodies.push_back(malformed_body(o, o.model, s));
        else
            bodies.push_back(request_body(o, o.model, s, s.kind != Kind::kPlain).dump());
    }

    fmt::print("\nfanout bench serve — {}{} model {}: {} requests, rate {}, concurrency {}{}\n", target.origin, path,
               o.model, o.num_requests, o.request_rate > 0 ? fmt::format("{:g}/s", o.request_rate) : "inf",
               o.max_concurrency > 0 ? std::to_string(o.max_concurrency) : "unlimited",
               o.mix.only_streamed() ? "" : ", mix " + mix_string(o.mix));
    std::fflush(stdout);

    // Arrival schedule: request 0 at t = 0, then exponential gaps of mean 1 / rate (Poisson).
    // Its own generator, so that the prompts do not depend on the rate.
    std::mt19937_64 arrival_rng(o.seed ^ 0x9e3779b97f4a7c15ULL);
    std::exponential_distribution<double> gap(o.request_rate > 0 ? o.request_rate : 1.0);
    const int num_slots = o.max_concurrency > 0 ? std::min(o.max_concurrency, o.num_requests) : o.num_requests;
    std::counting_semaphore<> slots(num_slots);
    ensure_fd_limit(num_slots + o.slow_clients);
    std::vector<RequestResult> results(o.num_requests);
    std::vector<std::thread> threads;
    threads.reserve(o.num_requests);
    // Finished threads are joined as the run goes, so a long run does not hold thousands of stacks.
    std::unique_ptr<std::atomic<bool>[]> finished(new std::atomic<bool>[o.num_requests] {});
    size_t num_joined = 0;
    std::atomic<int64_t> num_done{0};

    // The sampler first (its first sample is the server before this run), then the slow clients.
    std::unique_ptr<ProcessSampler> sampler;
    if (o.server_pid > 0)
        sampler = std::make_unique<ProcessSampler>(o.server_pid, o.sample_interval_s, [&] { return num_done.load(); });
    std::unique_ptr<SlowClients> slow;
    if (o.slow_clients > 0) {
        const auto [host, port] = host_port(target);
        slow = std::make_unique<SlowClients>(host, port, o.slow_clients, o.slow_client_interval_s);
        const int open = slow->wait_connected(3 * o.slow_client_interval_s + 2);
        fmt::print("{} of {} slow clients connected ({} open now), one byte every {:g} s\n", slow->ever_connected(),
                   o.slow_clients, open, o.slow_client_interval_s);
        std::fflush(stdout);
    }

    const auto bench_start = clock_type::now();
    double arrival_s = 0;
    // A conversation's turns go one after another on its own thread; a single request is a
    // conversation of one turn.
    const int turns = o.turns;
    for (int c = 0; c < o.num_requests / turns; ++c) {
        if (o.request_rate > 0) {
            if (c > 0) arrival_s += gap(arrival_rng);
            std::this_thread::sleep_until(bench_start + std::chrono::duration_cast<clock_type::duration>(
                                                            std::chrono::duration<double>(arrival_s)));
        }
        // A request whose arrival time has passed waits here for a slot; its TTFT counts from the send.
        if (turns == 1) slots.acquire();
        for (; num_joined < threads.size() && finished[num_joined].load(); ++num_joined) threads[num_joined].join();
        threads.emplace_back([&, c] {
            for (int t = 0; t < turns; ++t) {
                const int i = c * turns + t;
                if (turns > 1) slots.acquire();
                results[i] = send_one(target, path, bodies[i], specs[i].kind, chat, o.timeout_s, bench_start);
                ++num_done;
                slots.release();
            }
            finished[c].store(true);
        });
    }
    for (; num_joined < threads.size(); ++num_joined) threads[num_joined].join();

    std::vector<ProcSample> samples;
    bool server_exited = false;
    if (sampler) {
        samples = sampler->stop();
        server_exited = sampler->process_exited();
    }
    const SlowClientStats slow_stats = slow ? slow->stop() : SlowClientStats{};

    json j = summarize(o, specs, results);
    if (slow) j["slow_clients"] = to_json(slow_stats);
    if (sampler) {
        const int64_t warmup = (o.num_requests + 9) / 10;  // 10% of the requests done
        j["server_process"] = summarize_samples(o.server_pid, o.sample_interval_s, samples, warmup, server_exited);
    }
    print_report(o, j);
    if (!o.json_out.empty()) {
        std::ofstream out(o.json_out);
        FANOUT_CHECK(out.good(), "cannot write {}", o.json_out);
        out << j.dump(2) << "\n";
        fmt::print("wrote {}\n", o.json_out);
    }
    return j["requests_failed"].get<int64_t>() == 0 && !server_exited ? 0 : 1;
}

}  // namespace fanout::bench

// `fanout bench serve`: workload → one thread per in-flight request → SSE timing → report.
//
// The flow reads top to bottom: make_workload() builds every request up front from the seed;
// run_serve_bench() releases them on a Poisson (or all-at-once) schedule, each on its own thread
// once a concurrency slot is free; send_one() streams one request through httplib and SseStream
// timestamps every chunk that carries text; summarize() and print_report() turn the per-request
// records into the table and the JSON.
#include "serve_bench.h"

#include <fmt/format.h>
#include <httplib.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <semaphore>
#include <string_view>
#include <thread>
#include <vector>

#include "fanout/core/error.h"

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

struct RequestSpec {
    std::string prompt;  // the user message (chat) or the prompt (completions)
    int prompt_words = 0;
    int max_tokens = 0;
    int group = -1;  // shared-prefix group, -1 when none
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

// Every request, decided up front from the seed alone (independent of rate and concurrency).
std::vector<RequestSpec> make_workload(const ServeBenchOptions& o) {
    std::mt19937_64 rng(o.seed);
    std::vector<std::string> prefixes(o.prefix_groups);
    for (auto& p : prefixes) append_words(rng, o.prefix_len, p);
    std::vector<RequestSpec> specs(o.num_requests);
    for (int i = 0; i < o.num_requests; ++i) {
        RequestSpec& s = specs[i];
        const int unique_words = uniform_len(rng, o.prompt_len, o.prompt_len_range);
        s.max_tokens = uniform_len(rng, o.output_len, o.output_len_range);
        if (o.prefix_groups > 0) {
            s.group = i % o.prefix_groups;
            s.prompt = prefixes[s.group];
            s.prompt_words = o.prefix_len;
        }
        append_words(rng, unique_words, s.prompt);
        s.prompt_words += unique_words;
    }
    return specs;
}

json request_body(const ServeBenchOptions& o, const std::string& model, const RequestSpec& s) {
    json body = {{"model", model},
                 {"max_tokens", s.max_tokens},
                 {"temperature", 0.0},
                 {"stream", true},
                 {"stream_options", {{"include_usage", true}}}};
    if (o.endpoint == "chat")
        body["messages"] = json::array({{{"role", "user"}, {"content", s.prompt}}});
    else
        body["prompt"] = s.prompt;
    if (o.ignore_eos) body["ignore_eos"] = true;
    return body;
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
    bool ok = false;
    std::string error;
    double start_s = 0;           // send time, from the benchmark start
    double end_s = 0;             // last byte, from the benchmark start
    double latency_s = 0;         // end_s - start_s
    std::vector<double> chunk_s;  // arrival of each chunk that carried text, from the send time
    int64_t prompt_tokens = -1, completion_tokens = -1, cached_tokens = -1;  // -1: not in usage
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
        if (const auto u = j.find("usage"); u != j.end() && u->is_object()) read_usage(*u);
        if (const auto c = j.find("choices"); c != j.end() && c->is_array() && !c->empty()) {
            if (!text_of((*c)[0]).empty()) r_.chunk_s.push_back(t_s);
        }
        return true;
    }

    void read_usage(const json& u) {
        const auto count = [](const json& obj, const char* key) -> int64_t {
            const auto it = obj.find(key);
            return it != obj.end() && it->is_number_integer() ? it->get<int64_t>() : -1;
        };
        r_.prompt_tokens = count(u, "prompt_tokens");
        r_.completion_tokens = count(u, "completion_tokens");
        if (const auto d = u.find("prompt_tokens_details"); d != u.end() && d->is_object()) {
            r_.cached_tokens = count(*d, "cached_tokens");
        }
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

// Streams one request; never throws. Times are measured from `bench_start`.
RequestResult send_one(const Target& target, const std::string& path, const std::string& body, bool chat,
                       double timeout_s, clock_type::time_point bench_start) {
    RequestResult r;
    httplib::Client cli(target.origin);
    const auto timeout_us = std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6));
    cli.set_connection_timeout(timeout_us);
    cli.set_read_timeout(timeout_us);
    cli.set_write_timeout(timeout_us);
    cli.set_tcp_nodelay(true);

    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body;
    // NOTE: identity said outright (httplib sends no Accept-Encoding): a server or proxy that
    // compressed the stream would hold chunks back in its encoder and blur every timestamp.
    req.headers = {
        {"Content-Type", "application/json"}, {"Accept", "text/event-stream"}, {"Accept-Encoding", "identity"}};
    int status = 0;
    std::string error_body;
    bool timed_out = false;
    SseStream sse(chat, r);
    // NOTE: httplib hands the body of *every* status to content_receiver (res.body stays empty),
    // so the status captured by response_handler decides whether bytes are SSE or an error page.
    req.response_handler = [&](const httplib::Response& res) {
        status = res.status;
        return true;
    };
    const auto t0 = clock_type::now();
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
        const double t_s = seconds_between(t0, clock_type::now());
        if (status != 200) {
            if (error_body.size() < 300) error_body.append(data, std::min(n, 300 - error_body.size()));
            return true;
        }
        if (t_s > timeout_s) {
            timed_out = true;
            return false;
        }
        return sse.feed(data, n, t_s);
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    const bool sent = cli.send(req, res, err);
    const auto t1 = clock_type::now();
    r.start_s = seconds_between(bench_start, t0);
    r.end_s = seconds_between(bench_start, t1);
    r.latency_s = seconds_between(t0, t1);

    if (timed_out || (!sent && r.latency_s >= timeout_s * 0.99)) {
        r.error = fmt::format("timeout after {:.3g} s", timeout_s);
    } else if (status != 0 && status != 200) {
        r.error = fmt::format("HTTP {}: {}", status, error_body);
    } else if (!sent) {
        r.error = sse.error().empty() ? fmt::format("request failed: {}", httplib::to_string(err)) : sse.error();
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
            {"prefix_len", o.prefix_len},
            {"slo_ttft_ms", o.slo_ttft_ms},
            {"slo_tpot_ms", o.slo_tpot_ms},
            {"seed", o.seed},
            {"ignore_eos", o.ignore_eos},
            {"timeout_s", o.timeout_s}};
}

json to_json(const RequestResult& r, const RequestSpec& s) {
    json j = {{"ok", r.ok},
              {"start_ms", 1e3 * r.start_s},
              {"e2e_ms", 1e3 * r.latency_s},
              {"prompt_words", s.prompt_words},
              {"max_tokens", s.max_tokens},
              {"prompt_tokens", r.prompt_tokens},
              {"completion_tokens", r.completion_tokens},
              {"cached_tokens", r.cached_tokens},
              {"text_chunks", r.chunk_s.size()}};
    if (s.group >= 0) j["prefix_group"] = s.group;
    if (r.ok) {
        j["ttft_ms"] = 1e3 * r.ttft_s();
        if (r.tpot_s() >= 0) j["tpot_ms"] = 1e3 * r.tpot_s();
    } else {
        j["error"] = r.error;
    }
    return j;
}

// Everything the table and the JSON show, from the per-request records.
json summarize(const ServeBenchOptions& o, const std::vector<RequestSpec>& specs,
               const std::vector<RequestResult>& results) {
    std::vector<double> ttft, tpot, itl, e2e;
    int64_t num_ok = 0, prompt_tokens = 0, output_tokens = 0, cached_tokens = 0, num_cached_reported = 0,
            num_usage_missing = 0, num_good = 0;
    double duration_s = 0;
    const RequestResult* first_failure = nullptr;
    for (const RequestResult& r : results) {
        duration_s = std::max(duration_s, r.end_s);
        if (!r.ok) {
            if (first_failure == nullptr || r.end_s < first_failure->end_s) first_failure = &r;
            continue;
        }
        ++num_ok;
        ttft.push_back(r.ttft_s());
        e2e.push_back(r.latency_s);
        if (r.tpot_s() >= 0) tpot.push_back(r.tpot_s());
        for (size_t k = 1; k < r.chunk_s.size(); ++k) itl.push_back(r.chunk_s[k] - r.chunk_s[k - 1]);
        output_tokens += r.output_tokens();
        prompt_tokens += std::max<int64_t>(0, r.prompt_tokens);
        num_usage_missing += r.completion_tokens < 0;
        if (r.cached_tokens >= 0) {
            cached_tokens += r.cached_tokens;
            ++num_cached_reported;
        }
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
    j["mean_cached_tokens"] = num_ok > 0 ? static_cast<double>(cached_tokens) / num_ok : 0.0;
    j["cached_tokens_reported"] = num_cached_reported;
    j["cache_hit_rate"] = prompt_tokens > 0 ? static_cast<double>(cached_tokens) / prompt_tokens : 0.0;
    j["ttft_ms"] = to_json(distribution_ms(ttft));
    j["tpot_ms"] = to_json(distribution_ms(tpot));
    j["itl_ms"] = to_json(distribution_ms(itl));
    j["e2e_ms"] = to_json(distribution_ms(e2e));
    j["requests"] = json::array();
    for (size_t i = 0; i < results.size(); ++i) j["requests"].push_back(to_json(results[i], specs[i]));
    return j;
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
    } else {
        fmt::print("{:<24} not reported by the server\n", "cached prompt tok/req");
    }
    if (const int64_t n = j["requests_without_usage"].get<int64_t>(); n > 0) {
        fmt::print("{:<24} {} requests sent no usage; their tokens are counted as text chunks\n", "note", n);
    }
    if (j["requests_ok"].get<int64_t>() == 0) {
        fmt::print("no request succeeded: no latencies to show\n");
        return;
    }
    fmt::print("{:<10} {:>10} {:>10} {:>10} {:>10}\n", "ms", "mean", "p50", "p90", "p99");
    for (const auto& [name, key] :
         {std::pair{"TTFT", "ttft_ms"}, {"TPOT", "tpot_ms"}, {"ITL", "itl_ms"}, {"E2E", "e2e_ms"}}) {
        const json& d = j[key];
        fmt::print("{:<10} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f}\n", name, d["mean"].get<double>(),
                   d["p50"].get<double>(), d["p90"].get<double>(), d["p99"].get<double>());
    }
}

void check_options(const ServeBenchOptions& o) {
    FANOUT_CHECK(o.endpoint == "chat" || o.endpoint == "completions", "endpoint '{}' must be chat or completions",
                 o.endpoint);
    FANOUT_CHECK(o.num_requests >= 1, "num_requests={} must be >= 1", o.num_requests);
    FANOUT_CHECK(o.request_rate >= 0 && std::isfinite(o.request_rate), "request_rate={} must be >= 0", o.request_rate);
    FANOUT_CHECK(o.max_concurrency >= 0, "max_concurrency={} must be >= 0", o.max_concurrency);
    FANOUT_CHECK(o.prompt_len >= 1 && o.prompt_len_range >= 0, "prompt_len={} must be >= 1, range={} >= 0",
                 o.prompt_len, o.prompt_len_range);
    FANOUT_CHECK(o.output_len >= 1 && o.output_len_range >= 0, "output_len={} must be >= 1, range={} >= 0",
                 o.output_len, o.output_len_range);
    FANOUT_CHECK(o.prefix_groups >= 0 && o.prefix_len >= 0, "prefix_groups={} and prefix_len={} must be >= 0",
                 o.prefix_groups, o.prefix_len);
    FANOUT_CHECK((o.prefix_groups > 0) == (o.prefix_len > 0),
                 "prefix_groups={} and prefix_len={} must be both set or both 0", o.prefix_groups, o.prefix_len);
    FANOUT_CHECK(o.timeout_s > 0, "timeout_s={} must be > 0", o.timeout_s);
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
            "warning: open-file limit {} < {} requests in flight; expect connection failures "
            "(lower --max-concurrency)\n",
            lim.rlim_cur, max_in_flight);
    }
}

}  // namespace

int run_serve_bench(const ServeBenchOptions& opts) {
    check_options(opts);
    ServeBenchOptions o = opts;
    const Target target = parse_base_url(o.base_url);
    if (o.model.empty()) o.model = discover_model(target, o.timeout_s);
    const bool chat = o.endpoint == "chat";
    const std::string path = target.prefix + (chat ? "/v1/chat/completions" : "/v1/completions");
    const std::vector<RequestSpec> specs = make_workload(o);
    std::vector<std::string> bodies;
    for (const RequestSpec& s : specs) bodies.push_back(request_body(o, o.model, s).dump());

    fmt::print("\nfanout bench serve — {}{} model {}: {} requests, rate {}, concurrency {}\n", target.origin, path,
               o.model, o.num_requests, o.request_rate > 0 ? fmt::format("{:g}/s", o.request_rate) : "inf",
               o.max_concurrency > 0 ? std::to_string(o.max_concurrency) : "unlimited");
    std::fflush(stdout);

    // Arrival schedule: request 0 at t = 0, then exponential gaps of mean 1 / rate (Poisson).
    // Its own generator, so that the prompts do not depend on the rate.
    std::mt19937_64 arrival_rng(o.seed ^ 0x9e3779b97f4a7c15ULL);
    std::exponential_distribution<double> gap(o.request_rate > 0 ? o.request_rate : 1.0);
    const int num_slots = o.max_concurrency > 0 ? std::min(o.max_concurrency, o.num_requests) : o.num_requests;
    std::counting_semaphore<> slots(num_slots);
    ensure_fd_limit(num_slots);
    std::vector<RequestResult> results(o.num_requests);
    std::vector<std::thread> threads;
    threads.reserve(o.num_requests);
    // Finished threads are joined as the run goes, so a long run does not hold thousands of stacks.
    std::unique_ptr<std::atomic<bool>[]> finished(new std::atomic<bool>[o.num_requests] {});
    size_t num_joined = 0;

    const auto bench_start = clock_type::now();
    double arrival_s = 0;
    for (int i = 0; i < o.num_requests; ++i) {
        if (o.request_rate > 0) {
            if (i > 0) arrival_s += gap(arrival_rng);
            std::this_thread::sleep_until(bench_start + std::chrono::duration_cast<clock_type::duration>(
                                                            std::chrono::duration<double>(arrival_s)));
        }
        // A request whose arrival time has passed waits here for a slot; its TTFT counts from the send.
        slots.acquire();
        for (; num_joined < threads.size() && finished[num_joined].load(); ++num_joined) threads[num_joined].join();
        threads.emplace_back([&, i] {
            results[i] = send_one(target, path, bodies[i], chat, o.timeout_s, bench_start);
            finished[i].store(true);
            slots.release();
        });
    }
    for (; num_joined < threads.size(); ++num_joined) threads[num_joined].join();

    const json j = summarize(o, specs, results);
    print_report(o, j);
    if (!o.json_out.empty()) {
        std::ofstream out(o.json_out);
        FANOUT_CHECK(out.good(), "cannot write {}", o.json_out);
        out << j.dump(2) << "\n";
        fmt::print("wrote {}\n", o.json_out);
    }
    return j["requests_failed"].get<int64_t>() == 0 ? 0 : 1;
}

}  // namespace fanout::bench

// `fanout bench serve`: a load generator for any OpenAI-compatible server (fanout, vLLM, SGLang),
// in the manner of vLLM's benchmark_serving.py and SGLang's bench_serving. It sends a synthetic
// workload of streamed requests to a URL and reports throughput, TTFT, TPOT, ITL and end-to-end
// latency percentiles, and goodput under an SLO.
//
// For soak runs it can also mix in other kinds of request (plain JSON responses, streams the
// client abandons after the first chunk, malformed bodies that must get a 4xx), hold slow
// connections open that trickle a request head, and sample the server process's RSS and threads.
//
// It is not a tokenizer-aware benchmark: prompts are counted in words, and token counts come from
// the server's `usage` chunk (stream_options.include_usage), falling back to one token per
// content chunk when the server sends no usage.
#pragma once

#include <cstdint>
#include <string>

namespace fanout::bench {

// Weights of the kinds of request; each request's kind is decided up front from the seed, the
// counts following the weights exactly up to rounding (largest remainder), the order shuffled.
//   streamed:  stream: true (SSE), timed per chunk: TTFT, TPOT, ITL, E2E.
//   plain:     stream: false, one JSON body: E2E (the time to the whole response).
//   cancelled: streamed, but the client closes the connection after the first text chunk; ok
//              when that chunk came.
//   malformed: a bad body (invalid JSON, a wrong type, an unknown field, 10,000 levels of nesting,
//              a NUL byte: in turn); ok when answered 4xx with OpenAI's error shape
//              {"error": {"message": "...", "type": "..."}}.
struct RequestMix {
    double streamed = 1, plain = 0, cancelled = 0, malformed = 0;
    bool only_streamed() const { return plain == 0 && cancelled == 0 && malformed == 0; }
};
// "streamed=5,plain=2,cancelled=2,malformed=1"; kinds left out weigh 0. Error when malformed.
RequestMix parse_request_mix(const std::string& text);

struct ServeBenchOptions {
    std::string base_url = "http://127.0.0.1:8000";  // scheme://host:port[/prefix] (http only)
    std::string model;                               // "model" field sent; "" = first id of GET /v1/models
    std::string endpoint = "chat";                   // "chat" (/v1/chat/completions) or "completions" (/v1/completions)
    int num_requests = 100;
    double request_rate = 0;  // Poisson arrivals per second; 0 = all at once, limited by max_concurrency
    int max_concurrency = 0;  // requests in flight at most; 0 = unlimited
    // Each request's unique prompt part has a word count uniform in [len - range, len + range] (at
    // least 1); its max_tokens follows the same rule.
    int prompt_len = 128, prompt_len_range = 0;
    int output_len = 64, output_len_range = 0;
    // prefix_groups > 0: request i's user message opens with shared prefix (i % prefix_groups),
    // prefix_len words long, followed by its own prompt_len words (the multi-turn chat /
    // shared-system-prompt workload that exercises a prefix cache).
    int prefix_groups = 0;
    int prefix_len = 0;
    // turns > 1: the multi-turn workload. Requests come in conversations of `turns` requests: a
    // conversation's first request is its opening (as above), each later one extends the previous
    // request's prompt by prompt_len new words and is sent when the previous one has finished;
    // conversations start at the arrival rate (request_rate: conversations per second).
    // num_requests counts requests (conversations = num_requests / turns). The report adds the
    // best prefix-cache hit rate any placement could reach: every turn reusing the whole blocks
    // (kv_block_size tokens) of its conversation's previous prompt.
    int turns = 1;
    // turns > 1: a conversation's opening has this many unique words (0: prompt_len) — a long
    // document or history followed by short turns (the chat-with-a-document workload).
    int first_turn_len = 0;
    int kv_block_size = 64;
    double slo_ttft_ms = 0, slo_tpot_ms = 0;  // goodput counts requests meeting both (0 = no bound)
    uint64_t seed = 0;
    bool ignore_eos = true;  // sends "ignore_eos": true so outputs run to max_tokens (vLLM/SGLang extension)
    double timeout_s = 600;  // per request, from send to the last byte
    std::string json_out;    // "" = no JSON file

    RequestMix mix;  // default: streamed only (the figures above cover the streamed requests)
    // Extra connections held for the whole run, each sending a request head one byte per
    // slow_client_interval_s and never finishing it; reopened when the server drops them.
    int slow_clients = 0;
    double slow_client_interval_s = 1.0;
    // > 0: sample /proc/PID/status (VmRSS, Threads) and /proc/PID/fd every sample_interval_s.
    int server_pid = 0;
    double sample_interval_s = 0.5;
};

// Prints a table; writes JSON (summary, options and one record per request) when json_out is set.
// Returns 0 when every request succeeded, 1 when any failed (HTTP error, bad SSE, timeout, a
// malformed body not refused as it should be) or the sampled server process went away. Throws
// fanout::Error for a bad option or when the model cannot be found from GET /v1/models.
int run_serve_bench(const ServeBenchOptions& opts);

}  // namespace fanout::bench

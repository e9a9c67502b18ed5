// `fanout bench serve`: a load generator for any OpenAI-compatible server (fanout, vLLM, SGLang),
// in the manner of vLLM's benchmark_serving.py and SGLang's bench_serving. It sends a synthetic
// workload of streamed requests to a URL and reports throughput, TTFT, TPOT, ITL and end-to-end
// latency percentiles, and goodput under an SLO.
//
// It is not a tokenizer-aware benchmark: prompts are counted in words, and token counts come from
// the server's `usage` chunk (stream_options.include_usage), falling back to one token per
// content chunk when the server sends no usage.
#pragma once

#include <cstdint>
#include <string>

namespace fanout::bench {

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
    double slo_ttft_ms = 0, slo_tpot_ms = 0;  // goodput counts requests meeting both (0 = no bound)
    uint64_t seed = 0;
    bool ignore_eos = true;  // sends "ignore_eos": true so outputs run to max_tokens (vLLM/SGLang extension)
    double timeout_s = 600;  // per request, from send to the last byte
    std::string json_out;    // "" = no JSON file
};

// Prints a table; writes JSON (summary, options and one record per request) when json_out is set.
// Returns 0 when every request succeeded, 1 when any failed (HTTP error, bad SSE, timeout). Throws
// fanout::Error for a bad option or when the model cannot be found from GET /v1/models.
int run_serve_bench(const ServeBenchOptions& opts);

}  // namespace fanout::bench

#include "fanout/serve/metrics.h"

#include <fmt/format.h>

namespace fanout::serve {

std::string prometheus_label_value(std::string_view v) {
    std::string out;
    out.reserve(v.size());
    for (const char c : v) {
        if (c == '\\')
            out += "\\\\";
        else if (c == '"')
            out += "\\\"";
        else if (c == '\n')
            out += "\\n";
        else
            out += c;
    }
    return out;
}

std::string render_metrics(const std::string& model_name, const engine::EngineStats& s, const HttpStats& http,
                           const StartupTimes& startup, const std::vector<engine::EngineStats>& ranks) {
    std::string out;
    const std::string model = prometheus_label_value(model_name);
    const std::string label = fmt::format("{{model=\"{}\"}}", model);
    const auto metric = [&](const char* name, const char* type, const char* help, double v) {
        out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{} {}\n", name, help, name, type, name, label, v);
    };
    metric("fanout_requests_received_total", "counter", "Requests accepted by the engine.", s.requests_received);
    metric("fanout_requests_finished_total", "counter", "Requests finished (any reason).", s.requests_finished);
    metric("fanout_requests_aborted_total", "counter", "Requests cancelled (client gone).", s.requests_aborted);
    metric("fanout_requests_failed_total", "counter", "Requests failed by an engine error.", s.requests_failed);
    metric("fanout_http_requests_total", "counter", "HTTP requests to the API routes.", http.requests);
    metric("fanout_http_errors_total", "counter", "API requests answered with an error.", http.errors);
    metric("fanout_prompt_tokens_total", "counter", "Prompt tokens received.", s.prompt_tokens);
    metric("fanout_generation_tokens_total", "counter", "Tokens generated.", s.generation_tokens);
    metric("fanout_prefix_cache_hit_tokens_total", "counter", "Prompt tokens served from the prefix cache.",
           s.cached_prompt_tokens);
    metric("fanout_prefix_cache_hit_rate", "gauge", "Cached prompt tokens / prompt tokens, finished requests.",
           s.prompt_tokens ? double(s.cached_prompt_tokens) / s.prompt_tokens : 0.0);
    metric("fanout_queue_depth", "gauge", "Requests waiting to be scheduled.", s.waiting);
    metric("fanout_running_sequences", "gauge", "Sequences in the running batch.", s.running);
    metric("fanout_http_in_flight", "gauge", "HTTP requests being served.", http.in_flight);
    metric("fanout_http_open_connections", "gauge", "Open client connections.", http.open_connections);
    metric("fanout_kv_cache_usage", "gauge", "Fraction of KV blocks in use or cached.",
           s.kv_blocks_total ? double(s.kv_blocks_used) / s.kv_blocks_total : 0.0);
    metric("fanout_kv_cache_cached_blocks", "gauge", "KV blocks held by the prefix cache.", s.kv_blocks_cached);
    metric("fanout_preemptions_total", "counter", "Sequences preempted (recompute).", s.preemptions);
    metric("fanout_engine_steps_total", "counter", "Engine steps run.", s.steps);
    metric("fanout_engine_microbatch_steps_total", "counter", "Engine steps run as two microbatches.",
           s.microbatch_steps);
    metric("fanout_engine_mha_steps_total", "counter",
           "Engine steps whose prefill chunks ran attention in MLA's MHA form (the GPU runner).", s.mha_steps);
    metric("fanout_engine_mha_requests_total", "counter", "Requests those steps ran in the MHA form.", s.mha_requests);
    metric("fanout_engine_forward_seconds_total", "counter",
           "Wall time in the model's forward passes (with MTP: the checking steps).", s.forward_microseconds * 1e-6);
    metric("fanout_spec_draft_seconds_total", "counter", "Wall time in the MTP layer's drafting passes.",
           s.draft_microseconds * 1e-6);
    metric("fanout_spec_draft_tokens_total", "counter", "MTP draft tokens proposed.", s.draft_tokens);
    metric("fanout_spec_accepted_tokens_total", "counter", "MTP draft tokens accepted.", s.accepted_draft_tokens);
    metric("fanout_spec_acceptance_rate", "gauge", "Accepted / proposed MTP draft tokens.",
           s.draft_tokens ? double(s.accepted_draft_tokens) / s.draft_tokens : 0.0);
    const auto histogram = [&](const char* name, const char* help, const engine::EngineStats::Histogram& h) {
        out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
        int64_t cum = 0;
        for (int i = 0; i < engine::EngineStats::kNumBuckets; ++i) {
            cum += h.counts[i];
            out += fmt::format("{}_bucket{{model=\"{}\",le=\"{}\"}} {}\n", name, model,
                               engine::EngineStats::kBuckets[i], cum);
        }
        out += fmt::format("{}_bucket{{model=\"{}\",le=\"+Inf\"}} {}\n", name, model, h.count);
        out += fmt::format("{}_sum{} {}\n{}_count{} {}\n", name, label, h.sum, name, label, h.count);
    };
    if (!startup.empty()) {
        out += "# HELP fanout_startup_seconds Seconds each start-up phase took.\n# TYPE fanout_startup_seconds gauge\n";
        for (const auto& [phase, secs] : startup)
            out += fmt::format("fanout_startup_seconds{{model=\"{}\",phase=\"{}\"}} {}\n", model,
                               prometheus_label_value(phase), secs);
    }
    // Data-parallel ranks: where the requests went and what each holds now.
    const auto per_rank = [&](const char* name, const char* type, const char* help, auto field) {
        out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
        for (size_t r = 0; r < ranks.size(); ++r)
            out += fmt::format("{}{{model=\"{}\",rank=\"{}\"}} {}\n", name, model, r, field(ranks[r]));
    };
    if (!ranks.empty()) {
        per_rank("fanout_rank_requests_received_total", "counter", "Requests handed to each data-parallel rank.",
                 [](const engine::EngineStats& e) { return e.requests_received; });
        per_rank("fanout_rank_generation_tokens_total", "counter", "Tokens each rank generated.",
                 [](const engine::EngineStats& e) { return e.generation_tokens; });
        per_rank("fanout_rank_running_sequences", "gauge", "Sequences in each rank's running batch.",
                 [](const engine::EngineStats& e) { return e.running; });
        per_rank("fanout_rank_queue_depth", "gauge", "Requests waiting in each rank's scheduler.",
                 [](const engine::EngineStats& e) { return e.waiting; });
        per_rank("fanout_rank_kv_cache_usage", "gauge", "Fraction of each rank's KV blocks in use or cached.",
                 [](const engine::EngineStats& e) {
                     return e.kv_blocks_total ? double(e.kv_blocks_used) / e.kv_blocks_total : 0.0;
                 });
        per_rank("fanout_rank_engine_steps_total", "counter", "Steps each rank ran with work (the others were empty).",
                 [](const engine::EngineStats& e) { return e.steps; });
    }
    histogram("fanout_time_to_first_token_seconds", "Time from request to first token.", s.ttft);
    histogram("fanout_inter_token_latency_seconds", "Time between a request's tokens.", s.itl);
    histogram("fanout_e2e_request_latency_seconds", "Time from request to its last token.", s.e2e);
    return out;
}

}  // namespace fanout::serve

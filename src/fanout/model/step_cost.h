// Step cost: what one token and one attention pair cost, so the scheduler can budget a step by
// work rather than by tokens (SchedulerConfig::attention_cost_per_pair).
//
// FLOPs from the model config alone, no measurement. A (query token, key token) pair is priced in
// MLA's MHA form, the one long prefill chunks run (short ones: absorbed_form_max_query): per layer and head, q·k over
// qk_nope + qk_rope dims and p·v over v dims, 2 FLOPs per multiply-add. A token's non-attention work is 2 FLOPs per
// active parameter of the decoder layers: the attention projections (q_a/q_b or q, kv_a, kv_b, o), then the dense MLP
// or the router with the shared and top-k routed experts. Not counted: the embedding (a lookup), the MTP layers (not
// run when serving), norms and RoPE (O(hidden)), and the absorbed form decode uses (memory-bound: its FLOPs are not its
// time).
#pragma once

#include <cstdint>

#include "fanout/io/model_config.h"

namespace fanout::model {

struct StepFlops {
    double attention_per_pair = 0;  // all layers
    double layers_per_token = 0;    // all decoder layers, attention excluded
    double lm_head_per_token = 0;   // only rows that produce logits pay it
    // The MHA form's other price: a prefill chunk expands the latent of its whole context through
    // kv_b, this much per context token (all layers). A cost per chunk, not per pair, that
    // attention_cost_per_pair leaves out: divided by layers_per_token it is 0.037 (tiny) and 0.029
    // (V3) token-equivalents, so at 100k context one chunk pays ~3000 whatever its length.
    double latent_expansion_per_context_token = 0;
    // A pair in the absorbed form (all layers): q·k over kv_lora + qk_rope dims and p·latent over
    // kv_lora dims per head — dearer per pair than the MHA form, but with no expansion.
    double absorbed_attention_per_pair = 0;
};

StepFlops step_flops(const io::ModelConfig& c);

// attention_per_pair / layers_per_token: the cost of one attention pair in token-equivalents,
// for SchedulerConfig::attention_cost_per_pair.
//
// NOTE: the lm_head is left out of the token's work by default: a prefill chunk — the work this
// price sizes — runs it for one row, not for each of its tokens, and on a small vocabulary-heavy
// model (the tiny preset: 33M lm_head parameters beside 1.3M in its layers) counting it would
// price attention 25× too low. On DeepSeek-V3 it changes the value by 2.5%.
// NOTE: a price in FLOPs, not in time. On the CPU path a pair costs ~10× more than this beside a
// token (tiny preset, 2 threads, measured): its attention loops run far below its GEMMs' FLOP rate.
double attention_cost_per_pair(const io::ModelConfig& c, bool count_lm_head = false);

// How much dearer an attention pair is on the CPU path than its FLOPs say, beside a token's GEMMs
// (measured on the tiny preset, 2 threads: ~10×). `fanout serve --device cpu` multiplies its
// price by this; with it a short request's TTFT beside a 100k-token prefill stays ~60–100 ms
// instead of 1–3 s (docs/PERF.md, issue 14).
constexpr double kCpuAttentionSlowdown = 10.0;

// The longest query (tokens of one request in a step) for which the absorbed form costs less than
// the MHA form whatever the context: n · (absorbed − MHA per pair) < expansion per context token.
// ~170 for DeepSeek-V3. Small prefill chunks deep in a long context (the scheduler's cost budget
// makes them) then skip re-expanding that whole context through kv_b on every step.
int64_t absorbed_form_max_query(const io::ModelConfig& c);

}  // namespace fanout::model

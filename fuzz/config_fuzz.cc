// libFuzzer target: parse_model_config on arbitrary text.
//
// Every input must either be rejected with fanout::Error or give a config whose derived values
// are finite and which survives model_config_to_json -> parse_model_config with the fields the
// model is built from unchanged. Any other exception escapes and libFuzzer records it as a crash.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "fanout/core/error.h"
#include "fanout/io/model_config.h"

namespace {

[[noreturn]] void invariant_broken() { __builtin_trap(); }

void check_round_trip(const fanout::io::ModelConfig& c) {
    const fanout::io::ModelConfig back =
        fanout::io::parse_model_config(fanout::io::model_config_to_json(c), "round-trip");
    if (back.hidden_size != c.hidden_size || back.num_hidden_layers != c.num_hidden_layers ||
        back.vocab_size != c.vocab_size || back.n_routed_experts != c.n_routed_experts ||
        back.num_experts_per_tok != c.num_experts_per_tok || back.q_lora_rank != c.q_lora_rank ||
        back.kv_lora_rank != c.kv_lora_rank || back.qk_head_dim() != c.qk_head_dim() ||
        back.first_k_dense_replace != c.first_k_dense_replace || back.yarn.has_value() != c.yarn.has_value() ||
        back.fp8.has_value() != c.fp8.has_value() || back.eos_token_ids != c.eos_token_ids ||
        back.softmax_scale() != c.softmax_scale())
        invariant_broken();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    fanout::io::ModelConfig c;
    try {
        c = fanout::io::parse_model_config(text, "fuzz");
    } catch (const fanout::Error&) {
        return 0;  // a rejected input
    }
    if (!std::isfinite(c.softmax_scale()) || !std::isfinite(c.rope_attention_factor())) invariant_broken();
    check_round_trip(c);  // a config that parsed once must parse again from what fanout writes
    return 0;
}

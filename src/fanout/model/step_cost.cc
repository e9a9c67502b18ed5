#include "fanout/model/step_cost.h"

#include <algorithm>
#include <cstdint>

#include "fanout/core/error.h"

namespace fanout::model {

StepFlops step_flops(const io::ModelConfig& c) {
    const double D = static_cast<double>(c.hidden_size), H = static_cast<double>(c.num_attention_heads);
    const double nope = static_cast<double>(c.qk_nope_head_dim), rope = static_cast<double>(c.qk_rope_head_dim);
    const double v = static_cast<double>(c.v_head_dim), kv_lora = static_cast<double>(c.kv_lora_rank);
    const double q_lora = static_cast<double>(c.q_lora_rank);
    const double q_params = c.q_lora_rank > 0 ? D * q_lora + q_lora * H * (nope + rope) : D * H * (nope + rope);
    const double attn_params = q_params + D * (kv_lora + rope) + kv_lora * H * (nope + v) + H * v * D;
    const double dense_params = 3.0 * D * static_cast<double>(c.intermediate_size);
    const double expert_params = 3.0 * D * static_cast<double>(c.moe_intermediate_size);
    const double moe_params = static_cast<double>(c.n_routed_experts) * D +  // the router
                              static_cast<double>(c.n_shared_experts + c.num_experts_per_tok) * expert_params;
    double layer_params = 0;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
        layer_params += attn_params + (c.is_moe_layer(l) ? moe_params : dense_params);
    StepFlops f;
    f.attention_per_pair = static_cast<double>(c.num_hidden_layers) * H * (nope + rope + v) * 2.0;
    f.layers_per_token = 2.0 * layer_params;
    f.lm_head_per_token = 2.0 * static_cast<double>(c.vocab_size) * D;
    f.latent_expansion_per_context_token = static_cast<double>(c.num_hidden_layers) * 2.0 * kv_lora * H * (nope + v);
    f.absorbed_attention_per_pair = static_cast<double>(c.num_hidden_layers) * H * (2.0 * kv_lora + rope) * 2.0;
    return f;
}

int64_t absorbed_form_max_query(const io::ModelConfig& c) {
    const StepFlops f = step_flops(c);
    const double extra = f.absorbed_attention_per_pair - f.attention_per_pair;
    if (extra <= 0) return INT64_MAX;  // absorbed is never dearer per pair: always absorbed
    return std::max<int64_t>(1, static_cast<int64_t>(f.latent_expansion_per_context_token / extra));
}

double attention_cost_per_pair(const io::ModelConfig& c, bool count_lm_head) {
    const StepFlops f = step_flops(c);
    const double per_token = f.layers_per_token + (count_lm_head ? f.lm_head_per_token : 0.0);
    FANOUT_CHECK(per_token > 0, "attention_cost_per_pair: the config has no per-token work (hidden_size {}, {} layers)",
                 c.hidden_size, c.num_hidden_layers);
    return f.attention_per_pair / per_token;
}

}  // namespace fanout::model

// ModelConfig: the DeepSeek-V3 `config.json` fields the model uses, parsed and validated.
//
// Accepts what HF writes for DeepseekV3 (model_type "deepseek_v3"): `q_lora_rank: null` for the
// direct-q variant, YaRN as transformers-4 `rope_scaling` or transformers-5 `rope_parameters`
// (with rope_theta inside or beside it), and an optional fp8 `quantization_config`. A missing
// required field, a value of the wrong type, or a value fanout does not implement (another
// scoring function, activation, rope type, quantization scheme) is an Error that names the field
// and the value found. Keys the model does not use are ignored. An optional key left out takes
// the default of HF's DeepseekV3Config (V3's own value: 256 routed experts, 1 shared, 8 groups,
// top-4 groups, 8 per token, scaling 2.5, the first 3 layers dense, q LoRA rank 1536), so a
// checkpoint loads as transformers loads it; `null` is HF's None where HF gives it a meaning.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fanout::io {

struct YarnConfig {
    double factor = 1.0;
    int64_t original_max_position_embeddings = 4096;
    double beta_fast = 32.0;
    double beta_slow = 1.0;
    double mscale = 0.0;            // 0: absent (HF then scales cos/sin by mscale(factor, 1))
    double mscale_all_dim = 0.0;    // 0: absent
    double attention_factor = 0.0;  // > 0: given explicitly, overrides the mscale ratio
    bool truncate = true;
};

struct Fp8QuantConfig {
    int64_t block_n = 128;  // weight_block_size[0]: output rows per scale
    int64_t block_k = 128;  // weight_block_size[1]: input columns per scale
};

struct ModelConfig {
    int64_t vocab_size = 0;
    int64_t hidden_size = 0;
    int64_t intermediate_size = 0;
    int64_t moe_intermediate_size = 0;
    int64_t num_hidden_layers = 0;
    int64_t num_nextn_predict_layers = 0;
    int64_t num_attention_heads = 0;
    int64_t n_shared_experts = 0;
    int64_t n_routed_experts = 0;
    int64_t num_experts_per_tok = 0;
    int64_t n_group = 1;
    int64_t topk_group = 1;
    int64_t first_k_dense_replace = 0;
    bool norm_topk_prob = true;
    double routed_scaling_factor = 1.0;
    int64_t q_lora_rank = 0;  // 0: no q low-rank projection (q_proj)
    int64_t kv_lora_rank = 0;
    int64_t qk_nope_head_dim = 0;
    int64_t qk_rope_head_dim = 0;
    int64_t v_head_dim = 0;
    int64_t max_position_embeddings = 0;
    double rms_norm_eps = 1e-6;
    double rope_theta = 10000.0;
    std::optional<YarnConfig> yarn;
    bool tie_word_embeddings = false;
    std::vector<int64_t> eos_token_ids;  // each in [0, vocab_size); empty: none given
    int64_t bos_token_id = -1;           // in [0, vocab_size); -1: none given
    std::optional<Fp8QuantConfig> fp8;

    int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
    // Values per token per layer in the latent KV cache.
    int64_t kv_entry_dim() const { return kv_lora_rank + qk_rope_head_dim; }
    bool is_moe_layer(int64_t layer) const { return n_routed_experts > 0 && layer >= first_k_dense_replace; }
    // Softmax scale, with YaRN's mscale(mscale_all_dim)^2 correction.
    double softmax_scale() const;
    // YaRN's factor on cos/sin: mscale(factor, mscale) / mscale(factor, mscale_all_dim); 1 without YaRN.
    double rope_attention_factor() const;
};

ModelConfig parse_model_config(const std::string& json_text, const std::string& label);
ModelConfig load_model_config(const std::string& model_dir);
// The config.json text for a config (what make-model writes).
std::string model_config_to_json(const ModelConfig& config);

}  // namespace fanout::io

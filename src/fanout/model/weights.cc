#include "fanout/model/weights.h"

#include "fanout/ops/fp8_quant.h"

namespace fanout::model {
namespace {

using io::Checkpoint;
using ops::LinearWeight;

constexpr std::initializer_list<DType> kFloatTypes = {DType::kBF16, DType::kF16, DType::kF32};

Tensor load_norm(const Checkpoint& ck, const std::string& name, int64_t dim) {
    Tensor src = ck.get(name, kFloatTypes, {dim});
    Tensor out = Tensor::zeros({dim}, DType::kF32);
    convert_to_f32(src.data(), src.dtype(), static_cast<size_t>(dim), out.data_as<float>());
    return out;
}

// `prefix`.weight [out, in], in a float dtype or fp8 with `prefix`.weight_scale_inv.
LinearWeight load_linear(const Checkpoint& ck, const std::string& prefix, int64_t out, int64_t in) {
    const std::string name = prefix + ".weight";
    Tensor w = ck.get(name, {DType::kBF16, DType::kF16, DType::kF32, DType::kFP8E4M3}, {out, in});
    LinearWeight lw;
    lw.dtype = w.dtype();
    lw.data = w.data();
    lw.out_features = out;
    lw.in_features = in;
    if (w.dtype() == DType::kFP8E4M3) {
        const std::string sname = prefix + ".weight_scale_inv";
        FANOUT_CHECK(ck.has(sname), "{}: fp8 tensor '{}' has no '{}' beside it", ck.file_of(name), name, sname);
        Tensor s = ck.get(sname, {DType::kF32},
                          {ops::ceil_div(out, ops::kFp8Block), ops::ceil_div(in, ops::kFp8Block)});
        lw.scale_inv = s.data_as<float>();
    }
    return lw;
}

MlpWeights load_mlp(const Checkpoint& ck, const std::string& prefix, int64_t hidden, int64_t inter) {
    return {load_linear(ck, prefix + ".gate_proj", inter, hidden), load_linear(ck, prefix + ".up_proj", inter, hidden),
            load_linear(ck, prefix + ".down_proj", hidden, inter)};
}

AttentionWeights load_attention(const Checkpoint& ck, const std::string& p, const io::ModelConfig& c) {
    AttentionWeights a;
    const int64_t H = c.num_attention_heads, D = c.hidden_size;
    if (c.q_lora_rank > 0) {
        a.q_a = load_linear(ck, p + "q_a_proj", c.q_lora_rank, D);
        a.q_a_norm = load_norm(ck, p + "q_a_layernorm.weight", c.q_lora_rank);
        a.q_b = load_linear(ck, p + "q_b_proj", H * c.qk_head_dim(), c.q_lora_rank);
    } else {
        a.q_proj = load_linear(ck, p + "q_proj", H * c.qk_head_dim(), D);
    }
    a.kv_a = load_linear(ck, p + "kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope_head_dim, D);
    a.kv_a_norm = load_norm(ck, p + "kv_a_layernorm.weight", c.kv_lora_rank);
    a.kv_b = load_linear(ck, p + "kv_b_proj", H * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank);
    a.o = load_linear(ck, p + "o_proj", D, H * c.v_head_dim);
    return a;
}

LayerWeights load_layer(const Checkpoint& ck, int64_t layer, const io::ModelConfig& c, const ShardPlan& plan) {
    const std::string p = fmt::format("model.layers.{}.", layer);
    LayerWeights lw;
    lw.input_norm = load_norm(ck, p + "input_layernorm.weight", c.hidden_size);
    lw.post_norm = load_norm(ck, p + "post_attention_layernorm.weight", c.hidden_size);
    lw.attn = load_attention(ck, p + "self_attn.", c);
    // The MTP layer (index num_hidden_layers) is always an MoE layer when the model has experts.
    lw.is_moe = c.is_moe_layer(layer);
    if (!lw.is_moe) {
        lw.mlp = load_mlp(ck, p + "mlp", c.hidden_size, c.intermediate_size);
        return lw;
    }
    const int64_t E = c.n_routed_experts;
    MoeWeights& m = lw.moe;
    m.router = load_linear(ck, p + "mlp.gate", E, c.hidden_size);
    const std::string bias_name = p + "mlp.gate.e_score_correction_bias";
    m.bias = ck.has(bias_name) ? load_norm(ck, bias_name, E) : Tensor::zeros({E}, DType::kF32);
    m.expert_begin = plan.expert_begin(E);
    m.expert_end = plan.expert_end(E);
    for (int64_t e = m.expert_begin; e < m.expert_end; ++e)
        m.experts.push_back(load_mlp(ck, fmt::format("{}mlp.experts.{}", p, e), c.hidden_size,
                                     c.moe_intermediate_size));
    if (c.n_shared_experts > 0)
        m.shared = load_mlp(ck, p + "mlp.shared_experts", c.hidden_size, c.moe_intermediate_size * c.n_shared_experts);
    return lw;
}

}  // namespace

ModelWeights load_weights(io::Checkpoint checkpoint, const io::ModelConfig& c, const ShardPlan& plan,
                          const LoadProgress& progress) {
    FANOUT_CHECK(plan.tp_size == 1, "tensor-parallel attention (tp_size={}) is not implemented yet", plan.tp_size);
    FANOUT_CHECK(plan.ep_size >= 1 && plan.ep_rank >= 0 && plan.ep_rank < plan.ep_size &&
                     (c.n_routed_experts == 0 || c.n_routed_experts % plan.ep_size == 0),
                 "shard plan: ep_rank={} ep_size={} does not divide n_routed_experts={}", plan.ep_rank, plan.ep_size,
                 c.n_routed_experts);
    ModelWeights w;
    w.checkpoint = std::move(checkpoint);
    const Checkpoint& ck = w.checkpoint;
    const int64_t total = c.num_hidden_layers + c.num_nextn_predict_layers + 1;
    w.embed = ck.get("model.embed_tokens.weight", kFloatTypes, {c.vocab_size, c.hidden_size});
    w.final_norm = load_norm(ck, "model.norm.weight", c.hidden_size);
    if (ck.has("lm_head.weight") || !c.tie_word_embeddings) {
        w.lm_head = load_linear(ck, "lm_head", c.vocab_size, c.hidden_size);
    } else {
        w.lm_head = {w.embed.dtype(), w.embed.data(), c.vocab_size, c.hidden_size, nullptr};
    }
    if (progress) progress("embeddings and head", 1, total);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        w.layers.push_back(load_layer(ck, l, c, plan));
        if (progress) progress(fmt::format("layer {}", l), l + 2, total);
    }
    // HF writes num_nextn_predict_layers: 1 by default without MTP tensors; such a model has no MTP head.
    const std::string mtp_probe = fmt::format("model.layers.{}.eh_proj.weight", c.num_hidden_layers);
    if (c.num_nextn_predict_layers > 0 && ck.has(mtp_probe)) {
        const int64_t l = c.num_hidden_layers;
        const std::string p = fmt::format("model.layers.{}.", l);
        MtpWeights m;
        m.enorm = load_norm(ck, p + "enorm.weight", c.hidden_size);
        m.hnorm = load_norm(ck, p + "hnorm.weight", c.hidden_size);
        m.eh_proj = load_linear(ck, p + "eh_proj", c.hidden_size, 2 * c.hidden_size);
        m.layer = load_layer(ck, l, c, plan);
        m.head_norm = load_norm(ck, p + "shared_head.norm.weight", c.hidden_size);
        m.head = ck.has(p + "shared_head.head.weight") ? load_linear(ck, p + "shared_head.head", c.vocab_size, c.hidden_size)
                                                       : w.lm_head;
        m.embed = ck.has(p + "embed_tokens.weight")
                      ? ck.get(p + "embed_tokens.weight", kFloatTypes, {c.vocab_size, c.hidden_size})
                      : w.embed;
        w.mtp = std::move(m);
        if (progress) progress("mtp layer", total, total);
    }
    return w;
}

}  // namespace fanout::model

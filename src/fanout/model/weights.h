// ModelWeights: DeepSeek-V3's tensors bound from a checkpoint through a shard plan.
//
// Linear weights stay in the memory-mapped checkpoint (bf16/f16/f32, or fp8 with its
// weight_scale_inv); norms and the router bias are copied to f32. Every tensor's dtype and shape
// is checked against the config while binding, and every value once bound (one parallel pass over
// the mapping, bit tests only), so a wrong checkpoint fails at load with the tensor's name, file,
// and expected vs found values — never mid-forward.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fanout/core/parallel.h"
#include "fanout/io/checkpoint.h"
#include "fanout/io/model_config.h"
#include "fanout/ops/linear.h"

namespace fanout::model {

struct MlpWeights {
    ops::LinearWeight gate, up, down;
};

struct AttentionWeights {
    ops::LinearWeight q_a, q_b, q_proj;  // q_a/q_b with q_lora_rank, else q_proj
    Tensor q_a_norm;                     // [q_lora_rank] f32
    ops::LinearWeight kv_a;              // kv_a_proj_with_mqa: [kv_lora + rope, hidden]
    Tensor kv_a_norm;                    // [kv_lora] f32
    ops::LinearWeight kv_b;              // [H * (nope + v), kv_lora]
    ops::LinearWeight o;                 // [hidden, H * v]
};

struct MoeWeights {
    ops::LinearWeight router;  // mlp.gate: [E, hidden]
    Tensor bias;               // e_score_correction_bias: [E] f32
    int64_t expert_begin = 0, expert_end = 0;
    std::vector<MlpWeights> experts;  // [expert_end - expert_begin]: experts this rank holds
    std::optional<MlpWeights> shared;
};

struct LayerWeights {
    Tensor input_norm, post_norm;  // [hidden] f32
    AttentionWeights attn;
    bool is_moe = false;
    MlpWeights mlp;  // dense layers
    MoeWeights moe;  // MoE layers
};

struct MtpWeights {
    Tensor enorm, hnorm;        // [hidden] f32
    ops::LinearWeight eh_proj;  // [hidden, 2 * hidden]
    LayerWeights layer;
    Tensor head_norm;        // shared_head.norm
    ops::LinearWeight head;  // shared_head.head, or lm_head when absent
    Tensor embed;            // the layer's embed_tokens, or the model's when absent
};

// A weight whose values are still to be checked: no NaN or Inf (kFinite), or an fp8 block scale
// that must be finite and not negative (kScale).
struct WeightCheck {
    enum Kind { kFinite, kScale };
    std::string name;
    const void* data = nullptr;  // in the mapping
    DType dtype = DType::kF32;
    Shape shape;
    Kind kind = kFinite;
    size_t nbytes() const { return static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype); }
};

struct ModelWeights {
    io::Checkpoint checkpoint;  // keeps the mappings alive
    ParallelConfig parallel;    // what this rank holds: its experts, and at tp > 1 its attention heads
    // tp > 1: the rank's heads of q_b (or q_proj), kv_b and o_proj, copied out of the mapping as f32
    // (the values the dequant path computes with); the attention's LinearWeights point here.
    std::vector<Tensor> owned;
    Tensor embed;  // [vocab, hidden] in the checkpoint's dtype
    Tensor final_norm;
    ops::LinearWeight lm_head;
    std::vector<LayerWeights> layers;
    std::optional<MtpWeights> mtp;
    std::vector<std::string> unused_tensors;  // checkpoint tensors the model never reads (warned about)
    // The weights whose values load_weights left unchecked (LoadOptions::check_values false): the
    // GPU loader checks each as it streams it (check_weight_range), in binding order.
    std::vector<WeightCheck> unchecked;
};

// Where a load stands: the stage, tensors and bytes done of the total (bytes 0 when unknown).
struct LoadStatus {
    std::string what;
    int64_t tensors_done = 0, tensors_total = 0;
    double bytes_done = 0, bytes_total = 0;
};
using LoadProgress = std::function<void(const LoadStatus&)>;

struct LoadOptions {
    // false: bind only, leaving the value checks to the caller (ModelWeights::unchecked) — the GPU
    // loader, which reads every byte once anyway, checks them in its staging buffers.
    bool check_values = true;
    LoadProgress progress;
};

// Binds every tensor the model reads, and checks the checkpoint against the config: each tensor
// of a layer past num_hidden_layers + num_nextn_predict_layers (or at the MTP index without the
// MTP layer's eh_proj) is an Error, as is a missing tensor — e_score_correction_bias of every MoE
// layer included — or any NaN / Inf in a weight, or an fp8 weight_scale_inv that is not positive
// and finite (naming the tensor and the first bad element). Tensors the model never reads are a
// warning on stderr (rank 0 only), listed in ModelWeights::unused_tensors.
// `parallel`: which part this rank holds (core/parallel.h) — its block of routed experts, and at
// tp > 1 the heads [tp_rank·H/tp, (tp_rank+1)·H/tp) of every attention (q_b or q_proj rows, kv_b
// rows, o_proj columns: f32 copies in ModelWeights::owned); the latent projections, norms, router
// and shared expert are replicated.
ModelWeights load_weights(io::Checkpoint checkpoint, const io::ModelConfig& config, const ParallelConfig& parallel,
                          const LoadOptions& opts = {});

// Whether two bound tensors (or weights, scales included) hold the same values: dtype, shape and
// bytes, compared through the mapping. The MTP layer's embed_tokens and shared_head.head are copies
// of the model's in DeepSeek-V3's checkpoint; the GPU keeps one of each then.
bool same_bytes(const Tensor& a, const Tensor& b);
bool same_bytes(const ops::LinearWeight& a, const ops::LinearWeight& b);

// The first bad element among elements [0, count) of `check`'s tensor that start at element
// `first` and lie at `data` (a staging copy or the mapping), or -1.
int64_t first_bad_weight_value(const WeightCheck& check, const void* data, int64_t first, int64_t count);
// The Error for element `element` of `check`'s tensor (its value read from the mapping).
[[noreturn]] void fail_weight_value(const io::Checkpoint& ck, const WeightCheck& check, int64_t element);
// Checks `checks` over the mapping, split across threads; the Error names the first bad element
// in the order given. `progress` (optional) sees the bytes checked.
void check_weight_values(const io::Checkpoint& ck, const std::vector<WeightCheck>& checks,
                         const LoadProgress& progress = {});

}  // namespace fanout::model

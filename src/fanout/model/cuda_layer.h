// One DeepSeek-V3 decoder layer on the GPU: its weights in device memory and the kernel sequence
// that runs it over a step. CudaModel (deepseek_v3_cuda.h) runs every layer of a checkpoint with
// it; `fanout bench layer` runs one layer of random weights at V3's real widths with it, timing
// each kernel — so the benchmark measures exactly the code that serves.
//
// The layer is the CPU model's stages (deepseek_v3.h), as methods a schedule can call one by one
// (run() calls them in order):
//   attn_in:       input norm · fused q_a|kv_a GEMM · q_a norm · q_b GEMM · q split + RoPE ·
//                  kv norm + RoPE + cache append
//   attn_out:      k_b batched GEMM (absorbs W_UK into q) · MLA over the cache · v_b batched GEMM
//                  (both bf16, strided over the heads in place) — and, for prefill chunks
//                  (LayerStep::prefill_ctx; a step's decodes first, its chunks after them), the
//                  MHA form: gather the contexts' latents · kv_b GEMM · causal flash attention,
//                  every chunk in one launch — then o_proj GEMM (+ residual) · post norm
//   gate:          router GEMM (f32) · top-k (MoE layers)
//   dispatch_send: the routed experts' rows leave: with every expert on this GPU the local
//                  permute (moe_permute.h: a masked part capped per expert for decode steps, the
//                  rest contiguous); under expert parallelism the EP backend's dispatch send
//   shared:        the shared expert (the dense MLP in dense layers): gate|up GEMM ·
//                  silu·mul(·quant) · down GEMM (+ residual) — while dispatch is in flight; run()
//                  puts a MoE layer's on a side stream beside the gate, dispatch and experts
//   experts:       (EP: dispatch receive) · grouped gate|up · silu·mul·quant · grouped down ·
//                  (EP: combine send)
//   combine:       the weighted sum into the residual: the local un-permute, or the EP backend's
//                  combine receive adding into it (ExpertParallel::combine_recv_add)
// Norms in front of FP8 projections write the quantized input too (one kernel, no act_quant).
//
// Expert parallelism is a backend (comm/ep.h) handed to set_expert_parallel(): the GPU backends
// (nvlink, nccl) or `fanout bench layer`'s emulated one. Without one, this GPU holds every expert
// and the local permute stands in for dispatch (its capped-masked + contiguous layout bounds the
// buffers for prefill-sized steps, which a backend's all-masked receive layout could not).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

#include "fanout/comm/ep.h"
#include "fanout/core/cuda_check.h"
#include "fanout/core/error.h"
#include "fanout/io/model_config.h"
#include "fanout/model/weights.h"
#include "fanout/ops/device_array.h"
#include "fanout/ops/device_context.h"
#include "fanout/ops/gemm.h"
#include "fanout/ops/mla_attention_cuda.h"
#include "fanout/ops/model_glue_cuda.h"
#include "fanout/ops/rope.h"

namespace fanout::model {

using ops::DeviceArray;

// A projection as the GPU runs it, [batch, N, K]: FP8 with 128×128 block scales, or bf16.
struct DeviceWeight {
    bool fp8 = false;
    int64_t batch = 1, N = 0, K = 0;
    DeviceArray<uint8_t> q;      // fp8 [batch, N, K]
    DeviceArray<float> scale;    // fp8 [batch, ceil(N/128), ceil(K/128)]
    DeviceArray<uint16_t> bf16;  // bf16 [batch, N, K]
};

struct DeviceLayer {
    DeviceArray<float> input_norm, post_norm, q_a_norm, kv_a_norm;
    DeviceWeight qkv_a;  // [q_lora + kv_lora + rope, D], or kv_a alone without q_lora
    DeviceWeight q_b;    // q_b, or q_proj without q_lora
    DeviceWeight k_b;    // [H][kv_lora][nope] bf16: W_UK[h]ᵀ, the absorbed form's query projection
    DeviceWeight v_b;    // [H][v][kv_lora] bf16
    DeviceWeight kv_b;   // [H · (nope + v), kv_lora]: the MHA form's expansion of the latent (prefill)
    DeviceWeight o;
    bool moe = false;
    bool has_mlp = false;
    DeviceWeight gate_up, down;    // the dense MLP, or the shared expert
    DeviceArray<uint16_t> router;  // [E, D] bf16
    DeviceArray<float> router_bias;
    bool has_bias = false;
    DeviceWeight experts_gate_up, experts_down;  // [E_local][2I][D], [E_local][D][I]
};

// A layer of random FP8 weights at config c's widths holding `num_local_experts` routed experts
// (the benchmark's one rank of EP-N), generated on the device.
DeviceLayer random_layer(const io::ModelConfig& c, bool moe, int64_t num_local_experts, uint64_t seed);

// A step as one layer reads it: device pointers to the step's metadata (see MlaAttentionParams).
struct LayerStep {
    int T = 0, R = 0, max_q = 1;  // max_q: at least the longest query (a microbatch: the whole step's)
    const int32_t* positions = nullptr;
    const int32_t* slots = nullptr;
    const int32_t* query_start = nullptr;
    const int32_t* kv_len = nullptr;
    const int32_t* block_table = nullptr;
    int max_blocks = 0;
    // > 0: the step's last requests, [mha_request, R) — tokens [mha_row, T) — are prefill chunks
    // whose contexts (each one's cached prefix and its chunk) are this many keys in all: their
    // attention runs in the MHA form (the contexts' latents gathered back to back at kv_start, kv_b
    // expands them, one launch for all of them); the requests before them (decodes, listed first)
    // run the absorbed form in the same step. 0: every request in the absorbed form (decode, MTP
    // verification, contexts past the MHA buffers).
    int prefill_ctx = 0;
    int mha_request = 0, mha_row = 0;
    int mha_max_q = 0;                         // the longest of those chunks
    int absorbed_max_q = 0;                    // the longest query among requests [0, mha_request)
    const int32_t* kv_start = nullptr;         // device, R − mha_request + 1 key offsets of those requests
    const int32_t* mha_query_start = nullptr;  // device, their R − mha_request + 1 query offsets from mha_row
    // T on the device, where an EP backend reads it (expert parallelism only).
    const int32_t* num_tokens = nullptr;
    // Tokens per local expert the grouped GEMMs should expect under expert parallelism (picks
    // their tile); 0: estimated from this rank's T.
    int expected_m = 0;
};

// Tokens per expert a step of T tokens on each of `ranks` ranks gives on average, at least 1 (one
// division, so T · top-k · ranks not a multiple of n_routed rounds down once): what the layer
// plans the grouped GEMMs' tile for when LayerStep::expected_m is 0, and what the benchmarks set it
// to.
int expected_tokens_per_expert(const io::ModelConfig& c, int64_t T, int ranks = 1);

// Called after each kernel (group) with its name — the benchmark records an event there.
using KernelMark = std::function<void(const char* name)>;

// The limits a CudaLayerExec's step buffers are sized for.
struct LayerLimits {
    int64_t max_tokens = 0;         // tokens of one step
    int64_t max_masked_tokens = 0;  // steps up to this many tokens (decode) use the capped masked layout
    int64_t num_local_experts = 0;  // routed experts of each layer on this GPU
    // Rows per local expert an EP backend delivers; 0: no backend (the local permute's buffers,
    // which an exec for a backend does not make).
    int64_t max_dispatch_m = 0;
    int64_t max_prefill_ctx = 0;  // MHA-form prefill over contexts of up to this many tokens (0: never)
    // The MHA form's expansion buffers (the contexts' latents and kv_b's output, ~1 GB at V3's
    // widths and 16,384 keys) are another exec's, lent by share_mha_buffers(): not allocated here.
    bool mha_buffers_lent = false;
    bool fp8_experts = true;  // the experts run FP8 (else bf16): only that kind's buffers are made
    // MoE layers with a shared expert: a side stream's DeviceContext for it, GEMM scratch only
    // (run() puts it beside the dispatch). False for an exec that only runs through
    // run_microbatched, on one stream.
    bool shared_beside = true;
};

class CudaLayerExec {
  public:
    // Buffers for steps of up to max_tokens tokens; steps of up to max_masked_tokens (the decode
    // batches) put their routed experts' rows in the masked layout, capped per expert by
    // ops::moe_masked_cap, with the rest contiguous — larger steps all contiguous (cap 0; see
    // moe_permute.h) — so the experts' buffers grow with the tokens, not with experts × tokens.
    // Launches on ctx (its stream, cuBLASLt, GEMM and MLA scratch), which must outlive the exec:
    // one context per exec that may run while another does (a microbatch each).
    CudaLayerExec(const io::ModelConfig& c, const ops::RopeTable& rope, const LayerLimits& limits,
                  ops::DeviceContext& ctx);
    ~CudaLayerExec();
    // The device bytes the constructor allocates for these limits (its step buffers; the
    // context's workspaces are ops::DeviceContext::workspace_bytes()), so a memory plan can count
    // them before anything is allocated.
    static size_t buffer_bytes(const io::ModelConfig& c, const LayerLimits& limits);
    // The routed experts of every later step go through `ep` (its rows per expert at most
    // max_dispatch_m; widths, top-k and experts matching the model); nullptr: the local permute.
    void set_expert_parallel(comm::ExpertParallel* ep);
    // Uses owner's MHA-form expansion buffers (limits.mha_buffers_lent; owner's cover this exec's
    // max_prefill_ctx). Both execs must launch on one stream, so their attention stages run in
    // turn (the two-microbatch schedule's execs do).
    void share_mha_buffers(const CudaLayerExec& owner);
    comm::ExpertParallel* expert_parallel() const { return ep_; }

    // The whole layer: every stage in order. hidden [T, D] bf16 (the residual stream) is updated
    // in place; cache is this layer's. A step of T = 0 (a rank without requests under expert
    // parallelism) runs only the experts' exchange and this rank's experts on what it received.
    // Once per step, before its first layer (on the stream: inside a captured step too): the
    // step-wide constants every layer reads.
    void begin_step(const LayerStep& step);
    void run(const DeviceLayer& w, const LayerStep& step, uint16_t* hidden, ops::DeviceLatentCache cache,
             const KernelMark& mark = {});
    // The stages (see the top), for schedules that interleave them.
    void attn_in(const DeviceLayer& w, const LayerStep& step, uint16_t* hidden, ops::DeviceLatentCache cache,
                 const KernelMark& mark = {});
    void attn_out(const DeviceLayer& w, const LayerStep& step, uint16_t* hidden, ops::DeviceLatentCache cache,
                  const KernelMark& mark = {});
    void gate(const DeviceLayer& w, const LayerStep& step, const KernelMark& mark = {});
    void dispatch_send(const DeviceLayer& w, const LayerStep& step, const KernelMark& mark = {});
    void shared(const DeviceLayer& w, const LayerStep& step, uint16_t* hidden, const KernelMark& mark = {});
    void experts(const DeviceLayer& w, const LayerStep& step, const KernelMark& mark = {});
    void combine(const DeviceLayer& w, const LayerStep& step, uint16_t* hidden, const KernelMark& mark = {});

    // y [M, w.N] = x [M, w.K] · wᵀ on the exec's stream, through its quantization buffers: a
    // projection outside the layers (the MTP layer's eh_proj, K = 2 · hidden).
    void project(const DeviceWeight& w, const uint16_t* x, int M, uint16_t* y) { linear(ctx_, w, x, M, y); }

  private:
    struct Buffers;
    // The local permute runs only in an exec made without an EP backend's rows (it has no buffers
    // for it otherwise).
    void check_local_permute() const;
    // Attention of requests [0, R) — tokens [0, T), at most max_q each — in the absorbed form;
    // the attention kernel's mark is `attention_mark`.
    void attend_absorbed(const DeviceLayer& w, const LayerStep& st, int T, int R, int max_q,
                         ops::DeviceLatentCache cache, const char* attention_mark, const KernelMark& mark);
    // Attention of the step's prefill chunks (requests from st.mha_request) in the MHA form.
    void attend_mha(const DeviceLayer& w, const LayerStep& st, ops::DeviceLatentCache cache, const KernelMark& mark);
    // On cx (ctx_, or side_ for the shared expert beside the dispatch).
    void linear(ops::DeviceContext& cx, const DeviceWeight& w, const uint16_t* x, int M, uint16_t* y,
                const uint16_t* residual = nullptr);
    // The order of x's scales that the FP8 GEMM of `w` over M rows reads fastest (gemm.h's
    // gemm_fp8_scale_order); over several readers of one quantized input, M-major only when all
    // of them want it.
    ops::ScaleOrder scale_order(const DeviceWeight& w, int M) const;
    ops::ScaleOrder scale_order(std::initializer_list<const DeviceWeight*> readers, int M) const;
    // hidden += down(silu(gate) · up) of the post norm's output: w's dense MLP or shared expert, on cx.
    void mlp(ops::DeviceContext& cx, const DeviceLayer& w, int T, uint16_t* hidden, const KernelMark& mark);
    struct ExpertRows;
    // The routed experts' grouped GEMMs over `rows` (gate|up, silu·mul(·quant), down into
    // expert_out); FP8 experts read xq / xs, bf16 experts x.
    void expert_mlp(const DeviceLayer& w, const ExpertRows& rows, const uint16_t* x, const uint8_t* xq, const float* xs,
                    const KernelMark& mark);
    // Whether the post norm quantized its output for the MLP / experts (FP8 weights).
    static bool post_quantized(const DeviceLayer& w);
    // y = x · w[e]ᵀ over the experts' rows: the masked part, then the spill blocks; FP8 weights
    // read xq / xs (already quantized), bf16 weights x.
    void expert_gemm(const DeviceWeight& w, const ExpertRows& rows, const uint16_t* x, const uint8_t* xq,
                     const float* xs, uint16_t* y);

    io::ModelConfig c_;
    int64_t num_local_ = 0, max_masked_tokens_ = 0, max_prefill_ctx_ = 0, max_dispatch_m_ = 0, max_tokens_ = 0;
    comm::ExpertParallel* ep_ = nullptr;
    bool fp8_experts_ = true;
    bool mha_buffers_lent_ = false;
    float rope_factor_ = 1.0f;
    // The attention's widths as the kernels take them.
    struct Dims {
        int hidden, heads, nope, rope, kv_lora, v_head, q_lora;
    } dims_;
    ops::DeviceContext& ctx_;
    cudaStream_t stream_ = nullptr;
    // MoE layers with a shared expert: the side stream's context (its own scratch: the shared
    // expert's GEMMs run while the router's do) and the events that fork it from the stream and
    // join it back (run()).
    std::unique_ptr<ops::DeviceContext> side_;
    cudaEvent_t fork_ = nullptr, join_ = nullptr;
    std::unique_ptr<Buffers> b_;
};

// One microbatch of the two-microbatch schedule: its exec (step buffers and EP backend — each
// microbatch its own, so both can be in flight), its step, residual stream and cache layer.
struct Microbatch {
    CudaLayerExec* exec = nullptr;
    LayerStep step;
    uint16_t* hidden = nullptr;
    ops::DeviceLatentCache cache;
};

// Two microbatches through one layer on one stream, stage by stage (the seed's two-microbatch
// schedule, as the CPU model's run_microbatched): both attentions, each ending in its dispatch
// send; then each one's shared expert and experts — the first's while the second's tokens are in
// flight — each ending in its combine send; then both combines. The backends' sends only enqueue
// (ep_gpu.h), so what one microbatch has in flight overlaps the other's kernels. A microbatch of
// T = 0 takes part in every exchange (expert parallelism) and computes nothing else.
void run_microbatched(const DeviceLayer& w, const std::array<Microbatch, 2>& mb, const KernelMark& mark = {});

}  // namespace fanout::model

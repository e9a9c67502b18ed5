#include "fanout/model/cuda_layer.h"

#include <algorithm>
#include <optional>

#include "fanout/kv/paged_kv_cache.h"
#include "fanout/ops/fp8_quant.h"
#include "fanout/ops/grouped_gemm_cuda.h"
#include "fanout/ops/mha_prefill_cuda.h"
#include "fanout/ops/model_glue_cuda.h"
#include "fanout/ops/moe_permute.h"
#include "fanout/ops/moe_router_cuda.h"
#include "fanout/ops/rms_norm.h"

namespace fanout::model {
namespace {

// HF and DeepSeek build q_a_layernorm and kv_a_layernorm with the default eps (as the CPU model).
constexpr float kLatentNormEps = 1e-6f;

// Random FP8 weights with scales around 1/(4·sqrt(K)), so activations keep their magnitude.
DeviceWeight random_weight(int64_t batch, int64_t N, int64_t K, uint64_t seed) {
    DeviceWeight d;
    d.fp8 = true;
    d.batch = batch;
    d.N = N;
    d.K = K;
    const size_t n = static_cast<size_t>(batch * N * K);
    const size_t nb = static_cast<size_t>(batch * ops::ceil_div(N, ops::kFp8Block) * ops::ceil_div(K, ops::kFp8Block));
    d.q = DeviceArray<uint8_t>(n);
    d.scale = DeviceArray<float>(nb);
    const float s = 0.25f / std::sqrt(static_cast<float>(K));
    ops::launch_random_fp8(d.q.get(), n, seed, nullptr);
    ops::launch_random_f32(d.scale.get(), nb, 0.5f * s, 1.5f * s, seed + 1, nullptr);
    return d;
}

// Random bf16 weights (the absorbed attention's per-head k_b / v_b) of magnitude ~1/sqrt(K).
DeviceWeight random_bf16_weight(int64_t batch, int64_t N, int64_t K, uint64_t seed) {
    DeviceWeight d;
    d.batch = batch;
    d.N = N;
    d.K = K;
    d.bf16 = DeviceArray<uint16_t>(static_cast<size_t>(batch * N * K));
    ops::launch_random_bf16(d.bf16.get(), d.bf16.size(), 1.0f / std::sqrt(static_cast<float>(K)), seed, nullptr);
    return d;
}

DeviceArray<float> random_norm(int64_t n, uint64_t seed) {
    DeviceArray<float> d(static_cast<size_t>(n));
    ops::launch_random_f32(d.get(), d.size(), 0.5f, 1.5f, seed, nullptr);
    return d;
}

}  // namespace

DeviceLayer random_layer(const io::ModelConfig& c, bool moe, int64_t num_local_experts, uint64_t seed) {
    DeviceLayer d;
    const int64_t D = c.hidden_size, H = c.num_attention_heads, C = c.kv_lora_rank;
    const int64_t nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim, V = c.v_head_dim;
    d.input_norm = random_norm(D, seed);
    d.post_norm = random_norm(D, seed + 1);
    d.kv_a_norm = random_norm(C, seed + 2);
    d.q_a_norm = random_norm(std::max<int64_t>(c.q_lora_rank, 1), seed + 3);
    d.qkv_a = random_weight(1, c.q_lora_rank + C + rope, D, seed + 10);
    d.q_b = random_weight(1, H * (nope + rope), c.q_lora_rank > 0 ? c.q_lora_rank : D, seed + 20);
    d.k_b = random_bf16_weight(H, C, nope, seed + 30);
    d.v_b = random_bf16_weight(H, V, C, seed + 40);
    d.kv_b = random_weight(1, H * (nope + V), C, seed + 45);
    d.o = random_weight(1, D, H * V, seed + 50);
    d.moe = moe;
    d.has_mlp = true;
    const int64_t I = moe ? c.moe_intermediate_size * c.n_shared_experts : c.intermediate_size;
    d.gate_up = random_weight(1, 2 * I, D, seed + 60);
    d.down = random_weight(1, D, I, seed + 70);
    if (moe) {
        const int64_t E = c.n_routed_experts, Ie = c.moe_intermediate_size;
        d.router = DeviceArray<uint16_t>(static_cast<size_t>(E * D));
        ops::launch_random_bf16(d.router.get(), d.router.size(), 0.05f, seed + 80, nullptr);
        d.router_bias = random_norm(E, seed + 81);
        d.has_bias = true;
        d.experts_gate_up = random_weight(num_local_experts, 2 * Ie, D, seed + 90);
        d.experts_down = random_weight(num_local_experts, D, Ie, seed + 100);
    }
    FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
    return d;
}

// Step buffers, sized once for max_tokens.
struct CudaLayerExec::Buffers {
    DeviceArray<uint16_t> normed, qkv, q_a, q, q_pe, q_lat, o_lat, attn, gate_up, act;
    // One projection's FP8 input: x quantized, and its scales in the order `xs_order` that its
    // quantization wrote them in — the order its dense GEMM reads without a transpose
    // (scale_order), row-major when only the routed experts read them.
    DeviceArray<uint8_t> xq;
    ops::ScaleOrder xs_order = ops::ScaleOrder::kRowMajor;
    DeviceArray<float> xs, router_logits, topk_weight;
    // The routed experts' scales of the post norm's xq, row-major (their tokens carry them): xs
    // itself, or xs_rows, a copy the post norm also writes when xs is M-major for the shared
    // experts' GEMM.
    DeviceArray<float> xs_rows;
    const float* routed_xs = nullptr;
    DeviceArray<int32_t> topk_idx, counts, fill_t, slot, spill_block_expert;
    // The routed experts' rows (moe_permute.h's layout; the GEMMs' outputs also an EP backend's
    // receive layout). expert_gate_up is a view of expert_out's memory (buffer_elems).
    DeviceArray<uint8_t> perm_q, expert_act_q;
    DeviceArray<float> perm_s, expert_act_s;
    DeviceArray<uint16_t> perm_bf16, expert_gate_up, expert_act, expert_out;
    // The shared expert's quantized activation (MoE layers): its own, as it runs beside the
    // dispatch (which reads xq / xs) on the side stream.
    DeviceArray<uint8_t> shared_q;
    DeviceArray<float> shared_s;
    DeviceArray<float> inv_freq;
    DeviceArray<uint16_t> latent, k_pe,
        kv_expanded;  // MHA-form prefill: [ctx, kv_lora], [ctx, rope], [ctx, H·(nope+v)]
};

// The routed experts' rows of one step as the grouped GEMMs see them (moe_permute.h): max_m rows
// per expert in the masked part, then spill_rows contiguous ones in 128-row blocks.
struct CudaLayerExec::ExpertRows {
    int num_experts = 0;                    // local experts: the weights' batch
    int max_m = 0;                          // masked rows per expert (0: no masked part)
    const int32_t* counts = nullptr;        // [num_experts] on the device, clamped to max_m by the kernels
    int expected_m = 1;                     // tokens per expert expected: picks the masked GEMM's tile
    int spill_rows = 0;                     // contiguous rows after the masked part (0: none)
    const int32_t* block_expert = nullptr;  // [spill_rows / 128] on the device, -1: unused block
    int64_t max_stored = 0;                 // a bound on the masked part's stored rows (0: none known)

    int64_t masked_rows() const { return static_cast<int64_t>(num_experts) * max_m; }
};

namespace {

// The experts' layout of a step of T tokens: capped masked rows (ops::moe_masked_cap) for the
// decode-sized steps, up to max_masked_tokens; cap 0, all contiguous, beyond.
struct ExpertLayout {
    int64_t cap = 0, spill_rows = 0;
};

ExpertLayout expert_layout(const io::ModelConfig& c, int64_t T, int64_t max_masked_tokens, int64_t num_local) {
    const int64_t K = c.num_experts_per_tok;
    const int64_t cap = T <= max_masked_tokens ? ops::moe_masked_cap(T, K, c.n_routed_experts) : 0;
    return {cap, ops::moe_spill_rows(T, K, num_local, cap)};
}

// The most expert rows (masked + spill) and spill rows any step of 1..max_tokens tokens needs.
struct ExpertRowLimits {
    int64_t rows = 0, spill_rows = 0;
};

ExpertRowLimits expert_row_limits(const io::ModelConfig& c, int64_t max_tokens, int64_t max_masked_tokens,
                                  int64_t num_local) {
    ExpertRowLimits l;
    const auto take = [&](int64_t T) {
        const ExpertLayout e = expert_layout(c, T, max_masked_tokens, num_local);
        l.rows = std::max(l.rows, num_local * e.cap + e.spill_rows);
        l.spill_rows = std::max(l.spill_rows, e.spill_rows);
    };
    // Masked steps: the cap and the spill bound move in steps of their own, so every size is taken.
    for (int64_t T = 1; T <= std::min(max_tokens, max_masked_tokens); ++T) take(T);
    // Contiguous steps: the spill bound grows with T.
    if (max_tokens > max_masked_tokens) take(max_tokens);
    return l;
}

// Whether the model's MoE layers have a shared expert, which then runs on a side stream beside the
// gate, top-k and dispatch send (CudaLayerExec::run).
bool runs_shared_beside(const io::ModelConfig& c) { return c.n_routed_experts > 0 && c.n_shared_experts > 0; }

// Element counts of every step buffer for a set of limits: the constructor allocates exactly
// these, and buffer_bytes() counts them for the memory plan before anything is allocated.
struct BufferElems {
    size_t normed, qkv, q_a, q, q_pe, q_lat, o_lat, attn, gate_up, act;  // bf16
    size_t latent, k_pe, kv_expanded;                                    // bf16, MHA prefill
    size_t xq, xs, xs_rows, router_logits, topk_idx, topk_weight, counts, fill_t, slot, spill_blocks;
    size_t perm_q, perm_s, expert_act_q, expert_act_s, perm_bf16, expert_act, expert_out;  // expert_out: gate/up too
    size_t shared_q, shared_s;
    size_t side_context;  // bytes: the side stream's DeviceContext (MoE layers with a shared expert)

    size_t bytes() const {
        const size_t bf16 = normed + qkv + q_a + q + q_pe + q_lat + o_lat + attn + gate_up + act + latent + k_pe +
                            kv_expanded + perm_bf16 + expert_act + expert_out;
        const size_t u8 = xq + perm_q + expert_act_q + shared_q;
        const size_t f32 = xs + xs_rows + router_logits + topk_weight + perm_s + expert_act_s + shared_s;
        const size_t i32 = topk_idx + counts + fill_t + slot + spill_blocks;
        return 2 * bf16 + u8 + 4 * (f32 + i32) + side_context;
    }
};

BufferElems buffer_elems(const io::ModelConfig& c, const LayerLimits& lim_in) {
    const int64_t max_tokens = lim_in.max_tokens, max_masked_tokens = lim_in.max_masked_tokens;
    const int64_t num_local_experts = lim_in.num_local_experts, max_dispatch_m = lim_in.max_dispatch_m;
    const int64_t max_prefill_ctx = lim_in.max_prefill_ctx;
    const bool fp8 = lim_in.fp8_experts;
    BufferElems n{};
    const size_t T = static_cast<size_t>(max_tokens), D = static_cast<size_t>(c.hidden_size);
    const size_t H = static_cast<size_t>(c.num_attention_heads), C = static_cast<size_t>(c.kv_lora_rank);
    const size_t nope = static_cast<size_t>(c.qk_nope_head_dim), rp = static_cast<size_t>(c.qk_rope_head_dim);
    const size_t Vh = static_cast<size_t>(c.v_head_dim), ql = static_cast<size_t>(std::max<int64_t>(c.q_lora_rank, 1));
    const size_t E = static_cast<size_t>(std::max<int64_t>(c.n_routed_experts, 1));
    const size_t EL = static_cast<size_t>(std::max<int64_t>(num_local_experts, 1));
    const size_t K = static_cast<size_t>(std::max<int64_t>(c.num_experts_per_tok, 1));
    const size_t Ie = static_cast<size_t>(c.moe_intermediate_size);
    const size_t I =
        static_cast<size_t>(std::max<int64_t>({c.intermediate_size, c.moe_intermediate_size * c.n_shared_experts, 1}));
    const size_t qkv_w = ql + C + rp, q_w = H * (nope + rp);
    n.normed = T * D;
    n.qkv = T * qkv_w;
    n.q_a = T * ql;
    n.q = T * q_w;
    n.q_pe = T * H * rp;
    n.q_lat = H * T * C;
    n.o_lat = H * T * C;
    n.attn = T * H * Vh;
    n.gate_up = T * 2 * I;
    n.act = T * I;
    // The quantized input of any projection (the widest is one of these; 2D: the MTP layer's
    // eh_proj, through project()), or of the MHA-form prefill's kv_b over its context.
    const size_t P = static_cast<size_t>(std::max<int64_t>(max_prefill_ctx, 0));
    n.xq = std::max(T * std::max({2 * D, qkv_w, q_w, H * Vh, I}), P * C);
    const size_t own = lim_in.mha_buffers_lent ? 0 : P;  // lent buffers: another exec's
    n.latent = own * C;
    n.k_pe = own * rp;
    n.kv_expanded = own * H * (nope + Vh);
    n.xs = n.xq / 16 + H * T * 2;  // one scale per 128 values of a row, rows of ≥ 16
    n.xs_rows = c.n_routed_experts > 0 && fp8 ? T * ((D + 127) / 128) : 0;
    n.router_logits = T * E;
    n.topk_idx = T * K;
    n.topk_weight = T * K;
    n.counts = EL;
    n.fill_t = 1;
    n.slot = T * K;
    if (c.n_routed_experts > 0) {
        const size_t nbD = static_cast<size_t>(ops::ceil_div(static_cast<int64_t>(D), ops::kFp8Block));
        const size_t nbI = static_cast<size_t>(ops::ceil_div(static_cast<int64_t>(Ie), ops::kFp8Block));
        // The local permute's rows, or with an EP backend (it always has one: set_expert_parallel
        // follows the constructor) its masked receive rows — at V3's EP8 the permute's rows the
        // backend never uses were ~150 MB a GPU.
        const bool ep = max_dispatch_m > 0;
        const ExpertRowLimits lim =
            ep ? ExpertRowLimits{} : expert_row_limits(c, max_tokens, max_masked_tokens, static_cast<int64_t>(EL));
        const size_t perm = static_cast<size_t>(lim.rows), received = EL * static_cast<size_t>(max_dispatch_m);
        const size_t rows = std::max(perm, received);
        n.spill_blocks = static_cast<size_t>(lim.spill_rows / ops::kMoeSpillBlock);
        // FP8 experts read quantized rows (perm_q/_s, expert_act_q/_s), bf16 experts bf16 ones.
        n.perm_q = fp8 ? perm * D : 0;
        n.perm_s = fp8 ? perm * nbD : 0;
        n.perm_bf16 = fp8 ? 0 : perm * D;
        n.expert_act_q = fp8 ? rows * Ie : 0;
        n.expert_act_s = fp8 ? rows * nbI : 0;
        n.expert_act = fp8 ? 0 : rows * Ie;
        // The gate/up outputs are dead once silu·mul has read them all, before the down projection
        // writes its first row, so they live in expert_out's memory (expert_mlp): one allocation of
        // the larger of the two. At V3's EP8 with 2,048 tokens a step that saves 4.3 GB per GPU.
        n.expert_out = rows * std::max(D, 2 * Ie);
    }
    if (runs_shared_beside(c)) {
        const size_t Is = static_cast<size_t>(c.moe_intermediate_size * c.n_shared_experts);
        n.shared_q = T * Is;
        n.shared_s = T * static_cast<size_t>(ops::ceil_div(static_cast<int64_t>(Is), ops::kFp8Block));
        n.side_context = lim_in.shared_beside ? ops::DeviceContext::workspace_bytes(ops::ContextScratch::kGemms) : 0;
    }
    return n;
}

}  // namespace

size_t CudaLayerExec::buffer_bytes(const io::ModelConfig& c, const LayerLimits& limits) {
    return buffer_elems(c, limits).bytes();
}

void CudaLayerExec::share_mha_buffers(const CudaLayerExec& owner) {
    FANOUT_CHECK(
        mha_buffers_lent_ && owner.b_->kv_expanded.get() != nullptr && owner.max_prefill_ctx_ >= max_prefill_ctx_,
        "share_mha_buffers: this exec must be made with LayerLimits::mha_buffers_lent and the owner's MHA "
        "buffers must cover its {} keys (the owner's: {}{})",
        max_prefill_ctx_, owner.max_prefill_ctx_, owner.mha_buffers_lent_ ? ", lent themselves" : "");
    FANOUT_CHECK(owner.stream_ == stream_,
                 "share_mha_buffers: both execs must launch on one stream (their attention stages run in turn)");
    const Buffers& o = *owner.b_;
    b_->latent = DeviceArray<uint16_t>::view(o.latent.get(), o.latent.size());
    b_->k_pe = DeviceArray<uint16_t>::view(o.k_pe.get(), o.k_pe.size());
    b_->kv_expanded = DeviceArray<uint16_t>::view(o.kv_expanded.get(), o.kv_expanded.size());
}

CudaLayerExec::CudaLayerExec(const io::ModelConfig& c, const ops::RopeTable& rope, const LayerLimits& limits,
                             ops::DeviceContext& ctx)
    : c_(c),
      num_local_(limits.num_local_experts),
      max_masked_tokens_(limits.max_masked_tokens),
      max_prefill_ctx_(limits.max_prefill_ctx),
      max_dispatch_m_(limits.max_dispatch_m),
      max_tokens_(limits.max_tokens),
      fp8_experts_(limits.fp8_experts),
      mha_buffers_lent_(limits.mha_buffers_lent),
      rope_factor_(rope.attention_factor),
      dims_{static_cast<int>(c.hidden_size),      static_cast<int>(c.num_attention_heads),
            static_cast<int>(c.qk_nope_head_dim), static_cast<int>(c.qk_rope_head_dim),
            static_cast<int>(c.kv_lora_rank),     static_cast<int>(c.v_head_dim),
            static_cast<int>(c.q_lora_rank)},
      ctx_(ctx),
      stream_(ctx.stream()),
      b_(std::make_unique<Buffers>()) {
    const cudaStream_t stream = stream_;
    Buffers& b = *b_;
    const BufferElems n = buffer_elems(c, limits);
    b.normed = DeviceArray<uint16_t>(n.normed);
    b.qkv = DeviceArray<uint16_t>(n.qkv);
    b.q_a = DeviceArray<uint16_t>(n.q_a);
    b.q = DeviceArray<uint16_t>(n.q);
    b.q_pe = DeviceArray<uint16_t>(n.q_pe);
    b.q_lat = DeviceArray<uint16_t>(n.q_lat);
    b.o_lat = DeviceArray<uint16_t>(n.o_lat);
    b.attn = DeviceArray<uint16_t>(n.attn);
    b.gate_up = DeviceArray<uint16_t>(n.gate_up);
    b.act = DeviceArray<uint16_t>(n.act);
    if (n.latent > 0) {
        b.latent = DeviceArray<uint16_t>(n.latent);
        b.k_pe = DeviceArray<uint16_t>(n.k_pe);
        b.kv_expanded = DeviceArray<uint16_t>(n.kv_expanded);
    }
    b.xq = DeviceArray<uint8_t>(n.xq);
    b.xs = DeviceArray<float>(n.xs);
    if (n.xs_rows > 0) b.xs_rows = DeviceArray<float>(n.xs_rows);
    b.routed_xs = b.xs.get();  // until a post norm says otherwise (an empty step's dispatch reads it too)
    b.router_logits = DeviceArray<float>(n.router_logits);
    b.topk_idx = DeviceArray<int32_t>(n.topk_idx);
    b.topk_weight = DeviceArray<float>(n.topk_weight);
    b.counts = DeviceArray<int32_t>(n.counts);
    b.fill_t = DeviceArray<int32_t>(n.fill_t);
    b.slot = DeviceArray<int32_t>(n.slot);
    if (c.n_routed_experts > 0) {
        b.spill_block_expert = DeviceArray<int32_t>(n.spill_blocks);
        b.perm_q = DeviceArray<uint8_t>(n.perm_q);
        b.perm_s = DeviceArray<float>(n.perm_s);
        b.expert_act_q = DeviceArray<uint8_t>(n.expert_act_q);
        b.expert_act_s = DeviceArray<float>(n.expert_act_s);
        b.perm_bf16 = DeviceArray<uint16_t>(n.perm_bf16);
        b.expert_act = DeviceArray<uint16_t>(n.expert_act);
        b.expert_out = DeviceArray<uint16_t>(n.expert_out);
        b.expert_gate_up = DeviceArray<uint16_t>::view(b.expert_out.get(), n.expert_out);
    }
    if (n.shared_q > 0) {
        b.shared_q = DeviceArray<uint8_t>(n.shared_q);
        b.shared_s = DeviceArray<float>(n.shared_s);
    }
    if (n.side_context > 0) {
        side_ = std::make_unique<ops::DeviceContext>(ops::ContextScratch::kGemms);
        FANOUT_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
        FANOUT_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
    }
    b.inv_freq = DeviceArray<float>(rope.inv_freq.size());
    b.inv_freq.upload(rope.inv_freq.data(), rope.inv_freq.size(), stream);  // on the layer's stream: ordered
    FANOUT_CUDA_CHECK(cudaStreamSynchronize(stream));
}

CudaLayerExec::~CudaLayerExec() {
    if (fork_ != nullptr) cudaEventDestroy(fork_);
    if (join_ != nullptr) cudaEventDestroy(join_);
}

void CudaLayerExec::linear(ops::DeviceContext& cx, const DeviceWeight& w, const uint16_t* x, int M, uint16_t* y,
                           const uint16_t* residual) {
    Buffers& b = *b_;
    if (w.fp8) {
        // x == nullptr: the input is already quantized in xq / xs (by the norm in front).
        if (x != nullptr) {
            b.xs_order = scale_order(w, M);
            ops::launch_act_quant_bf16(x, b.xq.get(), b.xs.get(), b.xs_order, M, static_cast<int>(w.K), cx.stream());
        }
        ops::launch_gemm_fp8(cx, b.xq.get(), b.xs.get(), b.xs_order, w.q.get(), w.scale.get(), y, M,
                             static_cast<int>(w.N), static_cast<int>(w.K), residual);
    } else {
        ops::launch_gemm_bf16(cx, x, w.bf16.get(), y, M, static_cast<int>(w.N), static_cast<int>(w.K), residual);
    }
}

ops::ScaleOrder CudaLayerExec::scale_order(const DeviceWeight& w, int M) const {
    return ops::gemm_fp8_scale_order(M, static_cast<int>(w.N), static_cast<int>(w.K), ctx_.sm_count());
}

ops::ScaleOrder CudaLayerExec::scale_order(std::initializer_list<const DeviceWeight*> readers, int M) const {
    // M-major only when every reader runs cuBLASLt; either order is right for every reader.
    for (const DeviceWeight* w : readers)
        if (scale_order(*w, M) == ops::ScaleOrder::kRowMajor) return ops::ScaleOrder::kRowMajor;
    return ops::ScaleOrder::kMMajor;
}

void CudaLayerExec::begin_step(const LayerStep& st) {
    // Every layer's MLP activation quantization (a masked kernel over one group of T rows) reads
    // this count: one fill per step, not one per layer.
    if (st.T > 0) ops::launch_fill_i32(b_->fill_t.get(), static_cast<int>(b_->fill_t.size()), st.T, stream_);
}

void CudaLayerExec::mlp(ops::DeviceContext& cx, const DeviceLayer& w, int T, uint16_t* hidden, const KernelMark& mark) {
    Buffers& b = *b_;
    const DeviceWeight &gu = w.gate_up, &down = w.down;
    const int I = static_cast<int>(gu.N / 2);
    // The post norm quantized its output for FP8 gate|up (post_quantized); the down projection's
    // input goes to buffers of the shared expert's own in MoE layers (run() may run it beside the
    // dispatch, which reads xq / xs), to xq / xs in dense ones.
    linear(cx, gu, post_quantized(w) && gu.fp8 ? nullptr : b.normed.get(), T, b.gate_up.get());
    if (mark) mark("shared_gate_up");
    if (down.fp8) {  // fill_t holds T (begin_step)
        uint8_t* q = w.moe ? b.shared_q.get() : b.xq.get();
        float* s = w.moe ? b.shared_s.get() : b.xs.get();
        FANOUT_CHECK(q != nullptr,
                     "a MoE layer with a shared expert, but the config's n_shared_experts is 0 (no buffers for it)");
        const ops::ScaleOrder order = scale_order(down, T);
        ops::launch_silu_mul_quant_masked(b.gate_up.get(), b.fill_t.get(), 1, T, I, q, s, order, cx.stream());
        if (mark) mark("shared_silu_quant");
        ops::launch_gemm_fp8(cx, q, s, order, down.q.get(), down.scale.get(), hidden, T, static_cast<int>(down.N), I,
                             hidden);
    } else {
        ops::launch_silu_mul_bf16(b.gate_up.get(), T, I, b.act.get(), cx.stream());
        if (mark) mark("shared_silu_quant");
        linear(cx, down, b.act.get(), T, hidden, hidden);
    }
    if (mark) mark("shared_down");
}

void CudaLayerExec::set_expert_parallel(comm::ExpertParallel* ep) {
    if (ep != nullptr) {
        const comm::EpConfig& e = ep->config();
        FANOUT_CHECK(e.num_experts == c_.n_routed_experts && e.experts_per_token == c_.num_experts_per_tok &&
                         e.hidden == c_.hidden_size,
                     "EP backend for {} experts, top-{}, hidden {}; the model has {}, top-{}, hidden {}", e.num_experts,
                     e.experts_per_token, e.hidden, c_.n_routed_experts, c_.num_experts_per_tok, c_.hidden_size);
        FANOUT_CHECK(e.local_experts() == num_local_,
                     "EP rank {} of {} holds {} experts, the layer buffers were sized for {}", e.rank, e.world,
                     e.local_experts(), num_local_);
        FANOUT_CHECK(
            e.rows_per_expert() <= max_dispatch_m_,
            "EP backend delivers up to {} rows per expert, the layer buffers hold {} (LayerLimits::max_dispatch_m)",
            e.rows_per_expert(), max_dispatch_m_);
        FANOUT_CHECK(e.max_tokens_per_rank == max_tokens_,
                     "EP backend sized for steps of {} tokens, the layer for {}: they must agree (its combine "
                     "writes the layer's residual rows)",
                     e.max_tokens_per_rank, max_tokens_);
        FANOUT_CHECK(ep->device_stream() == nullptr || ep->device_stream() == static_cast<void*>(stream_),
                     "EP backend (rank {} of {}) enqueues on another stream than the layer's: make it with the "
                     "model's stream (its dispatch must follow the layer's top-k)",
                     e.rank, e.world);
        FANOUT_CHECK(e.payload == (fp8_experts_ ? comm::Payload::kFp8 : comm::Payload::kBf16),
                     "EP backend carries {}, the experts run {}", e.payload == comm::Payload::kFp8 ? "fp8" : "bf16/f32",
                     fp8_experts_ ? "FP8" : "bf16");
    }
    ep_ = ep;
}

bool CudaLayerExec::post_quantized(const DeviceLayer& w) {
    return (w.has_mlp && w.gate_up.fp8) || (w.moe && w.experts_gate_up.fp8);
}

void CudaLayerExec::run(const DeviceLayer& w, const LayerStep& st, uint16_t* hidden, ops::DeviceLatentCache cache,
                        const KernelMark& mark) {
    attn_in(w, st, hidden, cache, mark);
    attn_out(w, st, hidden, cache, mark);
    // MoE layers: the shared expert on the side stream, beside the router GEMM, top-k, dispatch
    // and routed experts (the small kernels leave most SMs idle; joining before the grouped GEMMs
    // instead measured 7 µs slower at V3's EP8 batch 128, PERF.md); the combine waits for it. It
    // writes its own buffers and, last, hidden, which nothing before the combine reads. A marked
    // run (the benchmark's per-kernel table) keeps to one stream, each mark timing its own kernel.
    const bool beside = side_ != nullptr && !mark && w.moe && w.has_mlp && st.T > 0;
    if (beside) {
        FANOUT_CUDA_CHECK(cudaEventRecord(fork_, stream_));
        FANOUT_CUDA_CHECK(cudaStreamWaitEvent(side_->stream(), fork_));
        mlp(*side_, w, st.T, hidden, mark);
        FANOUT_CUDA_CHECK(cudaEventRecord(join_, side_->stream()));
    }
    gate(w, st, mark);
    dispatch_send(w, st, mark);
    if (!beside) shared(w, st, hidden, mark);
    experts(w, st, mark);
    if (beside) FANOUT_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_));
    combine(w, st, hidden, mark);
}

void run_microbatched(const DeviceLayer& w, const std::array<Microbatch, 2>& mb, const KernelMark& mark) {
    for (const Microbatch& m : mb) {  // the second's attention while the first's tokens are dispatched
        m.exec->attn_in(w, m.step, m.hidden, m.cache, mark);
        m.exec->attn_out(w, m.step, m.hidden, m.cache, mark);
        m.exec->gate(w, m.step, mark);
        m.exec->dispatch_send(w, m.step, mark);
    }
    for (const Microbatch& m : mb) {  // the first's experts while the second's tokens are dispatched
        m.exec->shared(w, m.step, m.hidden, mark);
        m.exec->experts(w, m.step, mark);
    }
    for (const Microbatch& m : mb) m.exec->combine(w, m.step, m.hidden, mark);
}

void CudaLayerExec::attn_in(const DeviceLayer& w, const LayerStep& st, uint16_t* hidden, ops::DeviceLatentCache cache,
                            const KernelMark& mark) {
    if (st.T == 0) return;
    Buffers& b = *b_;
    const auto m = [&](const char* name) {
        if (mark) mark(name);
    };
    const int T = st.T;
    const auto [D, H, nope, rope_dim, C, V, ql] = dims_;
    const float eps = static_cast<float>(c_.rms_norm_eps);
    // A norm in front of FP8 projections also quantizes its output for them (one kernel), and
    // xq / xs then hold that input until the next quantization.
    // quantize: the scale order its FP8 readers want, or none (no quantization).
    const auto norm = [&](const uint16_t* x, int64_t x_stride, const float* weight, float e, uint16_t* y,
                          int64_t y_stride, int width, std::optional<ops::ScaleOrder> quantize) {
        if (quantize) b.xs_order = *quantize;
        ops::launch_rms_norm_quant_bf16(x, x_stride, nullptr, weight, e, y, y_stride, quantize ? b.xq.get() : nullptr,
                                        quantize ? b.xs.get() : nullptr, b.xs_order, T, width, stream_);
    };
    const bool in_q = w.qkv_a.fp8;
    // The bf16 rows only where a projection reads them (the FP8 ones read xq / xs).
    const bool normed_read = !in_q || (ql <= 0 && !w.q_b.fp8);
    // Its FP8 readers: qkv_a, and q_proj too without a q LoRA.
    std::optional<ops::ScaleOrder> in_order;
    if (in_q) in_order = ql <= 0 && w.q_b.fp8 ? scale_order({&w.qkv_a, &w.q_b}, T) : scale_order(w.qkv_a, T);
    norm(hidden, D, w.input_norm.get(), eps, normed_read ? b.normed.get() : nullptr, D, D, in_order);
    m("input_norm");
    linear(ctx_, w.qkv_a, in_q ? nullptr : b.normed.get(), T, b.qkv.get());
    m("qkv_a");
    const int qkv_width = static_cast<int>(w.qkv_a.N);
    const uint16_t* kv_a = b.qkv.get() + std::max(ql, 0);
    if (ql > 0) {
        norm(b.qkv.get(), qkv_width, w.q_a_norm.get(), kLatentNormEps, w.q_b.fp8 ? nullptr : b.q_a.get(), ql, ql,
             w.q_b.fp8 ? std::optional(scale_order(w.q_b, T)) : std::nullopt);
        m("q_a_norm");
        linear(ctx_, w.q_b, w.q_b.fp8 ? nullptr : b.q_a.get(), T, b.q.get());
    } else {  // q_proj reads the input norm's output, still quantized in xq when qkv_a is FP8
        linear(ctx_, w.q_b, in_q && w.q_b.fp8 ? nullptr : b.normed.get(), T, b.q.get());
    }
    m("q_b");
    const ops::RopeDevice rd{b.inv_freq.get(), rope_dim, rope_factor_};
    const int t0 = st.prefill_ctx > 0 ? st.mha_row : T;  // rows [t0, T): prefill chunks in the MHA form
    if (st.prefill_ctx > 0) {
        FANOUT_CHECK(st.kv_start != nullptr && st.mha_query_start != nullptr && st.prefill_ctx <= max_prefill_ctx_ &&
                         b.kv_expanded.get() != nullptr && st.mha_request >= 0 && st.mha_request < st.R && t0 < T &&
                         st.prefill_ctx >= T - t0 && st.mha_max_q >= 1 && st.mha_max_q <= T - t0 &&
                         (t0 == 0 || st.absorbed_max_q >= 1),
                     "MHA-form prefill: chunks of requests {}..{} (tokens {}..{}) over contexts of {}..{} keys in all "
                     "with their offsets, got {} keys{}",
                     st.mha_request, st.R, t0, T, T - t0, max_prefill_ctx_, st.prefill_ctx,
                     st.kv_start && st.mha_query_start ? "" : " and no offsets");
        // The chunks' q rotated in place (the MHA form reads q as it is), their cache entries appended.
        const int64_t qw = nope + rope_dim;
        ops::launch_rope_q_inplace(b.q.get() + int64_t{t0} * H * qw, T - t0, H, nope, st.positions + t0, rd, stream_);
        ops::launch_mla_kv_append(kv_a + int64_t{t0} * qkv_width, qkv_width, T - t0, C, w.kv_a_norm.get(),
                                  kLatentNormEps, st.positions + t0, rd, st.slots + t0, cache, stream_);
    }
    if (t0 > 0)  // the absorbed form's rows: q's rope part into q_pe and the cache entry, one launch
        ops::launch_mla_q_rope_kv_append(b.q.get(), t0, H, nope, b.q_pe.get(), kv_a, qkv_width, C, w.kv_a_norm.get(),
                                         kLatentNormEps, st.positions, rd, st.slots, cache, stream_);
    m("latent_norm_rope_append");
}

void CudaLayerExec::attend_mha(const DeviceLayer& w, const LayerStep& st, ops::DeviceLatentCache cache,
                               const KernelMark& mark) {
    Buffers& b = *b_;
    const auto m = [&](const char* name) {
        if (mark) mark(name);
    };
    const auto [D, H, nope, rope_dim, C, V, ql] = dims_;
    // The chunks' contexts' latents, back to back, expanded by kv_b into per-head K and V; their
    // queries and outputs are rows [t0, T) of q and attn, their offsets from there.
    const int ctx = st.prefill_ctx, t0 = st.mha_row, R = st.R - st.mha_request;
    ops::launch_gather_latent(cache, st.block_table + int64_t{st.mha_request} * st.max_blocks, st.max_blocks,
                              static_cast<int>(kv::kDefaultBlockSize), st.kv_start, R, ctx, C, rope_dim, b.latent.get(),
                              b.k_pe.get(), stream_);
    linear(ctx_, w.kv_b, b.latent.get(), ctx, b.kv_expanded.get());
    m("kv_b_expand");
    ops::MhaPrefillParams p;
    p.num_tokens = st.T - t0;
    p.ctx_len = ctx;
    p.num_heads = H;
    p.nope = nope;
    p.rope = rope_dim;
    p.v_dim = V;
    p.scale = static_cast<float>(c_.softmax_scale());
    p.q_stride_t = static_cast<int64_t>(H) * (nope + rope_dim);
    p.q_stride_h = nope + rope_dim;
    p.q = b.q.get() + t0 * p.q_stride_t;
    p.k_nope = b.kv_expanded.get();  // [ctx, H, nope + v]: k_nope then v per head
    p.k_stride_t = static_cast<int64_t>(H) * (nope + V);
    p.k_stride_h = nope + V;
    p.k_pe = b.k_pe.get();
    p.k_pe_stride_t = rope_dim;
    p.v = b.kv_expanded.get() + nope;
    p.v_stride_t = p.k_stride_t;
    p.v_stride_h = p.k_stride_h;
    p.out_stride_t = static_cast<int64_t>(H) * V;
    p.out_stride_h = V;
    p.out = b.attn.get() + t0 * p.out_stride_t;  // [T, H, v]: o_proj's input as it is
    p.num_requests = R;
    p.max_query_len = st.mha_max_q;
    p.query_start = st.mha_query_start;
    p.kv_start = st.kv_start;
    ops::launch_mha_prefill(ctx_, p);
    m("attention");
}

void CudaLayerExec::attend_absorbed(const DeviceLayer& w, const LayerStep& st, int T, int R, int max_q,
                                    ops::DeviceLatentCache cache, const char* attention_mark, const KernelMark& mark) {
    Buffers& b = *b_;
    const auto m = [&](const char* name) {
        if (mark) mark(name);
    };
    const auto [D, H, nope, rope_dim, C, V, ql] = dims_;
    // k_b into q, MLA over the cache, v_b out — the per-head projections in bf16 (DeepSeek's
    // reference inference dequantizes kv_b for them too), cuBLASLt strided-batched: k_b reads each
    // head's nope part of q_b's output in place, q_lat [H, T, C].
    FANOUT_CHECK(!w.k_b.fp8 && !w.v_b.fp8, "the absorbed form runs k_b / v_b in bf16 (model/weight_plan.h)");
    const int64_t qw = nope + rope_dim;
    ops::launch_gemm_bf16_batched(ctx_, {H, T, C, nope, b.q.get(), int64_t{H} * qw, qw, w.k_b.bf16.get(), nope,
                                         int64_t{C} * nope, b.q_lat.get(), C, int64_t{T} * C});
    m("bmm_q_absorb");
    ops::MlaAttentionParams p;
    p.num_tokens = T;
    p.num_requests = R;
    p.num_heads = H;
    p.kv_lora = C;
    p.rope_dim = rope_dim;
    p.block_size = static_cast<int>(kv::kDefaultBlockSize);
    p.max_blocks = st.max_blocks;
    p.max_query_len = max_q;
    p.scale = static_cast<float>(c_.softmax_scale());
    p.query_start = st.query_start;  // requests [0, R) are the step's first: their offsets as they are
    p.kv_len = st.kv_len;
    p.positions = st.positions;
    p.block_table = st.block_table;
    p.cache = cache.bf16;
    p.cache_fp8 = cache.fp8;
    p.q_lat = b.q_lat.get();  // [H, T, C]
    p.q_lat_stride_t = C;
    p.q_lat_stride_h = static_cast<int64_t>(T) * C;
    p.q_pe = b.q_pe.get();  // [T, H, rope]
    p.q_pe_stride_t = static_cast<int64_t>(H) * rope_dim;
    p.q_pe_stride_h = rope_dim;
    p.out = b.o_lat.get();  // [H, T, C]
    p.out_stride_t = C;
    p.out_stride_h = static_cast<int64_t>(T) * C;
    ops::launch_mla_attention(p, &ctx_.mla_workspace(), stream_);
    m(attention_mark);
    // v_b writes o_proj's input [T, H, v] as it is.
    ops::launch_gemm_bf16_batched(ctx_, {H, T, V, C, b.o_lat.get(), C, int64_t{T} * C, w.v_b.bf16.get(), C,
                                         int64_t{V} * C, b.attn.get(), int64_t{H} * V, V});
    m("bmm_v");
}

void CudaLayerExec::attn_out(const DeviceLayer& w, const LayerStep& st, uint16_t* hidden, ops::DeviceLatentCache cache,
                             const KernelMark& mark) {
    if (st.T == 0) return;
    Buffers& b = *b_;
    const auto m = [&](const char* name) {
        if (mark) mark(name);
    };
    const int T = st.T;
    const auto [D, H, nope, rope_dim, C, V, ql] = dims_;
    if (st.prefill_ctx > 0) {
        attend_mha(w, st, cache, mark);
        if (st.mha_row > 0)  // the decodes before the chunks
            attend_absorbed(w, st, st.mha_row, st.mha_request, st.absorbed_max_q, cache, "decode_attention", mark);
    } else {
        attend_absorbed(w, st, T, st.R, st.max_q, cache, "attention", mark);
    }
    linear(ctx_, w.o, b.attn.get(), T, hidden, hidden);
    m("o_proj");
    const bool post_q = post_quantized(w);
    // The shared experts' GEMM takes the scales in its order; the routed experts take them
    // row-major (permute, EP dispatch), in xs or, beside M-major ones, in a copy.
    const bool routed_q = w.moe && w.experts_gate_up.fp8;
    if (post_q) b.xs_order = w.has_mlp && w.gate_up.fp8 ? scale_order(w.gate_up, T) : ops::ScaleOrder::kRowMajor;
    float* rows_copy = routed_q && b.xs_order == ops::ScaleOrder::kMMajor ? b.xs_rows.get() : nullptr;
    b.routed_xs = rows_copy != nullptr ? rows_copy : b.xs.get();
    ops::launch_rms_norm_quant_bf16(hidden, D, nullptr, w.post_norm.get(), static_cast<float>(c_.rms_norm_eps),
                                    b.normed.get(), D, post_q ? b.xq.get() : nullptr, post_q ? b.xs.get() : nullptr,
                                    b.xs_order, T, D, stream_, rows_copy);
    m("post_norm");
}

void CudaLayerExec::gate(const DeviceLayer& w, const LayerStep& st, const KernelMark& mark) {
    if (!w.moe || st.T == 0) return;
    Buffers& b = *b_;
    const int T = st.T, D = static_cast<int>(c_.hidden_size);
    const int E = static_cast<int>(c_.n_routed_experts), K = static_cast<int>(c_.num_experts_per_tok);
    ops::launch_gemm_bf16_f32(ctx_, b.normed.get(), w.router.get(), b.router_logits.get(), T, E, D);
    if (mark) mark("gate");
    const ops::RouterParams rp{E,
                               K,
                               static_cast<int>(c_.n_group),
                               static_cast<int>(c_.topk_group),
                               c_.norm_topk_prob,
                               static_cast<float>(c_.routed_scaling_factor)};
    ops::launch_moe_route(b.router_logits.get(), w.has_bias ? w.router_bias.get() : nullptr, rp, T, b.topk_idx.get(),
                          b.topk_weight.get(), stream_);
    if (mark) mark("topk");
}

int expected_tokens_per_expert(const io::ModelConfig& c, int64_t T, int ranks) {
    return std::max<int>(
        1, static_cast<int>(T * c.num_experts_per_tok * ranks / std::max<int64_t>(c.n_routed_experts, 1)));
}

void CudaLayerExec::check_local_permute() const {
    FANOUT_CHECK(max_dispatch_m_ == 0,
                 "the layer's step buffers were sized for an EP backend's rows (LayerLimits::max_dispatch_m {}), not "
                 "for the local permute: set_expert_parallel before the first step",
                 max_dispatch_m_);
}

void CudaLayerExec::dispatch_send(const DeviceLayer& w, const LayerStep& st, const KernelMark& mark) {
    if (!w.moe) return;
    Buffers& b = *b_;
    const int EL = static_cast<int>(w.experts_gate_up.batch);
    FANOUT_CHECK(EL == num_local_, "the layer holds {} routed experts, the step buffers were sized for {}", EL,
                 num_local_);
    const bool fp8 = w.experts_gate_up.fp8;
    FANOUT_CHECK(fp8 == fp8_experts_, "the layer's experts run {}, the step buffers were made for {} experts",
                 fp8 ? "FP8" : "bf16", fp8_experts_ ? "FP8" : "bf16");
    if (ep_ != nullptr) {
        // The post norm's output (quantized in xq / xs for FP8 experts) to the experts' ranks.
        FANOUT_CHECK(st.num_tokens != nullptr, "expert parallelism needs the step's token count on the device");
        ep_->dispatch_send({st.num_tokens, fp8 ? static_cast<const void*>(b.xq.get()) : b.normed.get(),
                            fp8 ? b.routed_xs : nullptr, b.topk_idx.get()});
        if (mark) mark("dispatch_send");
        return;
    }
    check_local_permute();
    if (st.T == 0) return;
    const int T = st.T, D = static_cast<int>(c_.hidden_size), K = static_cast<int>(c_.num_experts_per_tok);
    const ExpertLayout layout = expert_layout(c_, T, max_masked_tokens_, EL);
    const int cap = static_cast<int>(layout.cap), spill = static_cast<int>(layout.spill_rows);
    if (fp8) {  // xq / xs hold the post norm's quantized output
        ops::launch_moe_permute(b.xq.get(), b.routed_xs, b.topk_idx.get(), T, K, D, 0, EL, cap, spill, b.perm_q.get(),
                                b.perm_s.get(), b.counts.get(), b.spill_block_expert.get(), b.slot.get(), stream_);
    } else {
        ops::launch_moe_permute_bf16(b.normed.get(), b.topk_idx.get(), T, K, D, 0, EL, cap, spill, b.perm_bf16.get(),
                                     b.counts.get(), b.spill_block_expert.get(), b.slot.get(), stream_);
    }
    if (mark) mark("permute");
}

void CudaLayerExec::shared(const DeviceLayer& w, const LayerStep& st, uint16_t* hidden, const KernelMark& mark) {
    if (!w.has_mlp || st.T == 0) return;
    mlp(ctx_, w, st.T, hidden, mark);
}

void CudaLayerExec::experts(const DeviceLayer& w, const LayerStep& st, const KernelMark& mark) {
    if (!w.moe) return;
    Buffers& b = *b_;
    const int EL = static_cast<int>(w.experts_gate_up.batch);
    if (ep_ != nullptr) {
        ep_->dispatch_recv();
        if (mark) mark("dispatch_recv");
        const comm::ExpertBatch in = ep_->recv_batch();
        const comm::EpConfig& e = ep_->config();
        const int expected =
            st.expected_m > 0 ? st.expected_m : expected_tokens_per_expert(c_, st.T, e.world);  // all ranks' tokens
        // Every rank's choices at most: far below EL · max_m when max_m = world · max tokens.
        const ExpertRows rows{EL,
                              in.max_m,
                              in.counts,
                              expected,
                              0,
                              nullptr,
                              int64_t{e.world} * e.max_tokens_per_rank * e.experts_per_token};
        expert_mlp(w, rows, static_cast<const uint16_t*>(in.tokens), static_cast<const uint8_t*>(in.tokens), in.scales,
                   mark);
        ep_->combine_send(b.expert_out.get());
        if (mark) mark("combine_send");
        return;
    }
    check_local_permute();
    if (st.T == 0) return;
    const ExpertLayout layout = expert_layout(c_, st.T, max_masked_tokens_, EL);
    const ExpertRows rows{EL,
                          static_cast<int>(layout.cap),
                          b.counts.get(),
                          expected_tokens_per_expert(c_, st.T),
                          static_cast<int>(layout.spill_rows),
                          b.spill_block_expert.get()};
    expert_mlp(w, rows, b.perm_bf16.get(), b.perm_q.get(), b.perm_s.get(), mark);
}

void CudaLayerExec::combine(const DeviceLayer& w, const LayerStep& st, uint16_t* hidden, const KernelMark& mark) {
    if (!w.moe) return;
    Buffers& b = *b_;
    const int T = st.T, D = static_cast<int>(c_.hidden_size), K = static_cast<int>(c_.num_experts_per_tok);
    if (ep_ != nullptr) {  // the returned rows' weighted sum added into the residual, one pass
        ep_->combine_recv_add(b.topk_weight.get(), hidden);
        if (mark) mark("combine_recv");
        return;
    }
    check_local_permute();
    if (T == 0) return;
    ops::launch_moe_unpermute(b.expert_out.get(), b.slot.get(), b.topk_weight.get(), T, K, D, hidden, hidden, stream_);
    if (mark) mark("unpermute");
}

void CudaLayerExec::expert_mlp(const DeviceLayer& w, const ExpertRows& rows, const uint16_t* x, const uint8_t* xq,
                               const float* xs, const KernelMark& mark) {
    Buffers& b = *b_;
    const int I = static_cast<int>(c_.moe_intermediate_size), EL = rows.num_experts;
    // expert_gate_up and expert_out are one allocation: every silu·mul below has read the gate/up
    // rows before the down projection writes (stream order; the FP8 GEMM, a programmatic dependent,
    // writes only after its wait for the kernel before it).
    expert_gemm(w.experts_gate_up, rows, x, xq, xs, b.expert_gate_up.get());
    if (mark) mark("grouped_gate_up");
    const int64_t masked = rows.masked_rows();
    if (w.experts_gate_up.fp8) {
        const int64_t nbI = ops::ceil_div(static_cast<int64_t>(I), ops::kFp8Block);
        if (rows.max_m > 0)
            ops::launch_silu_mul_quant_masked(b.expert_gate_up.get(), rows.counts, EL, rows.max_m, I,
                                              b.expert_act_q.get(), b.expert_act_s.get(), ops::ScaleOrder::kRowMajor,
                                              stream_, rows.max_stored);
        if (rows.spill_rows > 0)
            ops::launch_silu_mul_quant_contiguous(b.expert_gate_up.get() + masked * 2 * I, rows.block_expert,
                                                  rows.spill_rows, I, b.expert_act_q.get() + masked * I,
                                                  b.expert_act_s.get() + masked * nbI, stream_);
    } else {
        // Every row: those no choice names (past a count, padding, unused blocks) hold leftovers,
        // which the row-wise kernels after it carry only to rows no slot names.
        ops::launch_silu_mul_bf16(b.expert_gate_up.get(), static_cast<int>(masked + rows.spill_rows), I,
                                  b.expert_act.get(), stream_);
    }
    if (mark) mark("grouped_silu_quant");
    expert_gemm(w.experts_down, rows, b.expert_act.get(), b.expert_act_q.get(), b.expert_act_s.get(),
                b.expert_out.get());
    if (mark) mark("grouped_down");
}

void CudaLayerExec::expert_gemm(const DeviceWeight& w, const ExpertRows& rows, const uint16_t* x, const uint8_t* xq,
                                const float* xs, uint16_t* y) {
    const int N = static_cast<int>(w.N), K = static_cast<int>(w.K);
    const int64_t masked = rows.masked_rows();
    if (w.fp8) {
        if (rows.max_m > 0)
            ops::launch_grouped_gemm_fp8_masked(xq, xs, rows.counts, rows.num_experts, rows.max_m, w.q.get(),
                                                w.scale.get(), N, K, y, std::max(rows.expected_m, 1), stream_,
                                                &ctx_.gemm_workspace());
        if (rows.spill_rows > 0) {
            const int64_t nbK = ops::ceil_div(static_cast<int64_t>(K), ops::kFp8Block);
            ops::launch_grouped_gemm_fp8_contiguous(xq + masked * K, xs + masked * nbK, rows.spill_rows,
                                                    rows.block_expert, w.q.get(), w.scale.get(), rows.num_experts, N, K,
                                                    y + masked * N, stream_);
        }
        return;
    }
    ops::BatchedGemmBf16 g;
    g.x_row_stride = K;
    g.w = w.bf16.get();
    g.N = N;
    g.K = K;
    if (rows.max_m > 0) {  // batch e: expert e's first counts[e] rows
        g.x = x;
        g.x_batch_stride = static_cast<int64_t>(rows.max_m) * K;
        g.counts = rows.counts;
        g.batch = rows.num_experts;
        g.M = rows.max_m;
        g.y = y;
        ops::launch_batched_gemm_bf16(g, stream_);
    }
    if (rows.spill_rows > 0) {  // batch j: the spill region's 128-row block j, on its expert's weights
        g.x = x + masked * K;
        g.x_batch_stride = static_cast<int64_t>(ops::kMoeSpillBlock) * K;
        g.counts = nullptr;
        g.block_expert = rows.block_expert;
        g.batch = rows.spill_rows / ops::kMoeSpillBlock;
        g.M = ops::kMoeSpillBlock;
        g.y = y + masked * N;
        ops::launch_batched_gemm_bf16(g, stream_);
    }
}

}  // namespace fanout::model

#include "fanout/model/cuda_layer.h"

#include <algorithm>

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

// Host staging: `batch` f32 matrices [N, K] -> the device, quantized per 128×128 block or in bf16.
// Re-quantizing dequantized FP8 reproduces the checkpoint's values exactly when its blocks line
// up with ours (each block's largest value maps to ±448 again); fused or sliced weights whose
// blocks straddle (the tiny model's 96-row q_a) are re-quantized from the dequantized values.
DeviceWeight upload_weight(const std::vector<float>& w, int64_t batch, int64_t N, int64_t K, bool fp8) {
    DeviceWeight d;
    d.fp8 = fp8;
    d.batch = batch;
    d.N = N;
    d.K = K;
    const size_t per = static_cast<size_t>(N * K);
    if (fp8) {
        const size_t nb = static_cast<size_t>(ops::ceil_div(N, ops::kFp8Block) * ops::ceil_div(K, ops::kFp8Block));
        std::vector<uint8_t> q(per * batch);
        std::vector<float> s(nb * batch);
        for (int64_t b = 0; b < batch; ++b)
            ops::weight_quant_block(w.data() + b * per, N, K, q.data() + b * per, s.data() + b * nb);
        d.q = DeviceArray<uint8_t>(q.data(), q.size());
        d.scale = DeviceArray<float>(s.data(), s.size());
    } else {
        std::vector<uint16_t> h(w.size());
        for (size_t i = 0; i < w.size(); ++i) h[i] = f32_to_bf16(w[i]);
        d.bf16 = DeviceArray<uint16_t>(h.data(), h.size());
    }
    return d;
}

// Rows [r0, r1) of a checkpoint weight appended to `out` as f32.
void append_rows(const ops::LinearWeight& w, int64_t r0, int64_t r1, std::vector<float>& out) {
    const size_t at = out.size();
    out.resize(at + static_cast<size_t>((r1 - r0) * w.in_features));
    for (int64_t r = r0; r < r1; ++r) w.row_f32(r, out.data() + at + static_cast<size_t>((r - r0) * w.in_features));
}

// Weights stacked along N (q_a | kv_a, gate | up) as one GEMM.
DeviceWeight upload_stacked(std::initializer_list<const ops::LinearWeight*> parts) {
    std::vector<float> w;
    int64_t N = 0;
    bool fp8 = true;
    for (const auto* p : parts) {
        append_rows(*p, 0, p->out_features, w);
        N += p->out_features;
        fp8 = fp8 && p->dtype == DType::kFP8E4M3;
    }
    return upload_weight(w, 1, N, (*parts.begin())->in_features, fp8);
}

// The grouped and batched FP8 kernels load tiles with TMA: K and N must be multiples of 16.
bool tma_friendly(int64_t N, int64_t K) { return N % 16 == 0 && K % 16 == 0; }


}  // namespace

std::vector<float> to_f32(const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    convert_to_f32(t.data(), t.dtype(), v.size(), v.data());
    return v;
}

DeviceArray<float> upload_f32(const Tensor& t) {
    const auto v = to_f32(t);
    return DeviceArray<float>(v.data(), v.size());
}

DeviceArray<uint16_t> upload_bf16(const ops::LinearWeight& w) {
    std::vector<float> f;
    append_rows(w, 0, w.out_features, f);
    std::vector<uint16_t> h(f.size());
    for (size_t i = 0; i < f.size(); ++i) h[i] = f32_to_bf16(f[i]);
    return DeviceArray<uint16_t>(h.data(), h.size());
}

DeviceLayer upload_layer(const io::ModelConfig& c, const LayerWeights& lw) {
    DeviceLayer d;
    const AttentionWeights& a = lw.attn;
    d.input_norm = upload_f32(lw.input_norm);
    d.post_norm = upload_f32(lw.post_norm);
    d.kv_a_norm = upload_f32(a.kv_a_norm);
    if (c.q_lora_rank > 0) {
        d.q_a_norm = upload_f32(a.q_a_norm);
        d.qkv_a = upload_stacked({&a.q_a, &a.kv_a});
        d.q_b = upload_stacked({&a.q_b});
    } else {
        d.qkv_a = upload_stacked({&a.kv_a});
        d.q_b = upload_stacked({&a.q_proj});
    }
    const int64_t H = c.num_attention_heads, nope = c.qk_nope_head_dim, v = c.v_head_dim, C = c.kv_lora_rank;
    std::vector<float> kb, vb, rows;
    for (int64_t h = 0; h < H; ++h) {
        rows.clear();
        append_rows(a.kv_b, h * (nope + v), h * (nope + v) + nope, rows);  // W_UK[h]: [nope, C]
        for (int64_t c2 = 0; c2 < C; ++c2)
            for (int64_t n = 0; n < nope; ++n) kb.push_back(rows[static_cast<size_t>(n * C + c2)]);
        append_rows(a.kv_b, h * (nope + v) + nope, (h + 1) * (nope + v), vb);  // W_UV[h]: [v, C]
    }
    const bool kv_b_fp8 = a.kv_b.dtype == DType::kFP8E4M3;
    d.k_b = upload_weight(kb, H, C, nope, kv_b_fp8 && tma_friendly(C, nope));
    d.v_b = upload_weight(vb, H, v, C, kv_b_fp8 && tma_friendly(v, C));
    d.kv_b = upload_stacked({&a.kv_b});
    d.o = upload_stacked({&a.o});
    d.moe = lw.is_moe;
    const MlpWeights* mlp = lw.is_moe ? (lw.moe.shared ? &*lw.moe.shared : nullptr) : &lw.mlp;
    if (mlp != nullptr) {
        d.has_mlp = true;
        d.gate_up = upload_stacked({&mlp->gate, &mlp->up});
        d.down = upload_stacked({&mlp->down});
    }
    if (lw.is_moe) {
        const MoeWeights& m = lw.moe;
        d.router = upload_bf16(m.router);
        d.has_bias = m.bias.defined() && m.bias.numel() > 0;
        if (d.has_bias) d.router_bias = upload_f32(m.bias);
        std::vector<float> gu, dn;
        bool fp8 = true;
        for (const MlpWeights& e : m.experts) {
            append_rows(e.gate, 0, e.gate.out_features, gu);
            append_rows(e.up, 0, e.up.out_features, gu);
            append_rows(e.down, 0, e.down.out_features, dn);
            fp8 = fp8 && e.gate.dtype == DType::kFP8E4M3;
        }
        const int64_t E = static_cast<int64_t>(m.experts.size()), I = c.moe_intermediate_size, D = c.hidden_size;
        fp8 = fp8 && tma_friendly(2 * I, D) && tma_friendly(D, I);
        d.experts_gate_up = upload_weight(gu, E, 2 * I, D, fp8);
        d.experts_down = upload_weight(dn, E, D, I, fp8);
    }
    return d;
}


namespace {

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
    d.k_b = random_weight(H, C, nope, seed + 30);
    d.v_b = random_weight(H, V, C, seed + 40);
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
    DeviceArray<uint16_t> normed, qkv, q_a, q, q_nope, q_pe, q_lat, o_lat, attn_hm, attn, gate_up, act;
    DeviceArray<uint8_t> xq;
    DeviceArray<float> xs, router_logits, topk_weight;
    DeviceArray<int32_t> topk_idx, counts, fill_t, slot;
    DeviceArray<uint8_t> perm_q, expert_act_q, emulated_q;
    DeviceArray<float> perm_s, expert_act_s, emulated_s;
    DeviceArray<uint16_t> perm_bf16, expert_gate_up, expert_act, expert_out;
    ops::GemmWorkspace gemm_ws;
    ops::MlaWorkspace mla_ws;
    DeviceArray<float> inv_freq;
    DeviceArray<uint16_t> latent, k_pe, kv_expanded;  // MHA-form prefill: [ctx, kv_lora], [ctx, rope], [ctx, H·(nope+v)]
};

namespace {

// Element counts of every step buffer for a set of limits: the constructor allocates exactly
// these, and buffer_bytes() counts them for the memory plan before anything is allocated.
struct BufferElems {
    size_t normed, qkv, q_a, q, q_nope, q_pe, q_lat, o_lat, attn_hm, attn, gate_up, act;  // bf16
    size_t latent, k_pe, kv_expanded;                                                   // bf16, MHA prefill
    size_t xq, xs, router_logits, topk_idx, topk_weight, counts, fill_t, slot;
    size_t perm_q, perm_s, expert_act_q, expert_act_s, perm_bf16, expert_act, expert_gate_up, expert_out;
    size_t emulated_q, emulated_s;

    size_t bytes() const {
        const size_t bf16 = normed + qkv + q_a + q + q_nope + q_pe + q_lat + o_lat + attn_hm + attn + gate_up + act +
                            latent + k_pe + kv_expanded + perm_bf16 + expert_act + expert_gate_up + expert_out;
        const size_t u8 = xq + perm_q + expert_act_q + emulated_q;
        const size_t f32 = xs + router_logits + topk_weight + perm_s + expert_act_s + emulated_s;
        const size_t i32 = topk_idx + counts + fill_t + slot;
        return 2 * bf16 + u8 + 4 * (f32 + i32);
    }
};

BufferElems buffer_elems(const io::ModelConfig& c, int64_t max_tokens, int64_t num_local_experts,
                         int64_t max_emulated_m, int64_t max_prefill_ctx) {
    BufferElems n{};
    const size_t T = static_cast<size_t>(max_tokens), D = static_cast<size_t>(c.hidden_size);
    const size_t H = static_cast<size_t>(c.num_attention_heads), C = static_cast<size_t>(c.kv_lora_rank);
    const size_t nope = static_cast<size_t>(c.qk_nope_head_dim), rp = static_cast<size_t>(c.qk_rope_head_dim);
    const size_t Vh = static_cast<size_t>(c.v_head_dim), ql = static_cast<size_t>(std::max<int64_t>(c.q_lora_rank, 1));
    const size_t E = static_cast<size_t>(std::max<int64_t>(c.n_routed_experts, 1));
    const size_t EL = static_cast<size_t>(std::max<int64_t>(num_local_experts, 1));
    const size_t K = static_cast<size_t>(std::max<int64_t>(c.num_experts_per_tok, 1));
    const size_t Ie = static_cast<size_t>(c.moe_intermediate_size);
    const size_t I = static_cast<size_t>(
        std::max<int64_t>({c.intermediate_size, c.moe_intermediate_size * c.n_shared_experts, 1}));
    const size_t qkv_w = ql + C + rp, q_w = H * (nope + rp);
    // Rows per expert in the masked layout: the step's tokens, or the emulated dispatch's count.
    const size_t max_m = std::max(T, static_cast<size_t>(max_emulated_m));
    n.normed = T * D;
    n.qkv = T * qkv_w;
    n.q_a = T * ql;
    n.q = T * q_w;
    n.q_nope = H * T * nope;
    n.q_pe = T * H * rp;
    n.q_lat = H * T * C;
    n.o_lat = H * T * C;
    n.attn_hm = H * T * Vh;
    n.attn = T * H * Vh;
    n.gate_up = T * 2 * I;
    n.act = T * I;
    // The quantized input of any projection (the widest is one of these) or batched GEMM.
    const size_t P = static_cast<size_t>(std::max<int64_t>(max_prefill_ctx, 0));
    n.xq = std::max({T * std::max({D, qkv_w, q_w, H * Vh, I}), H * T * std::max(nope, C), P * C});
    n.latent = P * C;
    n.k_pe = P * rp;
    n.kv_expanded = P * H * (nope + Vh);
    n.xs = n.xq / 16 + H * T * 2;  // one scale per 128 values of a row, rows of ≥ 16
    n.router_logits = T * E;
    n.topk_idx = T * K;
    n.topk_weight = T * K;
    n.counts = EL;
    n.fill_t = std::max<size_t>(H, 1);
    n.slot = T * K;
    if (c.n_routed_experts > 0) {
        const size_t nbD = static_cast<size_t>(ops::ceil_div(static_cast<int64_t>(D), ops::kFp8Block));
        const size_t nbI = static_cast<size_t>(ops::ceil_div(static_cast<int64_t>(Ie), ops::kFp8Block));
        n.perm_q = EL * max_m * D;
        n.perm_s = EL * max_m * nbD;
        n.expert_act_q = EL * max_m * Ie;
        n.expert_act_s = EL * max_m * nbI;
        n.perm_bf16 = EL * max_m * D;
        n.expert_act = EL * max_m * Ie;
        n.expert_gate_up = EL * max_m * 2 * Ie;
        n.expert_out = EL * max_m * D;
        if (max_emulated_m > 0) {
            n.emulated_q = EL * max_m * D;
            n.emulated_s = EL * max_m * nbD;
        }
    }
    return n;
}

}  // namespace

size_t CudaLayerExec::buffer_bytes(const io::ModelConfig& c, int64_t max_tokens, int64_t num_local_experts,
                                   int64_t max_emulated_m, int64_t max_prefill_ctx) {
    return buffer_elems(c, max_tokens, num_local_experts, max_emulated_m, max_prefill_ctx).bytes() +
           ops::GemmWorkspace::kDefaultBytes;
}

CudaLayerExec::CudaLayerExec(const io::ModelConfig& c, const ops::RopeTable& rope, int64_t max_tokens,
                             int64_t num_local_experts, int64_t max_emulated_m, int64_t max_prefill_ctx,
                             cudaStream_t stream)
    : c_(c), num_local_(num_local_experts), max_prefill_ctx_(max_prefill_ctx), rope_factor_(rope.attention_factor),
      stream_(stream), b_(std::make_unique<Buffers>()) {
    Buffers& b = *b_;
    const BufferElems n = buffer_elems(c, max_tokens, num_local_experts, max_emulated_m, max_prefill_ctx);
    b.normed = DeviceArray<uint16_t>(n.normed);
    b.qkv = DeviceArray<uint16_t>(n.qkv);
    b.q_a = DeviceArray<uint16_t>(n.q_a);
    b.q = DeviceArray<uint16_t>(n.q);
    b.q_nope = DeviceArray<uint16_t>(n.q_nope);
    b.q_pe = DeviceArray<uint16_t>(n.q_pe);
    b.q_lat = DeviceArray<uint16_t>(n.q_lat);
    b.o_lat = DeviceArray<uint16_t>(n.o_lat);
    b.attn_hm = DeviceArray<uint16_t>(n.attn_hm);
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
    b.router_logits = DeviceArray<float>(n.router_logits);
    b.topk_idx = DeviceArray<int32_t>(n.topk_idx);
    b.topk_weight = DeviceArray<float>(n.topk_weight);
    b.counts = DeviceArray<int32_t>(n.counts);
    b.fill_t = DeviceArray<int32_t>(n.fill_t);
    b.slot = DeviceArray<int32_t>(n.slot);
    if (c.n_routed_experts > 0) {
        b.perm_q = DeviceArray<uint8_t>(n.perm_q);
        b.perm_s = DeviceArray<float>(n.perm_s);
        b.expert_act_q = DeviceArray<uint8_t>(n.expert_act_q);
        b.expert_act_s = DeviceArray<float>(n.expert_act_s);
        b.perm_bf16 = DeviceArray<uint16_t>(n.perm_bf16);
        b.expert_act = DeviceArray<uint16_t>(n.expert_act);
        b.expert_gate_up = DeviceArray<uint16_t>(n.expert_gate_up);
        b.expert_out = DeviceArray<uint16_t>(n.expert_out);
        if (max_emulated_m > 0) {  // the emulated dispatch's rows: any finite values do
            b.emulated_q = DeviceArray<uint8_t>(n.emulated_q);
            b.emulated_s = DeviceArray<float>(n.emulated_s);
            ops::launch_random_fp8(b.emulated_q.get(), b.emulated_q.size(), 7, stream);
            ops::launch_random_f32(b.emulated_s.get(), b.emulated_s.size(), 0.01f, 0.02f, 8, stream);
        }
    }
    b.inv_freq = DeviceArray<float>(rope.inv_freq.data(), rope.inv_freq.size());
    FANOUT_CUDA_CHECK(cudaStreamSynchronize(stream));
}

CudaLayerExec::~CudaLayerExec() = default;

void CudaLayerExec::linear(const DeviceWeight& w, const uint16_t* x, int M, uint16_t* y, const uint16_t* residual) {
    Buffers& b = *b_;
    if (w.fp8) {
        // x == nullptr: the input is already quantized in xq / xs (by the norm in front).
        if (x != nullptr) ops::launch_act_quant_bf16(x, b.xq.get(), b.xs.get(), M, static_cast<int>(w.K), stream_);
        ops::launch_gemm_fp8(b.xq.get(), b.xs.get(), w.q.get(), w.scale.get(), y, M, static_cast<int>(w.N),
                             static_cast<int>(w.K), stream_, residual, &b.gemm_ws);
    } else {
        ops::launch_gemm_bf16(x, w.bf16.get(), y, M, static_cast<int>(w.N), static_cast<int>(w.K), stream_, residual);
    }
}

void CudaLayerExec::batched(const DeviceWeight& w, const uint16_t* x, const int32_t* counts, int max_m, uint16_t* y,
                            int expected_m, const uint8_t* xq, const float* xs) {
    Buffers& b = *b_;
    const int B = static_cast<int>(w.batch), N = static_cast<int>(w.N), K = static_cast<int>(w.K);
    if (w.fp8) {
        if (xq == nullptr) {
            ops::launch_act_quant_bf16(x, b.xq.get(), b.xs.get(), B * max_m, K, stream_);
            xq = b.xq.get();
            xs = b.xs.get();
        }
        ops::launch_grouped_gemm_fp8_masked(xq, xs, counts, B, max_m, w.q.get(), w.scale.get(), N, K, y,
                                            std::max(expected_m, 1), stream_);
        return;
    }
    ops::BatchedGemmBf16 g;
    g.x = x;
    g.x_batch_stride = static_cast<int64_t>(max_m) * K;
    g.x_row_stride = K;
    g.w = w.bf16.get();
    g.counts = counts;
    g.batch = B;
    g.M = max_m;
    g.N = N;
    g.K = K;
    g.y = y;
    ops::launch_batched_gemm_bf16(g, stream_);
}

void CudaLayerExec::mlp(const DeviceWeight& gu, const DeviceWeight& down, int T, uint16_t* hidden, bool prequantized,
                        const KernelMark& mark) {
    Buffers& b = *b_;
    const int I = static_cast<int>(gu.N / 2);
    linear(gu, prequantized && gu.fp8 ? nullptr : b.normed.get(), T, b.gate_up.get());
    if (mark) mark("shared_gate_up");
    if (down.fp8) {
        ops::launch_fill_i32(b.fill_t.get(), 1, T, stream_);
        ops::launch_silu_mul_quant_masked(b.gate_up.get(), b.fill_t.get(), 1, T, I, b.xq.get(), b.xs.get(), stream_);
        if (mark) mark("shared_silu_quant");
        ops::launch_gemm_fp8(b.xq.get(), b.xs.get(), down.q.get(), down.scale.get(), hidden, T, static_cast<int>(down.N),
                             I, stream_, hidden, &b.gemm_ws);
    } else {
        ops::launch_silu_mul_bf16(b.gate_up.get(), T, I, b.act.get(), stream_);
        if (mark) mark("shared_silu_quant");
        linear(down, b.act.get(), T, hidden, hidden);
    }
    if (mark) mark("shared_down");
}

void CudaLayerExec::run(const DeviceLayer& w, const LayerStep& st, uint16_t* hidden, uint16_t* cache,
                        const KernelMark& mark, const ExpertEmulation* emulate) {
    Buffers& b = *b_;
    const auto m = [&](const char* name) {
        if (mark) mark(name);
    };
    const int T = st.T, D = static_cast<int>(c_.hidden_size), H = static_cast<int>(c_.num_attention_heads);
    const int nope = static_cast<int>(c_.qk_nope_head_dim), rope_dim = static_cast<int>(c_.qk_rope_head_dim);
    const int C = static_cast<int>(c_.kv_lora_rank), V = static_cast<int>(c_.v_head_dim);
    const int ql = static_cast<int>(c_.q_lora_rank);
    const float eps = static_cast<float>(c_.rms_norm_eps);
    // A norm in front of FP8 projections also quantizes its output for them (one kernel), and
    // xq / xs then hold that input until the next quantization.
    const auto norm = [&](const uint16_t* x, int64_t x_stride, const float* weight, float e, uint16_t* y,
                          int64_t y_stride, int width, bool quantize) {
        ops::launch_rms_norm_quant_bf16(x, x_stride, nullptr, weight, e, y, y_stride, quantize ? b.xq.get() : nullptr,
                                        quantize ? b.xs.get() : nullptr, T, width, stream_);
    };
    // 1. attention input.
    const bool in_q = w.qkv_a.fp8;
    norm(hidden, D, w.input_norm.get(), eps, b.normed.get(), D, D, in_q);
    m("input_norm");
    linear(w.qkv_a, in_q ? nullptr : b.normed.get(), T, b.qkv.get());
    m("qkv_a");
    const int qkv_width = static_cast<int>(w.qkv_a.N);
    const uint16_t* kv_a = b.qkv.get() + std::max(ql, 0);
    if (ql > 0) {
        norm(b.qkv.get(), qkv_width, w.q_a_norm.get(), kLatentNormEps, b.q_a.get(), ql, ql, w.q_b.fp8);
        m("q_a_norm");
        linear(w.q_b, w.q_b.fp8 ? nullptr : b.q_a.get(), T, b.q.get());
    } else {  // q_proj reads the input norm's output, still quantized in xq when qkv_a is FP8
        linear(w.q_b, in_q && w.q_b.fp8 ? nullptr : b.normed.get(), T, b.q.get());
    }
    m("q_b");
    const ops::RopeDevice rd{b.inv_freq.get(), rope_dim, rope_factor_};
    const bool mha = st.prefill_ctx > 0;
    if (mha) {
        FANOUT_CHECK(st.R == 1 && st.prefill_ctx <= max_prefill_ctx_ && st.prefill_ctx >= T,
                     "MHA-form prefill: one request with a context of {}..{} tokens, got {} requests, context {}", T,
                     max_prefill_ctx_, st.R, st.prefill_ctx);
        ops::launch_rope_q_inplace(b.q.get(), T, H, nope, st.positions, rd, stream_);
    } else {
        ops::launch_mla_q_split(b.q.get(), T, H, nope, st.positions, rd, b.q_nope.get(), b.q_pe.get(), stream_);
    }
    ops::launch_mla_kv_append(kv_a, qkv_width, T, C, w.kv_a_norm.get(), kLatentNormEps, st.positions, rd, st.slots,
                              cache, stream_);
    m("latent_norm_rope_append");
    if (mha) {
        // 2. attention, MHA form: the context's latent expanded by kv_b into per-head K and V.
        const int ctx = st.prefill_ctx;
        ops::launch_gather_latent(cache, st.block_table, static_cast<int>(kv::kDefaultBlockSize), ctx, C, rope_dim,
                                  b.latent.get(), b.k_pe.get(), stream_);
        linear(w.kv_b, b.latent.get(), ctx, b.kv_expanded.get());
        m("kv_b_expand");
        ops::MhaPrefillParams p;
        p.num_tokens = T;
        p.ctx_len = ctx;
        p.num_heads = H;
        p.nope = nope;
        p.rope = rope_dim;
        p.v_dim = V;
        p.scale = static_cast<float>(c_.softmax_scale());
        p.q = b.q.get();
        p.q_stride_t = static_cast<int64_t>(H) * (nope + rope_dim);
        p.q_stride_h = nope + rope_dim;
        p.k_nope = b.kv_expanded.get();  // [ctx, H, nope + v]: k_nope then v per head
        p.k_stride_t = static_cast<int64_t>(H) * (nope + V);
        p.k_stride_h = nope + V;
        p.k_pe = b.k_pe.get();
        p.k_pe_stride_t = rope_dim;
        p.v = b.kv_expanded.get() + nope;
        p.v_stride_t = p.k_stride_t;
        p.v_stride_h = p.k_stride_h;
        p.out = b.attn.get();  // [T, H, v]: o_proj's input as it is
        p.out_stride_t = static_cast<int64_t>(H) * V;
        p.out_stride_h = V;
        ops::launch_mha_prefill(p, stream_);
        m("attention");
    } else {
        // 2. attention, absorbed form: k_b into q, MLA over the cache, v_b out.
        ops::launch_fill_i32(b.fill_t.get(), std::max(H, 1), T, stream_);
        batched(w.k_b, b.q_nope.get(), b.fill_t.get(), T, b.q_lat.get(), T);
        m("bmm_q_absorb");
        ops::MlaAttentionParams p;
        p.num_tokens = T;
        p.num_requests = st.R;
        p.num_heads = H;
        p.kv_lora = C;
        p.rope_dim = rope_dim;
        p.block_size = static_cast<int>(kv::kDefaultBlockSize);
        p.max_blocks = st.max_blocks;
        p.max_query_len = st.max_q;
        p.scale = static_cast<float>(c_.softmax_scale());
        p.query_start = st.query_start;
        p.kv_len = st.kv_len;
        p.positions = st.positions;
        p.block_table = st.block_table;
        p.cache = cache;
        p.q_lat = b.q_lat.get();  // [H, T, C]
        p.q_lat_stride_t = C;
        p.q_lat_stride_h = static_cast<int64_t>(T) * C;
        p.q_pe = b.q_pe.get();  // [T, H, rope]
        p.q_pe_stride_t = static_cast<int64_t>(H) * rope_dim;
        p.q_pe_stride_h = rope_dim;
        p.out = b.o_lat.get();  // [H, T, C]
        p.out_stride_t = C;
        p.out_stride_h = static_cast<int64_t>(T) * C;
        ops::launch_mla_attention(p, &b.mla_ws, stream_);
        m("attention");
        batched(w.v_b, b.o_lat.get(), b.fill_t.get(), T, b.attn_hm.get(), T);
        m("bmm_v");
        ops::launch_heads_to_tokens(b.attn_hm.get(), H, T, V, b.attn.get(), stream_);
    }
    linear(w.o, b.attn.get(), T, hidden, hidden);
    m("o_proj");
    const bool post_q = (w.has_mlp && w.gate_up.fp8) || (w.moe && w.experts_gate_up.fp8);
    norm(hidden, D, w.post_norm.get(), eps, b.normed.get(), D, D, post_q);
    m("post_norm");
    // 3. the dense MLP, added to the residual by its down projection.
    if (!w.moe) {
        if (w.has_mlp) mlp(w.gate_up, w.down, T, hidden, post_q, mark);
        return;
    }
    // 4. MoE: router, then the routed experts' permute (the seed's dispatch send), the shared
    // expert while "dispatch" would be in flight, the grouped GEMMs, the weighted un-permute.
    const int E = static_cast<int>(c_.n_routed_experts), K = static_cast<int>(c_.num_experts_per_tok);
    const int EL = static_cast<int>(w.experts_gate_up.batch), I = static_cast<int>(c_.moe_intermediate_size);
    ops::launch_gemm_bf16_f32(b.normed.get(), w.router.get(), b.router_logits.get(), T, E, D, stream_);
    m("gate");
    const ops::RouterParams rp{E, K, static_cast<int>(c_.n_group), static_cast<int>(c_.topk_group), c_.norm_topk_prob,
                               static_cast<float>(c_.routed_scaling_factor)};
    ops::launch_moe_route(b.router_logits.get(), w.has_bias ? w.router_bias.get() : nullptr, rp, T, b.topk_idx.get(),
                          b.topk_weight.get(), stream_);
    m("topk");
    const int32_t* counts = b.counts.get();
    int max_m = T, expected = std::max(1, T * K / E);
    if (w.experts_gate_up.fp8) {
        // xq / xs hold the post norm's quantized output (post_q).
        ops::launch_moe_permute_masked(b.xq.get(), b.xs.get(), b.topk_idx.get(), T, K, D, 0, EL, T, b.perm_q.get(),
                                       b.perm_s.get(), b.counts.get(), b.slot.get(), stream_);
        m("permute");
        if (w.has_mlp) mlp(w.gate_up, w.down, T, hidden, post_q, mark);  // the shared expert
        const uint8_t* gx = b.perm_q.get();
        const float* gs = b.perm_s.get();
        if (emulate) {  // the grouped GEMMs take what EP-N's dispatch would deliver instead
            counts = emulate->counts;
            max_m = emulate->max_m;
            expected = emulate->expected_m;
            gx = b.emulated_q.get();
            gs = b.emulated_s.get();
        }
        batched(w.experts_gate_up, nullptr, counts, max_m, b.expert_gate_up.get(), expected, gx, gs);
        m("grouped_gate_up");
        ops::launch_silu_mul_quant_masked(b.expert_gate_up.get(), counts, EL, max_m, I, b.expert_act_q.get(),
                                          b.expert_act_s.get(), stream_);
        m("grouped_silu_quant");
        batched(w.experts_down, nullptr, counts, max_m, b.expert_out.get(), expected, b.expert_act_q.get(),
                b.expert_act_s.get());
        m("grouped_down");
    } else {
        FANOUT_CHECK(emulate == nullptr, "expert emulation needs FP8 experts");
        ops::launch_moe_permute_masked_bf16(b.normed.get(), b.topk_idx.get(), T, K, D, 0, EL, T, b.perm_bf16.get(),
                                            b.counts.get(), b.slot.get(), stream_);
        m("permute");
        if (w.has_mlp) mlp(w.gate_up, w.down, T, hidden, post_q, mark);
        batched(w.experts_gate_up, b.perm_bf16.get(), counts, T, b.expert_gate_up.get(), expected);
        m("grouped_gate_up");
        ops::launch_silu_mul_bf16(b.expert_gate_up.get(), EL * T, I, b.expert_act.get(), stream_);
        m("grouped_silu_quant");
        batched(w.experts_down, b.expert_act.get(), counts, T, b.expert_out.get(), expected);
        m("grouped_down");
    }
    // Slots index rows of the permute's layout (max_m = T); under emulation they point into the
    // emulated output, which has at least as many rows.
    ops::launch_moe_unpermute(b.expert_out.get(), b.slot.get(), b.topk_weight.get(), T, K, D, hidden, hidden, stream_);
    m("unpermute");
}

}  // namespace fanout::model

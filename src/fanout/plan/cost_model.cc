#include "fanout/plan/cost_model.h"

#include <algorithm>
#include <cmath>

#include "fanout/core/error.h"
#include "fanout/plan/v3_shape.h"

namespace fanout::plan {
namespace {

using namespace v3;

// The GPU runner's choice of attention form (model/deepseek_v3_cuda.cc, mha_split): prefill chunks
// of more query tokens than its decode graphs take, whose contexts fit CudaModelOptions::
// max_mha_context keys in all, run the MHA form.
constexpr int kMhaMinQuery = 4;
constexpr double kMhaMaxKeys = 16384;

// Builds the kernel list of one layer; every add_* call prices one kernel with the profile.
class LayerBuilder {
  public:
    LayerBuilder(const Hardware& hw, const Profile& prof) : hw_(hw), prof_(prof) {}

    // FP8 block-scaled GEMM [m, k] × [k, n] (BF16 out).
    void gemm(const std::string& name, int stage, double m, double n, double k) {
        add(name, stage, "gemm", gemm_bytes(m, n, k), 2 * m * n * k, prof_.gemm, hw_.fp8_flops);
    }
    // BF16 GEMM (router gate, MTP eh_proj, LM head).
    void gemm_bf16(const std::string& name, int stage, double m, double n, double k) {
        add(name, stage, "gemm", 2 * (m * k + n * k + m * n), 2 * m * n * k, prof_.gemm, hw_.bf16_flops);
    }
    // `heads` BF16 BMMs [m, k] × [k, n], weights and operands bf16 (the MLA absorb / v BMMs: kv_b
    // dequantized at load, as DeepSeek's reference runs them).
    void bmm(const std::string& name, int stage, double heads, double m, double n, double k) {
        add(name, stage, "gemm", heads * (2 * n * k + 2 * m * k + 2 * m * n), 2 * heads * m * n * k, prof_.gemm,
            hw_.bf16_flops);
    }
    void grouped(const std::string& name, int stage, double experts, double tokens, double n, double k) {
        add(name, stage, "grouped", grouped_gemm_bytes(experts, tokens, n, k), 2 * tokens * n * k, prof_.grouped,
            hw_.fp8_flops);
    }
    void elementwise(const std::string& name, int stage, double bytes) {
        add(name, stage, "elementwise", bytes, 0, prof_.elementwise, hw_.fp8_flops);
    }
    // Absorbed MLA decode: `requests` requests of `query` tokens over `kv_len` latent entries stored
    // as `kv_dtype`, `heads` heads: scores over 576 dims, values over 512 (BF16 math); the latent KV
    // is read once.
    void attention(int stage, double requests, double query, double kv_len, double heads, DType kv_dtype) {
        const double tokens = requests * query;
        const double bytes = requests * kv_len * kv_entry_bytes(kv_dtype) + tokens * heads * (kKvLora + kRope) * 2 +
                             tokens * heads * kKvLora * 2;
        const double flops = 2 * tokens * heads * kv_len * ((kKvLora + kRope) + kKvLora);
        // The FP8 cache's measured curve where there is one, else the bf16 cache's, else the roofline.
        const std::vector<EfficiencyPoint>& curve = kv_dtype == DType::kFP8E4M3 && !prof_.attention_fp8_curve.empty()
                                                        ? prof_.attention_fp8_curve
                                                        : prof_.attention_curve;
        if (curve.empty()) {
            add("attention", stage, "attention", bytes, flops, prof_.attention, hw_.bf16_flops);
            return;
        }
        const double eff = interpolate_efficiency(curve, tokens * heads);
        const double us = std::max(flops / (eff * hw_.bf16_flops), bytes / (prof_.attention.bw_eff * hw_.hbm_bw)) * 1e6;
        push({"attention", stage, "attention", bytes, flops, us});
    }
    // MLA prefill in the MHA form: `requests` chunks of `query` tokens, each over its kv_len keys
    // (the chunk last), `heads` heads; causal flash attention, scores over 192 dims and values over
    // 128 for every visible (query, key) pair; K/V (kv_b's output) and k_pe read once per head.
    void mha_attention(int stage, double requests, double query, double kv_len, double heads) {
        kv_len = std::max(kv_len, query);  // the keys include the chunk
        const double pairs = requests * (query * (kv_len - query) + query * (query + 1) / 2);
        const double flops = 2 * heads * pairs * (kNope + kRope + kV);
        const double bytes =
            requests * (kv_len * (heads * (kNope + kV) + kRope) * 2 + query * heads * (kNope + kRope + kV) * 2);
        if (prof_.mha_attention_curve.empty()) {
            add("attention", stage, "attention", bytes, flops, prof_.mha_attention, hw_.bf16_flops);
            return;
        }
        const double eff = interpolate_efficiency(prof_.mha_attention_curve, query);
        const double us =
            std::max(flops / (eff * hw_.bf16_flops), bytes / (prof_.mha_attention.bw_eff * hw_.hbm_bw)) * 1e6;
        push({"attention", stage, "attention", bytes, flops, us});
    }
    void comm(const std::string& name, int stage, double nvlink_bytes, double ib_bytes, const LinkModel& nv,
              const LinkModel& ib) {
        double us = 0;
        if (nvlink_bytes > 0 || ib_bytes > 0) {
            // NVLink and the NIC run side by side; the slower one ends the collective.
            const double t_nv = nvlink_bytes > 0 ? nv.time_us(nvlink_bytes, hw_.nvlink_bw) : 0;
            const double t_ib = ib_bytes > 0 ? ib.time_us(ib_bytes, hw_.ib_bw) : 0;
            us = std::max(t_nv, t_ib);
        }
        push({name, stage, "comm", nvlink_bytes + ib_bytes, 0, us});
    }

    std::vector<KernelCost> take() { return std::move(kernels_); }

  private:
    void add(const std::string& name, int stage, const char* kind, double bytes, double flops, const Roofline& r,
             double rate) {
        push({name, stage, kind, bytes, flops, r.time_us(bytes, flops, hw_.hbm_bw, rate)});
    }
    void push(KernelCost k) {
        if (const auto it = prof_.kernel_extra_us.find(k.name); it != prof_.kernel_extra_us.end() && k.kind != "comm")
            k.us = std::max(0.0, k.us + it->second);
        kernels_.push_back(std::move(k));
    }

    const Hardware& hw_;
    const Profile& prof_;
    std::vector<KernelCost> kernels_;
};

double sum_us(const std::vector<KernelCost>& ks, int stage_lo, int stage_hi, const std::string& skip_kind = "") {
    double s = 0;
    for (const auto& k : ks)
        if (k.stage >= stage_lo && k.stage <= stage_hi && k.kind != skip_kind) s += k.us;
    return s;
}

double named_us(const std::vector<KernelCost>& ks, const std::string& name) {
    double s = 0;
    for (const auto& k : ks)
        if (k.name == name) s += k.us;
    return s;
}

double kind_us(const std::vector<KernelCost>& ks, const std::string& kind) {
    double s = 0;
    for (const auto& k : ks)
        if (k.kind == kind) s += k.us;
    return s;
}

}  // namespace

const char* schedule_name(Schedule s) {
    switch (s) {
        case Schedule::kNoOverlap:
            return "no_overlap";
        case Schedule::kDispatchOverlap:
            return "dispatch_overlap";
        case Schedule::kMicroBatch:
            return "microbatch";
    }
    return "?";
}

Schedule parse_schedule(const std::string& name) {
    if (name == "no_overlap") return Schedule::kNoOverlap;
    if (name == "dispatch_overlap") return Schedule::kDispatchOverlap;
    if (name == "microbatch") return Schedule::kMicroBatch;
    FANOUT_FAIL("unknown schedule '{}' (have no_overlap, dispatch_overlap, microbatch)", name);
}

void validate(const Deployment& d, const Hardware& hw) {
    FANOUT_CHECK(d.ep >= 1 && 256 % d.ep == 0, "plan: EP {} must divide the 256 routed experts", d.ep);
    FANOUT_CHECK(d.tp == 1 || d.tp == 2 || d.tp == 4 || d.tp == 8, "plan: TP {} must be 1, 2, 4 or 8", d.tp);
    FANOUT_CHECK(d.ep % d.tp == 0, "plan: TP {} must divide EP {} (EP = DP × TP)", d.tp, d.ep);
    FANOUT_CHECK(d.tp <= hw.gpus_per_node, "plan: TP {} exceeds the {} GPUs of a {} node (instances never span nodes)",
                 d.tp, hw.gpus_per_node, hw.name);
    FANOUT_CHECK(d.ep <= hw.gpus_per_node || d.ep % hw.gpus_per_node == 0,
                 "plan: EP {} spans nodes but is not a whole number of {}-GPU nodes", d.ep, hw.gpus_per_node);
    // The bounds keep every sum and product of these in range (a 2^31 batch or KV length wrapped).
    FANOUT_CHECK(d.batch >= 1 && d.batch <= (1 << 20), "plan: batch {} must be in 1..1048576", d.batch);
    FANOUT_CHECK(d.kv_len >= 0 && d.kv_len <= (1 << 24), "plan: KV length {} must be in 0..16777216", d.kv_len);
    FANOUT_CHECK(d.draft_tokens >= 0 && d.draft_tokens <= 16, "plan: draft tokens {} must be in 0..16", d.draft_tokens);
    FANOUT_CHECK(d.acceptance >= 0 && d.acceptance <= 1, "plan: acceptance {} must be in [0, 1]", d.acceptance);
    kv_entry_bytes(d.kv_dtype);  // throws, naming it, for a dtype the GPU cache does not store
    FANOUT_CHECK(d.schedule != Schedule::kMicroBatch || d.batch >= 2,
                 "plan: microbatch splits the batch in two and needs batch >= 2 (got {})", d.batch);
}

bool Deployment::mha_form() const {
    if (attention != AttentionForm::kAuto) return attention == AttentionForm::kMha;
    // Under the microbatch schedule the runner applies the rule to each microbatch (the larger
    // half of the requests).
    const int requests = schedule == Schedule::kMicroBatch ? (batch + 1) / 2 : batch;
    return query_len() > kMhaMinQuery && double(requests) * kv_len <= kMhaMaxKeys;
}

std::vector<KernelCost> layer_kernels(const Deployment& d, const Hardware& hw, const Profile& prof, double batch,
                                      bool dense) {
    LayerBuilder b(hw, prof);
    const double t = d.tp, heads = kHeads / t;
    const double tokens = batch * d.query_len();  // on every rank of the instance
    const double split = tokens / t;              // this rank's share after the reduce-scatter
    const double act = 2 * kHidden;               // bytes of one BF16 hidden row

    // Stage 1.
    b.elementwise("input_norm", 1, tokens * (3 * act + kHidden));   // x, residual in/out, FP8 out
    b.gemm("qkv_a", 1, tokens, kQLora + kKvLora + kRope, kHidden);  // replicated on every TP rank
    b.elementwise("q_a_norm", 1, tokens * kQLora * 2 * 2);
    b.elementwise("latent_norm_rope_append", 1, tokens * (kQLora + kKvLora + kRope) * 2 * 3);
    b.gemm("q_b", 1, tokens, heads * (kNope + kRope), kQLora);
    const bool mha = d.mha_form();
    if (!mha) b.bmm("bmm_q_absorb", 1, heads, tokens, kKvLora, kNope);
    // Stage 2.
    if (mha) {  // the contexts' latents gathered (a copy) and expanded by kv_b, then flash attention
        b.gemm("kv_b_expand", 2, batch * d.kv_len, heads * (kNope + kV), kKvLora);
        b.mha_attention(2, batch, d.query_len(), d.kv_len, heads);
    } else {
        b.attention(2, batch, d.query_len(), d.kv_len, heads, d.kv_dtype);
        b.bmm("bmm_v", 2, heads, tokens, kV, kKvLora);
    }
    b.gemm("o_proj", 2, tokens, kHidden, heads * kV);
    const double tp_bytes = (t - 1) / t * tokens * act;
    if (d.tp > 1) b.comm("tp_reduce_scatter", 2, tp_bytes, 0, prof.tp_collective, prof.tp_collective);
    b.elementwise("post_norm", 2, split * (3 * act + kHidden));

    if (dense) {
        // The dense MLP is TP-sharded and runs on all the instance's tokens; its output is summed
        // over the TP group (folded into the all-gather below).
        if (d.tp > 1) b.comm("tp_all_gather_in", 2, tp_bytes, 0, prof.tp_collective, prof.tp_collective);
        b.gemm("dense_gate_up", 3, tokens, 2 * kDenseInter / t, kHidden);
        b.elementwise("dense_silu_quant", 3, tokens * kDenseInter / t * 5);
        b.gemm("dense_down", 3, tokens, kHidden, kDenseInter / t);
        if (d.tp > 1) b.comm("tp_all_reduce", 5, 2 * tp_bytes, 0, prof.tp_collective, prof.tp_collective);
        return b.take();
    }

    b.gemm_bf16("gate", 2, split, kExperts, kHidden);
    b.elementwise("topk", 2, split * kExperts * 4);

    // Stage 3: permute (FP8 quant of this rank's tokens, its own copies into the expert layout),
    // dispatch send, shared expert.
    const double copies = split * kTopK;  // token copies this rank sends
    const double ep = d.ep, per_node = std::min<double>(ep, hw.gpus_per_node);
    const double nv_frac = (per_node - 1) / ep, ib_frac = (ep - per_node) / ep;
    b.elementwise("permute", 3, split * kHidden * 3 + copies / ep * kHidden * 2);
    b.comm("dispatch", 3, copies * nv_frac * kDispatchBytesPerCopy, copies * ib_frac * kDispatchBytesPerCopy,
           prof.dispatch_nvlink, prof.dispatch_ib);
    b.gemm("shared_gate_up", 3, split, 2 * kMoeInter, kHidden);
    b.elementwise("shared_silu_quant", 3, split * kMoeInter * 5);
    b.gemm("shared_down", 3, split, kHidden, kMoeInter);

    // Stage 4: routed experts on the copies this GPU receives (the mean GPU).
    const double global_tokens = batch * d.query_len() * d.dp();
    const double lambda = global_tokens * kTopK / kExperts;  // tokens per expert
    const double local_experts = kExperts / ep;
    const double active = local_experts * (1 - std::exp(-lambda));
    const double received = global_tokens * kTopK / ep;
    b.grouped("grouped_gate_up", 4, active, received, 2 * kMoeInter, kHidden);
    b.elementwise("grouped_silu_quant", 4, received * kMoeInter * 5);
    b.grouped("grouped_down", 4, active, received, kHidden, kMoeInter);
    // Stage 5: combine (BF16 back, weighted sum on arrival).
    b.comm("combine", 5, copies * nv_frac * kCombineBytesPerCopy, copies * ib_frac * kCombineBytesPerCopy,
           prof.combine_nvlink, prof.combine_ib);
    // Unpermute: the weighted sum of each token's 8 returned BF16 copies onto the residual.
    b.elementwise("unpermute", 5, copies * act + split * 2 * act);
    if (d.tp > 1) b.comm("tp_all_gather", 5, tp_bytes, 0, prof.tp_collective, prof.tp_collective);
    return b.take();
}

double layer_compute_us(const Deployment& d, const Hardware& hw, const Profile& prof, bool dense) {
    const bool micro = d.schedule == Schedule::kMicroBatch;
    double s = 0;
    for (const auto& k : layer_kernels(d, hw, prof, micro ? d.batch / 2.0 : d.batch, dense))
        if (k.kind != "comm") s += k.us;
    return micro ? 2 * s : s;
}

LayerTime moe_layer_time(const Deployment& d, const Hardware& hw, const Profile& prof) {
    LayerTime lt;
    const bool micro = d.schedule == Schedule::kMicroBatch;
    lt.kernels = layer_kernels(d, hw, prof, micro ? d.batch / 2.0 : d.batch);
    const auto& ks = lt.kernels;
    const double dispatch = named_us(ks, "dispatch"), combine = named_us(ks, "combine");
    const double shared =
        named_us(ks, "shared_gate_up") + named_us(ks, "shared_silu_quant") + named_us(ks, "shared_down");
    // Compute-stream work: stages 1–3 (and the unpermute and TP all-gather of stage 5, which run
    // after combine, before the next layer's front) vs stage 4.
    const double front = sum_us(ks, 1, 3) - dispatch + named_us(ks, "unpermute") + named_us(ks, "tp_all_gather");
    const double moe = sum_us(ks, 4, 4);
    const double reps = micro ? 2 : 1;
    lt.grouped_gemm_us = reps * (named_us(ks, "grouped_gate_up") + named_us(ks, "grouped_down"));
    lt.gemm_us = reps * kind_us(ks, "gemm");
    lt.attention_us = reps * kind_us(ks, "attention");
    switch (d.schedule) {
        case Schedule::kNoOverlap:
            lt.total_us = front + moe + dispatch + combine;
            lt.dispatch_us = dispatch;
            lt.combine_us = combine;
            break;
        case Schedule::kDispatchOverlap:
            // The shared expert runs between dispatch send and recv.
            lt.total_us = front - shared + std::max(dispatch, shared) + moe + combine;
            lt.dispatch_us = std::max(0.0, dispatch - shared);
            lt.combine_us = combine;
            break;
        case Schedule::kMicroBatch: {
            // Two halves A, B offset by 3 stages; per layer the compute stream runs
            //   [B front | A dispatch] [A moe | B dispatch] [B moe | A combine] [A next front | B combine]
            // and each segment lasts as long as the longer of its compute and its communication.
            const double s1 = std::max(front, dispatch), s2 = std::max(moe, dispatch);
            const double s3 = std::max(moe, combine), s4 = std::max(front, combine);
            lt.total_us = s1 + s2 + s3 + s4;
            lt.dispatch_us = (s1 - front) + (s2 - moe);
            lt.combine_us = (s3 - moe) + (s4 - front);
            break;
        }
    }
    return lt;
}

Prediction predict(const Deployment& d, const Hardware& hw, const Profile& prof) {
    validate(d, hw);
    Prediction p;
    p.d = d;
    p.hardware = hw.name;
    p.moe_layer_us = moe_layer_time(d, hw, prof).total_us;
    double dense = 0;
    for (const auto& k : layer_kernels(d, hw, prof, d.batch, /*dense=*/true)) dense += k.us;
    p.dense_layer_us = dense;

    // MTP: eh_proj on [enorm(embed), hnorm(h)] then one MoE layer (same schedule), on every token.
    const auto mtp_front = [](LayerBuilder& lb, double rows) {
        lb.elementwise("mtp_norms", 0, rows * 2 * kHidden * 2 * 2);
        lb.gemm_bf16("eh_proj", 0, rows, kHidden, 2 * kHidden);
    };
    LayerBuilder b(hw, prof);
    const double tokens = double(d.batch) * d.query_len();
    if (d.draft_tokens > 0) mtp_front(b, tokens);
    // LM heads (the model's and MTP's; BF16, vocabulary-parallel over TP) and per-step small kernels
    // (embedding, final norm, sampling).
    const int heads = d.draft_tokens > 0 ? 2 : 1;
    for (int i = 0; i < heads; ++i) b.gemm_bf16("lm_head", 0, tokens, kVocab / d.tp, kHidden);
    for (const char* k : {"embed", "final_norm", "sample"}) b.elementwise(k, 0, tokens * kHidden * 2 * 2);
    double extra = 0;
    for (const auto& k : b.take()) (k.name == "lm_head" ? p.head_us : extra) += k.us;
    p.mtp_us = d.draft_tokens > 0 ? p.moe_layer_us + extra : 0;
    if (d.draft_tokens == 0) p.head_us += extra;
    // Each further draft is the MTP layer again, as the engine runs it: one token per request (the
    // draft just made), its norms, eh_proj, the MoE layer at query 1 and MTP's head on that row.
    if (d.draft_tokens > 1) {
        Deployment further = d;
        further.draft_tokens = 0;
        further.attention = AttentionForm::kAuto;
        double pass = moe_layer_time(further, hw, prof).total_us;
        LayerBuilder f(hw, prof);
        mtp_front(f, d.batch);
        f.gemm_bf16("lm_head", 0, d.batch, kVocab / d.tp, kHidden);
        for (const auto& k : f.take()) pass += k.us;
        p.mtp_us += (d.draft_tokens - 1) * pass;
    }

    p.step_us = kDenseLayers * p.dense_layer_us + kMoeLayers * p.moe_layer_us + p.mtp_us + p.head_us;
    double accepted = 1, chain = 1;
    for (int i = 0; i < d.draft_tokens; ++i) accepted += (chain *= d.acceptance);
    p.tokens_per_step = accepted;
    p.speed = accepted / (p.step_us * 1e-6);
    p.throughput_gpu = p.speed * d.batch / d.tp;
    p.throughput_node = p.throughput_gpu * hw.gpus_per_node;

    // KV for the context plus the step's query tokens.
    p.memory = plan_memory_instance(d.ep, d.tp, d.batch, d.kv_len + d.query_len(), d.kv_dtype);
    p.memory_total = p.memory.total();
    p.max_batch = max_batch_per_instance(hw, d.ep, d.tp, d.kv_len + d.query_len(), d.kv_dtype);
    p.fits = p.memory_total <= hw.hbm_bytes;
    return p;
}

}  // namespace fanout::plan

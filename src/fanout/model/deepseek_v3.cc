#include "fanout/model/deepseek_v3.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "fanout/ops/activation.h"
#include "fanout/ops/grouped_gemm.h"
#include "fanout/ops/linear.h"
#include "fanout/ops/moe_router.h"
#include "fanout/ops/rms_norm.h"

namespace fanout::model {
namespace {

// HF and DeepSeek build q_a_layernorm and kv_a_layernorm with the default eps, not rms_norm_eps.
constexpr float kLatentNormEps = 1e-6f;

Tensor f32(int64_t rows, int64_t cols) { return Tensor::zeros({rows, cols}, DType::kF32); }

void add_inplace(Tensor& dst, const Tensor& src) {
    float* d = dst.data_as<float>();
    const float* s = src.data_as<float>();
    for (int64_t i = 0; i < dst.numel(); ++i) d[i] += s[i];
}

}  // namespace

ops::RopeTable rope_table(const io::ModelConfig& c) {
    ops::RopeParams p;
    p.dim = c.qk_rope_head_dim;
    p.theta = c.rope_theta;
    p.attention_factor = c.rope_attention_factor();
    if (c.yarn) {
        p.yarn = true;
        p.factor = c.yarn->factor;
        p.original_max_position = c.yarn->original_max_position_embeddings;
        p.beta_fast = c.yarn->beta_fast;
        p.beta_slow = c.yarn->beta_slow;
        p.truncate = c.yarn->truncate;
    }
    return ops::make_rope_table(p);
}

int64_t StepBatch::max_query_len() const {
    int64_t m = 0;
    for (int64_t r = 0; r < num_requests(); ++r) m = std::max<int64_t>(m, query_start[r + 1] - query_start[r]);
    return m;
}

ops::AttentionMetadata StepBatch::attention_metadata() const {
    return {num_requests(), query_start.data(), kv_len.data(), block_table.data(), max_blocks, positions.data()};
}

bool runs_absorbed(const StepBatch& batch, const ForwardOptions& opts) {
    return opts.attention == AttentionForm::kAbsorbed ||
           (opts.attention == AttentionForm::kAuto && batch.max_query_len() <= opts.absorbed_max_query);
}

int64_t microbatch_split(std::span<const int32_t> query_start) {
    const int64_t R = query_start.empty() ? 0 : static_cast<int64_t>(query_start.size()) - 1;
    const int64_t T = R == 0 ? 0 : query_start[static_cast<size_t>(R)];
    int64_t r = R == 0 ? 0 : 1;  // the first holds at least one request
    for (int64_t c = 2; c <= R; ++c)
        if (std::abs(2 * int64_t{query_start[c]} - T) < std::abs(2 * int64_t{query_start[r]} - T)) r = c;
    return r;
}

std::pair<StepBatch, StepBatch> split_microbatches(const StepBatch& batch) {
    const int64_t R = batch.num_requests(), r = microbatch_split(batch.query_start);
    const auto part = [&](int64_t r0, int64_t r1) {
        StepBatch b;
        const int32_t t0 = batch.query_start.empty() ? 0 : batch.query_start[r0];
        const int32_t t1 = batch.query_start.empty() ? 0 : batch.query_start[r1];
        b.tokens.assign(batch.tokens.begin() + t0, batch.tokens.begin() + t1);
        b.positions.assign(batch.positions.begin() + t0, batch.positions.begin() + t1);
        b.slots.assign(batch.slots.begin() + t0, batch.slots.begin() + t1);
        for (int64_t i = r0; i <= r1 && !batch.query_start.empty(); ++i)
            b.query_start.push_back(batch.query_start[i] - t0);
        if (b.query_start.empty()) b.query_start.push_back(0);
        b.kv_len.assign(batch.kv_len.begin() + r0, batch.kv_len.begin() + r1);
        b.max_blocks = batch.max_blocks;
        b.block_table.assign(batch.block_table.begin() + r0 * batch.max_blocks,
                             batch.block_table.begin() + r1 * batch.max_blocks);
        for (int32_t row : batch.logit_rows)
            if (row >= t0 && row < t1) b.logit_rows.push_back(row - t0);
        b.all_hidden = batch.all_hidden;
        return b;
    };
    return {part(0, r), part(r, R)};
}

StepBatchBuilder& StepBatchBuilder::add(std::span<const int32_t> tokens, int64_t start, const kv::SequenceBlocks& seq,
                                        Logits logits) {
    if (batch_.query_start.empty()) batch_.query_start.push_back(0);
    const int64_t end = start + static_cast<int64_t>(tokens.size());
    const int64_t first_row = batch_.num_tokens();
    for (size_t i = 0; i < tokens.size(); ++i) {
        batch_.tokens.push_back(tokens[i]);
        batch_.positions.push_back(static_cast<int32_t>(start + static_cast<int64_t>(i)));
        batch_.slots.push_back(cache_.slot(seq, start + static_cast<int64_t>(i)));
        if (logits == Logits::kAll) batch_.logit_rows.push_back(static_cast<int32_t>(first_row + i));
    }
    if (logits == Logits::kLast && !tokens.empty())
        batch_.logit_rows.push_back(static_cast<int32_t>(batch_.num_tokens() - 1));
    batch_.query_start.push_back(static_cast<int32_t>(batch_.num_tokens()));
    batch_.kv_len.push_back(static_cast<int32_t>(end));
    tables_.push_back(seq.blocks);
    return *this;
}

StepBatch StepBatchBuilder::build() {
    if (batch_.query_start.empty()) batch_.query_start.push_back(0);
    int64_t max_blocks = 1;
    for (const auto& t : tables_) max_blocks = std::max<int64_t>(max_blocks, static_cast<int64_t>(t.size()));
    batch_.max_blocks = max_blocks;
    batch_.block_table.assign(tables_.size() * static_cast<size_t>(max_blocks), -1);
    for (size_t r = 0; r < tables_.size(); ++r)
        std::copy(tables_[r].begin(), tables_[r].end(),
                  batch_.block_table.begin() + static_cast<int64_t>(r) * max_blocks);
    return std::move(batch_);
}

DeepseekV3::DeepseekV3(io::ModelConfig config, ModelWeights weights)
    : config_(std::move(config)), weights_(std::move(weights)), rope_(rope_table(config_)) {}

std::unique_ptr<DeepseekV3> DeepseekV3::load(const std::string& dir, const ParallelConfig& plan,
                                             const LoadOptions& opts) {
    io::ModelConfig config = io::load_model_config(dir);
    io::Checkpoint::Progress on_shard;
    if (opts.progress)
        on_shard = [progress = opts.progress](int i, int n, const std::string&) {
            progress({fmt::format("opening shard {}/{}", i + 1, n), i + 1, n});
        };
    ModelWeights w = load_weights(io::Checkpoint::open(dir, on_shard), config, plan, opts);
    return std::make_unique<DeepseekV3>(std::move(config), std::move(w));
}

kv::KvCacheConfig DeepseekV3::kv_cache_config(int64_t num_blocks, DType dtype) const {
    kv::KvCacheConfig k;
    k.num_layers = config_.num_hidden_layers + (weights_.mtp ? 1 : 0);
    k.entry_dim = config_.kv_entry_dim();
    k.kv_lora = config_.kv_lora_rank;
    k.num_blocks = num_blocks;
    k.dtype = dtype;
    return k;
}

Tensor DeepseekV3::embed(const Tensor& table, std::span<const int32_t> tokens) const {
    const int64_t D = config_.hidden_size, V = config_.vocab_size;
    Tensor out = f32(static_cast<int64_t>(tokens.size()), D);
    const size_t row_bytes = static_cast<size_t>(D) * dtype_size(table.dtype());
    for (size_t t = 0; t < tokens.size(); ++t) {
        FANOUT_CHECK(tokens[t] >= 0 && tokens[t] < V, "token id {} at index {} is outside the vocabulary [0, {})",
                     tokens[t], t, V);
        convert_to_f32(static_cast<const char*>(table.data()) + static_cast<size_t>(tokens[t]) * row_bytes,
                       table.dtype(), static_cast<size_t>(D), out.data_as<float>() + static_cast<int64_t>(t) * D);
    }
    return out;
}

void DeepseekV3::mlp(const MlpWeights& w, const Tensor& x, Tensor& out, const ForwardOptions& opts,
                     const Stream& s) const {
    const int64_t M = x.dim(0), I = w.gate.out_features;
    Tensor gate = f32(M, I), up = f32(M, I);
    ops::linear(x, w.gate, gate, opts.fp8_mode, s);
    ops::linear(x, w.up, up, opts.fp8_mode, s);
    ops::silu_mul(gate, up, gate, s);
    ops::linear(gate, w.down, out, opts.fp8_mode, s);
}

// Layer `layer` of the cache as the attention ops take it.
static ops::LatentCache latent_cache(const kv::PagedKvCache& cache, int64_t layer) {
    const kv::KvCacheConfig& k = cache.config();
    return {cache.layer_data(layer), k.dtype, k.num_blocks, k.block_size, k.entry_dim, k.kv_lora};
}

void DeepseekV3::stage_attn_in(const LayerWeights& w, int64_t layer, LayerState& st, const StepBatch& batch,
                               kv::PagedKvCache& cache, const Stream& s, const ForwardOptions& opts) const {
    const io::ModelConfig& c = config_;
    const int64_t T = batch.num_tokens(), D = c.hidden_size, H = heads();
    const int64_t kv_lora = c.kv_lora_rank, rope = c.qk_rope_head_dim;
    FANOUT_CHECK(weights_.parallel.tp == 1 || (opts.tp != nullptr && opts.tp->size() == weights_.parallel.tp &&
                                               opts.tp->rank() == weights_.parallel.tp_rank()),
                 "this model holds TP rank {} of {}'s heads: its steps need that rank of a TP group "
                 "(ForwardOptions::tp)",
                 weights_.parallel.tp_rank(), weights_.parallel.tp);
    const AttentionWeights& a = w.attn;
    Tensor x = f32(T, D);
    ops::rms_norm(st.hidden, w.input_norm, static_cast<float>(c.rms_norm_eps), x, s);

    st.q = Tensor::zeros({T, H, c.qk_head_dim()}, DType::kF32);
    Tensor q2d = st.q.reshape({T, H * c.qk_head_dim()});
    if (c.q_lora_rank > 0) {
        Tensor qa = f32(T, c.q_lora_rank);
        ops::linear(x, a.q_a, qa, opts.fp8_mode, s);
        ops::rms_norm(qa, a.q_a_norm, kLatentNormEps, qa, s);
        ops::linear(qa, a.q_b, q2d, opts.fp8_mode, s);
    } else {
        ops::linear(x, a.q_proj, q2d, opts.fp8_mode, s);
    }
    ops::rope_apply(st.q, c.qk_nope_head_dim, batch.positions.data(), rope_, s);

    // kv_a: [T, kv_lora + rope] -> entry [normalized latent | roped k_pe], appended to the cache.
    Tensor entry = f32(T, kv_lora + rope);
    ops::linear(x, a.kv_a, entry, opts.fp8_mode, s);
    Tensor latent = f32(T, kv_lora);
    for (int64_t t = 0; t < T; ++t)
        std::memcpy(latent.data_as<float>() + t * kv_lora, entry.data_as<float>() + t * (kv_lora + rope),
                    static_cast<size_t>(kv_lora) * sizeof(float));
    ops::rms_norm(latent, a.kv_a_norm, kLatentNormEps, latent, s);
    for (int64_t t = 0; t < T; ++t)
        std::memcpy(entry.data_as<float>() + t * (kv_lora + rope), latent.data_as<float>() + t * kv_lora,
                    static_cast<size_t>(kv_lora) * sizeof(float));
    Tensor entry3 = entry.reshape({T, 1, kv_lora + rope});
    ops::rope_apply(entry3, kv_lora, batch.positions.data(), rope_, s);
    ops::LatentCache lc = latent_cache(cache, layer);
    ops::kv_append(lc, entry, batch.slots.data(), s);
}

void DeepseekV3::stage_attn_out(const LayerWeights& w, int64_t layer, LayerState& st, const StepBatch& batch,
                                kv::PagedKvCache& cache, const Stream& s, const ForwardOptions& opts) const {
    const io::ModelConfig& c = config_;
    const int64_t T = batch.num_tokens(), D = c.hidden_size, H = heads();
    ops::LatentCache lc = latent_cache(cache, layer);
    const ops::AttentionMetadata meta = batch.attention_metadata();
    Tensor attn = Tensor::zeros({T, H, c.v_head_dim}, DType::kF32);
    const float scale = static_cast<float>(c.softmax_scale());
    if (runs_absorbed(batch, opts)) {
        ops::mla_attention_absorbed(st.q, w.attn.kv_b, lc, meta, c.kv_lora_rank, c.qk_nope_head_dim, c.v_head_dim,
                                    scale, attn, s);
    } else {
        ops::mla_attention_mha(st.q, w.attn.kv_b, opts.fp8_mode, lc, meta, c.kv_lora_rank, c.qk_nope_head_dim,
                               c.v_head_dim, scale, attn, s);
    }
    Tensor o = f32(T, D);
    ops::linear(attn.reshape({T, H * c.v_head_dim}), w.attn.o, o, opts.fp8_mode, s);
    if (opts.tp != nullptr) opts.tp->all_reduce_sum(o.data_as<float>(), T * D);  // every rank's heads
    add_inplace(st.hidden, o);
    st.tp_tokens = T;
    if (opts.tp != nullptr) {  // the MoE half on this rank's slice of the tokens
        const int r = opts.tp->rank(), n = opts.tp->size();
        const int64_t b = comm::tp_slice_begin(T, r, n), e = comm::tp_slice_begin(T, r + 1, n);
        Tensor part = f32(e - b, D);
        std::memcpy(part.data(), st.hidden.data_as<float>() + b * D, static_cast<size_t>((e - b) * D) * sizeof(float));
        st.hidden = std::move(part);
    }
    const int64_t Tm = st.hidden.dim(0);
    st.normed = f32(Tm, D);
    ops::rms_norm(st.hidden, w.post_norm, static_cast<float>(c.rms_norm_eps), st.normed, s);
    if (!w.is_moe) return;
    const int64_t E = c.n_routed_experts, K = c.num_experts_per_tok;
    Tensor logits = f32(Tm, E);
    ops::linear(st.normed, w.moe.router, logits, opts.fp8_mode, s);
    st.topk_idx = Tensor::zeros({Tm, K}, DType::kI32);
    st.topk_weight = f32(Tm, K);
    const ops::RouterParams rp{static_cast<int>(E),
                               static_cast<int>(K),
                               static_cast<int>(c.n_group),
                               static_cast<int>(c.topk_group),
                               c.norm_topk_prob,
                               static_cast<float>(c.routed_scaling_factor)};
    ops::moe_route(logits, w.moe.bias.data_as<float>(), rp, st.topk_idx, st.topk_weight, s);
}

void DeepseekV3::stage_shared(const LayerWeights& w, LayerState& st, const Stream& s,
                              const ForwardOptions& opts) const {
    const int64_t T = st.normed.dim(0), D = config_.hidden_size;
    st.shared_out = f32(T, D);
    if (!w.is_moe) {
        mlp(w.mlp, st.normed, st.shared_out, opts, s);  // a dense layer's MLP takes this slot
    } else if (w.moe.shared) {
        mlp(*w.moe.shared, st.normed, st.shared_out, opts, s);
    }
}

comm::EpConfig DeepseekV3::ep_config(const ParallelConfig& parallel, int64_t max_tokens_per_rank) const {
    return comm::EpConfig::for_rank(
        parallel, static_cast<int>(config_.n_routed_experts), static_cast<int>(config_.num_experts_per_tok),
        static_cast<int>(config_.hidden_size), static_cast<int>(max_tokens_per_rank), comm::Payload::kF32);
}

void DeepseekV3::stage_dispatch_send(const LayerWeights& w, LayerState& st, const ForwardOptions& opts) const {
    if (!w.is_moe || opts.ep == nullptr) return;
    const comm::EpConfig& ec = opts.ep->config();
    FANOUT_CHECK(ec.payload == comm::Payload::kF32 && ec.hidden == config_.hidden_size &&
                     ec.num_experts == config_.n_routed_experts && ec.expert_begin() == w.moe.expert_begin &&
                     ec.local_experts() == w.moe.expert_end - w.moe.expert_begin,
                 "EP group (rank {} of {}, {} experts, payload {}) does not match the experts this model holds "
                 "([{}, {}) of {}): build it with DeepseekV3::ep_config",
                 ec.rank, ec.world, ec.num_experts, static_cast<int>(ec.payload), w.moe.expert_begin, w.moe.expert_end,
                 config_.n_routed_experts);
    st.num_tokens = static_cast<int32_t>(st.normed.dim(0));
    opts.ep->dispatch_send({&st.num_tokens, st.normed.data(), nullptr, st.topk_idx.data_as<int32_t>()});
}

// The routed experts of this rank on what dispatch delivered: [local, max_m, D] f32, the first
// counts[e] rows of expert e real. The intermediate activations hold only those rows; `out` keeps
// the receive layout combine reads ([local, max_m, D], allocated once and reused by every layer
// of the step — rows past a count are never read).
static void run_received_experts(const MoeWeights& m, const comm::ExpertBatch& b, int64_t D, int64_t I, Tensor& out,
                                 const ForwardOptions& opts, const Stream& s) {
    const int64_t EL = m.expert_end - m.expert_begin, M = b.max_m;
    std::vector<int64_t> offset(static_cast<size_t>(EL) + 1, 0);
    for (int64_t e = 0; e < EL; ++e) offset[e + 1] = offset[e] + std::clamp<int64_t>(b.counts[e], 0, M);
    const Tensor x = Tensor::view(const_cast<void*>(b.tokens), DType::kF32, {EL * M, D});
    Tensor g = Tensor::zeros({offset[EL], I}, DType::kF32), u = Tensor::zeros({offset[EL], I}, DType::kF32);
    for (int64_t e = 0; e < EL; ++e) {
        if (offset[e + 1] == offset[e]) continue;
        const Tensor xe = x.slice_rows(e * M, e * M + offset[e + 1] - offset[e]);
        Tensor ge = g.slice_rows(offset[e], offset[e + 1]), ue = u.slice_rows(offset[e], offset[e + 1]);
        ops::linear(xe, m.experts[static_cast<size_t>(e)].gate, ge, opts.fp8_mode, s);
        ops::linear(xe, m.experts[static_cast<size_t>(e)].up, ue, opts.fp8_mode, s);
    }
    ops::silu_mul(g, u, g, s);
    if (!out.defined() || out.shape() != Shape{EL, M, D}) out = Tensor::zeros({EL, M, D}, DType::kF32);
    for (int64_t e = 0; e < EL; ++e) {
        if (offset[e + 1] == offset[e]) continue;
        Tensor oe = out.reshape({EL * M, D}).slice_rows(e * M, e * M + offset[e + 1] - offset[e]);
        ops::linear(g.slice_rows(offset[e], offset[e + 1]), m.experts[static_cast<size_t>(e)].down, oe, opts.fp8_mode,
                    s);
    }
}

void DeepseekV3::stage_experts(const LayerWeights& w, LayerState& st, const Stream& s,
                               const ForwardOptions& opts) const {
    if (!w.is_moe) return;
    const MoeWeights& m = w.moe;
    if (opts.ep != nullptr) {
        opts.ep->dispatch_recv();
        run_received_experts(m, opts.ep->recv_batch(), config_.hidden_size, config_.moe_intermediate_size,
                             st.expert_rows, opts, s);
        opts.ep->combine_send(st.expert_rows.data());
        return;
    }
    const int64_t T = st.normed.dim(0), D = config_.hidden_size, K = config_.num_experts_per_tok;
    const int64_t E_local = m.expert_end - m.expert_begin;
    FANOUT_CHECK(E_local == config_.n_routed_experts,
                 "this rank holds experts [{}, {}) of {}; routing to other ranks needs the comm layer", m.expert_begin,
                 m.expert_end, config_.n_routed_experts);
    // Per expert: count, then contiguous rows (the receive layout the grouped GEMM consumes).
    const int32_t* idx = st.topk_idx.data_as<int32_t>();
    std::vector<int64_t> offset(static_cast<size_t>(E_local) + 1, 0);
    for (int64_t i = 0; i < T * K; ++i) ++offset[idx[i] - m.expert_begin + 1];
    for (int64_t e = 0; e < E_local; ++e) offset[e + 1] += offset[e];
    std::vector<int64_t> fill(offset.begin(), offset.end() - 1);
    st.row_of.assign(static_cast<size_t>(T * K), 0);
    Tensor rows_in = f32(T * K, D);
    for (int64_t i = 0; i < T * K; ++i) {
        const int64_t row = fill[idx[i] - m.expert_begin]++;
        st.row_of[i] = static_cast<int32_t>(row);
        std::memcpy(rows_in.data_as<float>() + row * D, st.normed.data_as<float>() + (i / K) * D,
                    static_cast<size_t>(D) * sizeof(float));
    }
    // gate, up -> silu(gate) * up -> down, each one grouped GEMM over the experts' row ranges.
    std::vector<ops::LinearWeight> gate, up, down;
    for (const MlpWeights& w : m.experts) {
        gate.push_back(w.gate);
        up.push_back(w.up);
        down.push_back(w.down);
    }
    const int64_t I = config_.moe_intermediate_size;
    Tensor g = f32(T * K, I), u = f32(T * K, I);
    ops::grouped_linear_contiguous(rows_in, gate, offset, g, opts.fp8_mode, s);
    ops::grouped_linear_contiguous(rows_in, up, offset, u, opts.fp8_mode, s);
    ops::silu_mul(g, u, g, s);
    st.expert_rows = f32(T * K, D);
    ops::grouped_linear_contiguous(g, down, offset, st.expert_rows, opts.fp8_mode, s);
}

void DeepseekV3::stage_combine(const LayerWeights& w, LayerState& st, const Stream& s,
                               const ForwardOptions& opts) const {
    combine_into_residual(w, st, s, opts);
    if (opts.tp == nullptr) return;
    // Every rank's slice back into the whole step's residual stream, for the next attention.
    const int64_t D = config_.hidden_size, T = st.tp_tokens;
    Tensor full = f32(T, D);
    opts.tp->all_gather_rows(st.hidden.data_as<float>(), st.hidden.dim(0), D, full.data_as<float>());
    st.hidden = std::move(full);
}

void DeepseekV3::combine_into_residual(const LayerWeights& w, LayerState& st, const Stream& s,
                                       const ForwardOptions& opts) const {
    const int64_t T = st.hidden.dim(0), D = config_.hidden_size, K = config_.num_experts_per_tok;
    float* h = st.hidden.data_as<float>();
    const float* shared = st.shared_out.data_as<float>();
    if (w.is_moe && opts.ep != nullptr) {
        // combine receive: Σ_k weight · expert output per token, summed by the backend in choice order.
        Tensor routed = f32(T, D);
        opts.ep->combine_recv(st.topk_weight.data_as<float>(), routed.data());
        const float* r = routed.data_as<float>();
        parallel_for(s, T, 4, [&](int64_t t0, int64_t t1) {
            for (int64_t i = t0 * D; i < t1 * D; ++i) h[i] += shared[i] + r[i];
        });
        return;
    }
    parallel_for(s, T, 4, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
            float* ht = h + t * D;
            for (int64_t d = 0; d < D; ++d) ht[d] += shared[t * D + d];
            if (!w.is_moe) continue;
            for (int64_t k = 0; k < K; ++k) {
                const float wt = st.topk_weight.data_as<float>()[t * K + k];
                const float* row = st.expert_rows.data_as<float>() + st.row_of[t * K + k] * D;
                for (int64_t d = 0; d < D; ++d) ht[d] += wt * row[d];
            }
        }
    });
}

void DeepseekV3::run_layer(const LayerWeights& w, int64_t layer, LayerState& st, const StepBatch& batch,
                           kv::PagedKvCache& cache, const ForwardOptions& opts, const Stream& s) const {
    stage_attn_in(w, layer, st, batch, cache, s, opts);
    stage_attn_out(w, layer, st, batch, cache, s, opts);
    stage_dispatch_send(w, st, opts);
    stage_shared(w, st, s, opts);
    stage_experts(w, st, s, opts);
    stage_combine(w, st, s, opts);
}

DeepseekV3::Output DeepseekV3::head(const Tensor& hidden, const Tensor& norm, const ops::LinearWeight& lm_head,
                                    const StepBatch& batch, const ForwardOptions& opts, const Stream& s) const {
    const int64_t D = config_.hidden_size, R = static_cast<int64_t>(batch.logit_rows.size());
    Output out;
    Tensor normed;  // the logit rows, normed
    if (batch.all_hidden) {
        out.hidden = f32(batch.num_tokens(), D);
        ops::rms_norm(hidden, norm, static_cast<float>(config_.rms_norm_eps), out.hidden, s);
        normed = out.hidden.gather_rows(batch.logit_rows);
    } else {
        out.hidden = f32(R, D);
        ops::rms_norm(hidden.gather_rows(batch.logit_rows), norm, static_cast<float>(config_.rms_norm_eps), out.hidden,
                      s);
        normed = out.hidden;
    }
    out.logits = f32(R, config_.vocab_size);
    ops::linear(normed, lm_head, out.logits, opts.fp8_mode, s);
    return out;
}

static void check_batch(const StepBatch& batch, const kv::PagedKvCache& cache, int64_t layer) {
    FANOUT_CHECK(layer < cache.config().num_layers, "kv cache has {} layers; the model needs layer {}",
                 cache.config().num_layers, layer);
    for (int32_t r : batch.logit_rows)
        FANOUT_CHECK(r >= 0 && r < batch.num_tokens(), "logit row {} outside the step's {} tokens", r,
                     batch.num_tokens());
}

Tensor DeepseekV3::run_microbatched(const StepBatch& batch, kv::PagedKvCache& cache, const ForwardOptions& opts,
                                    const Stream& s) const {
    FANOUT_CHECK(opts.ep == nullptr || opts.microbatch_ep != nullptr,
                 "a microbatched step under expert parallelism needs the second microbatch's EP group "
                 "(ForwardOptions::microbatch_ep)");
    const auto [b0, b1] = split_microbatches(batch);
    const StepBatch* mb[2] = {&b0, &b1};
    ForwardOptions o[2] = {opts, opts};
    o[1].ep = opts.microbatch_ep;
    LayerState st[2];
    for (int i = 0; i < 2; ++i) st[i].hidden = embed(weights_.embed, mb[i]->tokens);
    for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
        const LayerWeights& w = weights_.layers[l];
        for (int i = 0; i < 2; ++i) {  // the second's attention while the first's tokens are dispatched
            stage_attn_in(w, l, st[i], *mb[i], cache, s, o[i]);
            stage_attn_out(w, l, st[i], *mb[i], cache, s, o[i]);
            stage_dispatch_send(w, st[i], o[i]);
        }
        for (int i = 0; i < 2; ++i) {  // the first's experts while the second's tokens are dispatched
            stage_shared(w, st[i], s, o[i]);
            stage_experts(w, st[i], s, o[i]);
        }
        for (int i = 0; i < 2; ++i) stage_combine(w, st[i], s, o[i]);
    }
    const int64_t T0 = st[0].hidden.dim(0), D = config_.hidden_size;
    Tensor hidden = f32(batch.num_tokens(), D);
    std::memcpy(hidden.data(), st[0].hidden.data(), st[0].hidden.nbytes());
    std::memcpy(hidden.data_as<float>() + T0 * D, st[1].hidden.data(), st[1].hidden.nbytes());
    return hidden;
}

DeepseekV3::Output DeepseekV3::forward(const StepBatch& batch, kv::PagedKvCache& cache, const ForwardOptions& opts,
                                       const Stream& s) const {
    check_batch(batch, cache, config_.num_hidden_layers - 1);
    if (batch.microbatch)
        return head(run_microbatched(batch, cache, opts, s), weights_.final_norm, weights_.lm_head, batch, opts, s);
    LayerState st;
    st.hidden = embed(weights_.embed, batch.tokens);
    for (int64_t l = 0; l < config_.num_hidden_layers; ++l) run_layer(weights_.layers[l], l, st, batch, cache, opts, s);
    return head(st.hidden, weights_.final_norm, weights_.lm_head, batch, opts, s);
}

DeepseekV3::Output DeepseekV3::forward_mtp(const StepBatch& batch, const Tensor& prev_hidden, kv::PagedKvCache& cache,
                                           const ForwardOptions& opts, const Stream& s) const {
    FANOUT_CHECK(weights_.mtp.has_value(), "this model has no MTP layer (num_nextn_predict_layers = 0)");
    const MtpWeights& m = *weights_.mtp;
    const int64_t T = batch.num_tokens(), D = config_.hidden_size;
    check_tensor(prev_hidden, "forward_mtp prev_hidden", DType::kF32, {T, D});
    check_batch(batch, cache, config_.num_hidden_layers);
    const float eps = static_cast<float>(config_.rms_norm_eps);
    Tensor e = embed(m.embed, batch.tokens);
    Tensor cat = f32(T, 2 * D);
    Tensor en = f32(T, D), hn = f32(T, D);
    ops::rms_norm(e, m.enorm, eps, en, s);
    ops::rms_norm(prev_hidden, m.hnorm, eps, hn, s);
    for (int64_t t = 0; t < T; ++t) {
        std::memcpy(cat.data_as<float>() + t * 2 * D, en.data_as<float>() + t * D, static_cast<size_t>(D) * 4);
        std::memcpy(cat.data_as<float>() + t * 2 * D + D, hn.data_as<float>() + t * D, static_cast<size_t>(D) * 4);
    }
    LayerState st;
    st.hidden = f32(T, D);
    ops::linear(cat, m.eh_proj, st.hidden, opts.fp8_mode, s);
    run_layer(m.layer, config_.num_hidden_layers, st, batch, cache, opts, s);
    return head(st.hidden, m.head_norm, m.head, batch, opts, s);
}

}  // namespace fanout::model

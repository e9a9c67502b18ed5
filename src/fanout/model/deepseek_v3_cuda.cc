#include "fanout/model/deepseek_v3_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <functional>
#include <map>
#include <numeric>
#include <tuple>

#include "fanout/core/cuda_check.h"
#include "fanout/core/cuda_graph.h"
#include "fanout/model/cuda_layer.h"
#include "fanout/model/weight_upload.h"
#include "fanout/ops/fp8_quant.h"
#include "fanout/ops/gemm.h"
#include "fanout/ops/model_glue_cuda.h"
#include "fanout/ops/rms_norm.h"

namespace fanout::model {
namespace {

// Logit-bias entries the step buffer holds at first (it grows on demand).
constexpr size_t kInitialLogitBias = 1024;

int64_t logit_rows_limit(const CudaModelOptions& o) {
    return o.max_logit_rows > 0 ? o.max_logit_rows : std::min(o.max_step_tokens, o.max_requests * kMaxGraphQueryLen);
}

int64_t mha_context_limit(const CudaModelOptions& o) { return std::min(o.max_context, o.max_mha_context); }

// Which of an eager step's (or microbatch's) requests run attention in the MHA form: those from
// its first prefill chunk (more query tokens than a graph's) on — its decodes come first (the
// scheduler's order) and run the absorbed form; a short chunk after a long one joins the MHA
// form (its context expanded too) — when their contexts fit the MHA buffers together. keys 0:
// none, every request in the absorbed form. query_start: R + 1 offsets, from any first row (a
// second microbatch's); the split's rows count from it.
struct MhaStep {
    int keys = 0;
    int first_request = 0, first_row = 0;  // requests and rows before them: the absorbed form
    int max_q = 0;                         // the longest chunk
    int absorbed_max_q = 0;                // the longest query before them
};
MhaStep mha_split(std::span<const int32_t> query_start, std::span<const int32_t> kv_len, const CudaModelOptions& o) {
    const int R = static_cast<int>(kv_len.size());
    const auto q = [&](int r) { return query_start[r + 1] - query_start[r]; };
    MhaStep out;
    while (out.first_request < R && q(out.first_request) <= kMaxGraphQueryLen)
        out.absorbed_max_q = std::max(out.absorbed_max_q, q(out.first_request++));
    if (out.first_request == R) return {};
    int64_t keys = 0;
    for (int r = out.first_request; r < R; ++r) {
        keys += kv_len[r];
        out.max_q = std::max(out.max_q, q(r));
    }
    if (keys > mha_context_limit(o)) return {};
    out.keys = static_cast<int>(keys);
    out.first_row = query_start[out.first_request] - query_start[0];
    return out;
}
// The MHA split of a whole step, or (two microbatches) of each.
using MhaSteps = std::array<MhaStep, 2>;

// The layer's step buffers for the runner's limits: every expert on this GPU (EP1) or the EP
// rank's block with the backend's receive rows, decode steps (up to max_requests × the graphs'
// query length) in the capped masked layout, FP8 experts when the weight plan makes them
// (experts_run_fp8).
LayerLimits layer_limits(const io::ModelConfig& c, const CudaModelOptions& opts) {
    LayerLimits l;
    l.max_tokens = opts.max_step_tokens;
    l.max_masked_tokens = std::min(opts.max_step_tokens, opts.max_requests * kMaxGraphQueryLen);
    l.num_local_experts = opts.ep ? opts.ep->config().local_experts() : c.n_routed_experts;
    l.max_dispatch_m = opts.ep ? opts.ep->config().rows_per_expert() : 0;
    l.max_prefill_ctx = mha_context_limit(opts);
    l.fp8_experts = experts_run_fp8(c);
    return l;
}

// The second microbatch's exec: the same steps and backend rows, the MHA form's expansion buffers
// the first exec's.
LayerLimits microbatch_limits(const io::ModelConfig& c, const CudaModelOptions& opts) {
    LayerLimits l = layer_limits(c, opts);
    l.mha_buffers_lent = l.max_prefill_ctx > 0;  // the first exec's (share_mha_buffers: one stream, in turn)
    l.shared_beside = false;                     // it only runs through run_microbatched
    if (opts.microbatch_ep) l.max_dispatch_m = opts.microbatch_ep->config().rows_per_expert();
    return l;
}

// The query rows of a decode step: 1, or with MTP the last token and its drafts.
int64_t decode_query_len(const CudaModelOptions& o) { return 1 + o.mtp_draft_tokens; }

// The request counts decode graphs are captured for: 1, 2, 4, … up to max_requests (and the
// step's token limit); a step of R requests replays the bucket next_pow2(R).
std::vector<int64_t> decode_buckets(const CudaModelOptions& o) {
    std::vector<int64_t> out;
    const int64_t q = decode_query_len(o);
    // A bucket's graph keeps every row's logits with MTP (R · q), one per request without: only
    // those that fit the step's logit rows (a max_logit_rows below that is never replayed either).
    for (int64_t R = 1; R <= o.max_requests && R * q <= o.max_step_tokens && (q > 1 ? R * q : R) <= logit_rows_limit(o);
         R *= 2)
        out.push_back(R);
    return out;
}

int64_t next_pow2(int64_t n) {
    int64_t b = 1;
    while (b < n) b *= 2;
    return b;
}

// How a step splits: the first microbatch holds requests [0, R0) — tokens [0, T0) — the second
// the rest (cuda_layer.h's run_microbatched). !on: one batch.
struct StepSplit {
    bool on = false;
    int R0 = 0, T0 = 0;
};

}  // namespace

struct CudaModel::Impl {
    io::ModelConfig c;
    CudaModelOptions opts;
    std::unique_ptr<ops::DeviceContext> ctx;  // the stream every step runs on, cuBLASLt, scratch
    cudaStream_t stream = nullptr;            // ctx's
    int64_t max_blocks_per_request = 0, num_blocks = 0, pad_block = 0;

    DeviceModelWeights w;
    StreamStats upload;
    // [layers, num_blocks + 1, block] entries of cache_config().entry_bytes() (bf16 values or FP8
    // entries: opts.kv_dtype); the last block is the padding scratch. layer_bytes: one layer's.
    DeviceArray<uint8_t> cache;
    size_t layer_bytes = 0;

    // Step inputs at fixed addresses (what a captured graph reads).
    DeviceArray<int32_t> tokens, positions, slots, query_start, kv_len, block_table, logit_rows, out_tokens, num_tokens;
    // The MHA form's requests (mha_split): their key offsets (prefix sums of kv_len) and query
    // offsets from their first row; the second microbatch's from mha_second on.
    DeviceArray<int32_t> kv_start, mha_query_start;
    size_t mha_second = 0;                 // max_requests + 1
    CudaModel::AttentionSplit last_split;  // of the last step run (last_attention_split)
    DeviceArray<ops::SamplingRow> sampling;
    DeviceArray<ops::LogitBias> logit_bias;
    DeviceArray<uint16_t> hidden, rows, rows_normed;
    DeviceArray<float> logits;
    std::unique_ptr<CudaLayerExec> exec;
    // The two-microbatch schedule (opts.microbatch): the second microbatch's exec, and its
    // requests' starts from 0 (its other step inputs are views into the arrays above).
    std::unique_ptr<CudaLayerExec> exec_mb;
    DeviceArray<int32_t> query_start_mb;
    using Split = StepSplit;
    // MTP: every row's final-normed hidden state of the last all_hidden step [T, D]; the MTP
    // layer's input rows gathered from it (or from mtp_hidden) [T, D], its [enorm | hnorm] input
    // [T, 2D], its logit rows' head-normed hidden states [L, D]; the rows to gather [T].
    DeviceArray<uint16_t> normed_all, mtp_prev, mtp_cat, mtp_hidden;
    DeviceArray<int32_t> prev_rows;
    int64_t kept_rows = 0, kept_mtp_rows = 0;  // rows of normed_all / mtp_hidden the last steps filled

    struct Graph {
        cudaGraphExec_t exec = nullptr;
    };
    // What a graph runs: the model's step, or an MTP pass (reading normed_all, or chained mtp_hidden).
    enum class Pass { kModel, kMtp, kMtpChained };
    // (pass, q, requests, sampled, every row's logits, hidden states kept, two microbatches) -> graph
    std::map<std::tuple<Pass, int64_t, int64_t, bool, bool, bool, bool>, Graph> graphs;

    ~Impl() {
        drop_graphs();
        exec_mb.reset();
        exec.reset();
        ctx.reset();
    }

    void drop_graphs() {
        for (auto& [k, g] : graphs)
            if (g.exec) cudaGraphExecDestroy(g.exec);
        graphs.clear();
    }

    // The device cache's geometry (num_layers 0: the host allocator holds no entries).
    kv::KvCacheConfig cache_config() const {
        kv::KvCacheConfig k;
        k.num_layers = 0;
        k.entry_dim = c.kv_entry_dim();
        k.kv_lora = c.kv_lora_rank;
        k.num_blocks = num_blocks;
        k.dtype = opts.kv_dtype;
        return k;
    }

    int num_layers_cached() const { return static_cast<int>(c.num_hidden_layers + (w.mtp ? 1 : 0)); }
    ops::DeviceLatentCache cache_layer(int64_t l) {
        uint8_t* layer = cache.get() + static_cast<size_t>(l) * layer_bytes;
        if (opts.kv_dtype == DType::kFP8E4M3) return {nullptr, layer};
        return {reinterpret_cast<uint16_t*>(layer), nullptr};
    }

    LayerStep layer_step(int T, int R, int max_q, const MhaStep& mha) {
        LayerStep st;
        st.num_tokens = num_tokens.get();
        st.T = T;
        st.R = R;
        st.max_q = max_q;
        st.positions = positions.get();
        st.slots = slots.get();
        st.query_start = query_start.get();
        st.kv_len = kv_len.get();
        st.block_table = block_table.get();
        st.max_blocks = static_cast<int>(max_blocks_per_request);
        set_mha(st, mha, 0);
        return st;
    }
    // st's MHA-form fields from `mha`, its offsets at `offset` of the arrays.
    void set_mha(LayerStep& st, const MhaStep& mha, size_t offset) {
        st.prefill_ctx = mha.keys;
        st.mha_request = mha.first_request;
        st.mha_row = mha.first_row;
        st.mha_max_q = mha.max_q;
        st.absorbed_max_q = mha.absorbed_max_q;
        st.kv_start = mha.keys > 0 ? kv_start.get() + offset : nullptr;
        st.mha_query_start = mha.keys > 0 ? mha_query_start.get() + offset : nullptr;
    }

    // The two microbatches of `whole` split at `mb`: the first the whole step's arrays cut at R0 /
    // T0, the second views past them (its request starts from query_start_mb, its token count in
    // num_tokens[1], its MHA split second_mha); a one-request prefill chunk is all in the first.
    std::array<Microbatch, 2> microbatches(const LayerStep& whole, const Split& mb, const MhaStep& second_mha) {
        LayerStep a = whole, b = whole;
        a.T = mb.T0;
        a.R = mb.R0;
        b.T = whole.T - mb.T0;
        b.R = whole.R - mb.R0;
        b.positions += mb.T0;
        b.slots += mb.T0;
        b.query_start = query_start_mb.get();
        b.kv_len += mb.R0;
        b.block_table += static_cast<int64_t>(mb.R0) * whole.max_blocks;
        b.num_tokens = num_tokens.get() + 1;
        set_mha(b, second_mha, mha_second);
        return {Microbatch{exec.get(), a, hidden.get(), nullptr},
                Microbatch{exec_mb.get(), b, hidden.get() + static_cast<int64_t>(mb.T0) * c.hidden_size, nullptr}};
    }

    // The whole step on the stream: embedding, layers, final norm and lm_head over the logit rows,
    // then sampling when `sample`; keep_hidden: every row's final-normed hidden state into normed_all.
    // mha[0].keys > 0: the step's (or first microbatch's) prefill chunks run the MHA form, mha[1]
    // the second microbatch's; their offsets uploaded (upload_mha_split).
    // T = 0 (expert parallelism): this rank's empty step — only the MoE layers' exchanges and its
    // experts' work for the other ranks. mb.on: the layers run as two microbatches.
    void run(int T, int R, int max_q, int rows_n, bool sample, bool keep_hidden, const MhaSteps& mha = {},
             const Split& mb = {}) {
        const int D = static_cast<int>(c.hidden_size), Vocab = static_cast<int>(c.vocab_size);
        const float eps = static_cast<float>(c.rms_norm_eps);
        if (opts.ep) {  // where the backends read T
            ops::launch_fill_i32(num_tokens.get(), 1, mb.on ? mb.T0 : T, stream);
            if (mb.on) ops::launch_fill_i32(num_tokens.get() + 1, 1, T - mb.T0, stream);
        }
        ops::launch_embed_bf16(w.embed.get(), tokens.get(), T, D, hidden.get(), stream);
        const LayerStep st = layer_step(T, R, max_q, mha[0]);
        if (mb.on) {
            std::array<Microbatch, 2> lanes = microbatches(st, mb, mha[1]);
            for (const Microbatch& lane : lanes) lane.exec->begin_step(lane.step);
            for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
                for (Microbatch& lane : lanes) lane.cache = cache_layer(l);
                run_microbatched(w.layers[static_cast<size_t>(l)], lanes);
            }
        } else {
            exec->begin_step(st);
            for (int64_t l = 0; l < c.num_hidden_layers; ++l)
                exec->run(w.layers[static_cast<size_t>(l)], st, hidden.get(), cache_layer(l));
        }
        if (keep_hidden && T > 0) {
            ops::launch_rms_norm_bf16(hidden.get(), nullptr, w.final_norm.get(), eps, normed_all.get(), T, D, stream);
            if (rows_n > 0)  // a row gather
                ops::launch_embed_bf16(normed_all.get(), logit_rows.get(), rows_n, D, rows_normed.get(), stream);
        } else if (rows_n > 0) {
            ops::launch_embed_bf16(hidden.get(), logit_rows.get(), rows_n, D, rows.get(), stream);  // a row gather
            ops::launch_rms_norm_bf16(rows.get(), nullptr, w.final_norm.get(), eps, rows_normed.get(), rows_n, D,
                                      stream);
        }
        if (rows_n == 0) return;
        ops::launch_gemm_bf16_f32(*ctx, rows_normed.get(), w.lm_head.get(), logits.get(), rows_n, Vocab, D);
        if (sample)
            ops::launch_sample(logits.get(), rows_n, Vocab, sampling.get(), logit_bias.get(), out_tokens.get(), stream);
    }

    // The MTP layer over T tokens: embed (the layer's table) → enorm, the gathered previous hidden
    // states (prev_rows of normed_all, or of mtp_hidden when chained) → hnorm, side by side →
    // eh_proj → the decoder layer on the MTP cache layer → head_norm of the logit rows (kept in
    // mtp_hidden) → head → greedy tokens (the sampling rows hold greedy entries).
    void run_mtp(int T, int R, int max_q, int rows_n, bool chained, const MhaSteps& mha) {
        const DeviceMtp& m = *w.mtp;
        const int D = static_cast<int>(c.hidden_size), Vocab = static_cast<int>(c.vocab_size);
        const float eps = static_cast<float>(c.rms_norm_eps);
        if (opts.ep) ops::launch_fill_i32(num_tokens.get(), 1, T, stream);
        if (T > 0) {
            ops::launch_embed_bf16(m.embed.get(), tokens.get(), T, D, hidden.get(), stream);
            ops::launch_rms_norm_bf16_strided(hidden.get(), D, nullptr, m.enorm.get(), eps, mtp_cat.get(), 2 * D, T, D,
                                              stream);
            ops::launch_embed_bf16(chained ? mtp_hidden.get() : normed_all.get(), prev_rows.get(), T, D, mtp_prev.get(),
                                   stream);
            ops::launch_rms_norm_bf16_strided(mtp_prev.get(), D, nullptr, m.hnorm.get(), eps, mtp_cat.get() + D, 2 * D,
                                              T, D, stream);
            exec->project(m.eh_proj, mtp_cat.get(), T, hidden.get());
        }
        const LayerStep st = layer_step(T, R, max_q, mha[0]);
        exec->begin_step(st);
        exec->run(m.layer, st, hidden.get(), cache_layer(c.num_hidden_layers));
        if (rows_n == 0) return;
        ops::launch_embed_bf16(hidden.get(), logit_rows.get(), rows_n, D, rows.get(), stream);
        ops::launch_rms_norm_bf16(rows.get(), nullptr, m.head_norm.get(), eps, mtp_hidden.get(), rows_n, D, stream);
        ops::launch_gemm_bf16_f32(*ctx, mtp_hidden.get(), m.head.get(), logits.get(), rows_n, Vocab, D);
        ops::launch_sample(logits.get(), rows_n, Vocab, sampling.get(), nullptr, out_tokens.get(), stream);
    }

    // Replays the graph of `key`, capturing `body` first when there is none; the step's inputs
    // are already in the fixed arrays.
    void replay(const decltype(graphs)::key_type& key, const std::function<void()>& body) {
        const auto it = graphs.find(key);
        if (it == graphs.end()) {
            // The step runs eagerly — cuBLASLt plans and workspaces are created outside the
            // capture — and is then captured, not replayed: every step is exactly one run, so under
            // expert parallelism each rank takes part in each MoE exchange once per step. The
            // graph joins the map only once captured: a failed run or capture leaves no entry.
            body();
            FANOUT_CUDA_CHECK(cudaStreamSynchronize(stream));
            const cudaGraphExec_t exec = capture_graph(stream, body);
            graphs[key].exec = exec;
            return;
        }
        FANOUT_CUDA_CHECK(cudaGraphLaunch(it->second.exec, stream));
    }
    // The model's step of R requests of q tokens from its graph (split at mb: two microbatches).
    void replay_step(int64_t q, int64_t R, int rows_n, bool sample, bool all_rows, bool keep_hidden,
                     const Split& mb = {}) {
        const int T = static_cast<int>(q * R);
        replay({Pass::kModel, q, R, sample, all_rows, keep_hidden, mb.on},
               [&] { run(T, static_cast<int>(R), static_cast<int>(q), rows_n, sample, keep_hidden, {}, mb); });
    }
    // Mean time of `n` replays of the captured graph of `key` (after one unmeasured), in µs.
    double time_replays(const decltype(graphs)::key_type& key, int n);

    // Checks a step against the runner's limits (token ids, cache slots, lengths, logit rows).
    void check_step(const StepBatch& batch) const;
    // The step's host arrays, padded to pad_R requests of q tokens (a graph bucket; pad_R = R
    // when eager) — padding requests write the scratch block, one logit row each or q when
    // all_rows — uploaded to the fixed arrays; returns the logit rows uploaded and, when
    // `microbatch`, where the padded step splits (its second microbatch's starts uploaded too).
    struct Uploaded {
        int rows = 0;
        Split split;
    };
    Uploaded upload_step(const StepBatch& batch, int64_t pad_R, int64_t q, bool all_rows, bool microbatch = false);

    // mha_split of an eager step — of each microbatch when split at mb — the chunks' key and query
    // offsets uploaded where the MHA form runs; records the split (last_attention_split).
    MhaSteps upload_mha_split(const StepBatch& batch, const Split& mb) {
        const int64_t R = batch.num_requests();
        const std::span<const int32_t> qs(batch.query_start), kl(batch.kv_len);
        MhaSteps out;
        last_split = {0, 0};
        for (int part = 0; part < (mb.on ? 2 : 1); ++part) {
            const int64_t r0 = part == 0 ? 0 : mb.R0, r1 = mb.on && part == 0 ? mb.R0 : R;
            const MhaStep split = mha_split(qs.subspan(static_cast<size_t>(r0), static_cast<size_t>(r1 - r0 + 1)),
                                            kl.subspan(static_cast<size_t>(r0), static_cast<size_t>(r1 - r0)), opts);
            out[static_cast<size_t>(part)] = split;
            last_split.absorbed += split.keys > 0 ? split.first_request : r1 - r0;
            if (split.keys == 0) continue;
            last_split.mha += r1 - r0 - split.first_request;
            std::vector<int32_t> keys(1, 0), queries(1, 0);
            for (int64_t r = r0 + split.first_request; r < r1; ++r) {
                keys.push_back(keys.back() + batch.kv_len[r]);
                queries.push_back(batch.query_start[r + 1] - batch.query_start[r0] - split.first_row);
            }
            const size_t at = part == 0 ? 0 : mha_second;
            FANOUT_CUDA_CHECK(cudaMemcpyAsync(kv_start.get() + at, keys.data(), keys.size() * sizeof(int32_t),
                                              cudaMemcpyHostToDevice, stream));
            FANOUT_CUDA_CHECK(cudaMemcpyAsync(mha_query_start.get() + at, queries.data(),
                                              queries.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
        }
        return out;
    }
};

CudaModel::CudaModel(const DeepseekV3& model, const CudaModelOptions& opts, const LoadProgress& progress)
    : impl_(std::make_unique<Impl>()) {
    Impl& m = *impl_;
    m.c = model.config();
    m.opts = opts;
    const io::ModelConfig& c = m.c;
    FANOUT_CHECK(opts.max_mha_context >= 0, "CudaModel: max_mha_context {} must not be negative", opts.max_mha_context);
    FANOUT_CHECK(opts.max_logit_rows >= 0, "CudaModel: max_logit_rows {} must not be negative (0: the default)",
                 opts.max_logit_rows);
    FANOUT_CHECK(opts.max_step_tokens >= 1 && opts.max_requests >= 1 && opts.max_context >= 1,
                 "CudaModel: max_step_tokens {}, max_requests {}, max_context {} must be positive",
                 opts.max_step_tokens, opts.max_requests, opts.max_context);
    // (the step's sampling rows and sampled tokens are sized by its tokens)
    FANOUT_CHECK(opts.max_logit_rows <= opts.max_step_tokens,
                 "CudaModel: max_logit_rows {} exceeds max_step_tokens {}: a step returns at most one row per token",
                 opts.max_logit_rows, opts.max_step_tokens);
    FANOUT_CHECK(model.weights().parallel.tp == 1,
                 "the GPU runner computes every attention head: tensor-parallel attention (tp {}) runs on the CPU "
                 "path so far",
                 model.weights().parallel.tp);
    const int64_t local = opts.ep ? opts.ep->config().local_experts() : c.n_routed_experts;
    FANOUT_CHECK(model.weights().layers.empty() || c.n_routed_experts == 0 ||
                     std::all_of(model.weights().layers.begin(), model.weights().layers.end(),
                                 [&](const LayerWeights& l) {
                                     return !l.is_moe || static_cast<int64_t>(l.moe.experts.size()) == local;
                                 }),
                 "the GPU runner holds {} routed experts per layer ({}); the model was loaded with another shard plan",
                 local,
                 opts.ep ? fmt::format("EP rank {} of {}", opts.ep->config().rank, opts.ep->config().world)
                         : std::string("every expert: no EP backend"));
    int device_count = 0;
    FANOUT_CHECK(cudaGetDeviceCount(&device_count) == cudaSuccess && device_count > 0,
                 "--device cuda: no CUDA device is visible");
    m.ctx = opts.stream ? std::make_unique<ops::DeviceContext>(opts.stream) : std::make_unique<ops::DeviceContext>();
    m.stream = m.ctx->stream();
    const int64_t block = kv::kDefaultBlockSize;
    m.max_blocks_per_request = ops::ceil_div(opts.max_context, block);
    m.num_blocks = opts.num_kv_blocks > 0 ? opts.num_kv_blocks : opts.max_requests * m.max_blocks_per_request;
    m.pad_block = m.num_blocks;
    FANOUT_CHECK(opts.kv_dtype == DType::kBF16 || opts.kv_dtype == DType::kFP8E4M3,
                 "CudaModel: the GPU runner's KV cache holds bf16 or fp8 entries, not {}", dtype_name(opts.kv_dtype));
    // (FP8 widths the entry cannot hold are named here, before loading.)
    m.layer_bytes = static_cast<size_t>((m.num_blocks + 1) * block * m.cache_config().entry_bytes());

    FANOUT_CHECK(opts.mtp_draft_tokens >= 0 && opts.mtp_draft_tokens < kMaxGraphQueryLen,
                 "CudaModel: {} MTP draft tokens; the GPU runner takes 0..{}", opts.mtp_draft_tokens,
                 kMaxGraphQueryLen - 1);
    FANOUT_CHECK(opts.mtp_draft_tokens == 0 || model.weights().mtp.has_value(),
                 "MTP draft tokens {}: this model has no MTP layer (num_nextn_predict_layers = 0)",
                 opts.mtp_draft_tokens);
    FANOUT_CHECK(!opts.microbatch || (opts.ep == nullptr) == (opts.microbatch_ep == nullptr),
                 "CudaModel: the two-microbatch schedule under expert parallelism needs a second EP backend "
                 "(CudaModelOptions::microbatch_ep)");
    FANOUT_CHECK(opts.microbatch_ep == nullptr || (opts.microbatch && opts.microbatch_ep != opts.ep),
                 "CudaModel: microbatch_ep must be a second backend, for the two-microbatch schedule");
    FANOUT_CHECK(opts.microbatch_ep == nullptr || (opts.microbatch_ep->config().rank == opts.ep->config().rank &&
                                                   opts.microbatch_ep->config().world == opts.ep->config().world),
                 "CudaModel: the second microbatch's EP backend is rank {} of {}, the first's rank {} of {}",
                 opts.microbatch_ep ? opts.microbatch_ep->config().rank : 0,
                 opts.microbatch_ep ? opts.microbatch_ep->config().world : 0, opts.ep ? opts.ep->config().rank : 0,
                 opts.ep ? opts.ep->config().world : 0);
    m.w = upload_model_weights(c, model.weights(), progress, &m.upload, opts.mtp_draft_tokens > 0);
    m.cache = DeviceArray<uint8_t>(static_cast<size_t>(m.num_layers_cached()) * m.layer_bytes);
    FANOUT_CUDA_CHECK(cudaMemsetAsync(m.cache.get(), 0, m.cache.size(), m.stream));

    const size_t T = static_cast<size_t>(opts.max_step_tokens), R = static_cast<size_t>(opts.max_requests);
    const size_t D = static_cast<size_t>(c.hidden_size);
    m.tokens = DeviceArray<int32_t>(T);
    m.positions = DeviceArray<int32_t>(T);
    m.slots = DeviceArray<int32_t>(T);
    m.query_start = DeviceArray<int32_t>(R + 1);
    m.mha_second = R + 1;
    m.kv_start = DeviceArray<int32_t>(2 * (R + 1));
    m.mha_query_start = DeviceArray<int32_t>(2 * (R + 1));
    m.kv_len = DeviceArray<int32_t>(R);
    m.block_table = DeviceArray<int32_t>(R * static_cast<size_t>(m.max_blocks_per_request));
    m.logit_rows = DeviceArray<int32_t>(T);
    m.out_tokens = DeviceArray<int32_t>(T);
    m.num_tokens = DeviceArray<int32_t>(2);  // one per microbatch
    m.sampling = DeviceArray<ops::SamplingRow>(T);
    m.logit_bias = DeviceArray<ops::LogitBias>(kInitialLogitBias);
    m.hidden = DeviceArray<uint16_t>(T * D);
    const size_t L = static_cast<size_t>(logit_rows_limit(opts));
    m.rows = DeviceArray<uint16_t>(L * D);
    m.rows_normed = DeviceArray<uint16_t>(L * D);
    m.logits = DeviceArray<float>(L * static_cast<size_t>(c.vocab_size));
    if (opts.mtp_draft_tokens > 0) {
        m.normed_all = DeviceArray<uint16_t>(T * D);
        m.mtp_prev = DeviceArray<uint16_t>(T * D);
        m.mtp_cat = DeviceArray<uint16_t>(T * 2 * D);
        m.mtp_hidden = DeviceArray<uint16_t>(L * D);
        m.prev_rows = DeviceArray<int32_t>(T);
    }
    m.exec = std::make_unique<CudaLayerExec>(c, model.rope(), layer_limits(c, opts), *m.ctx);
    m.exec->set_expert_parallel(opts.ep);
    if (opts.microbatch) {  // one stream: the two execs share the context's scratch, used in turn
        m.exec_mb = std::make_unique<CudaLayerExec>(c, model.rope(), microbatch_limits(c, opts), *m.ctx);
        if (microbatch_limits(c, opts).mha_buffers_lent) m.exec_mb->share_mha_buffers(*m.exec);
        m.exec_mb->set_expert_parallel(opts.microbatch_ep);
        m.query_start_mb = DeviceArray<int32_t>(R + 1);
    }
    // Everything above complete before the first step, whichever stream enqueued it: the weight
    // arena's direct writes go through the legacy stream, which the model's non-blocking stream
    // does not wait for.
    FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
}

size_t CudaModel::workspace_bytes(const io::ModelConfig& c, const CudaModelOptions& opts) {
    // Mirrors the constructor's step arrays; the layer's buffers count themselves, the device
    // context its workspaces.
    const size_t T = static_cast<size_t>(opts.max_step_tokens), R = static_cast<size_t>(opts.max_requests);
    const size_t D = static_cast<size_t>(c.hidden_size);
    const size_t blocks_per_request = static_cast<size_t>(ops::ceil_div(opts.max_context, kv::kDefaultBlockSize));
    const size_t i32 = 6 * T + 2 + 5 * (R + 1) + R + R * blocks_per_request + (opts.microbatch ? R + 1 : 0);
    const size_t L = static_cast<size_t>(logit_rows_limit(opts));
    const size_t mtp = opts.mtp_draft_tokens > 0 ? 4 * T * D * 2 + L * D * 2 + 4 * T : 0;
    return 4 * i32 + T * sizeof(ops::SamplingRow) + kInitialLogitBias * sizeof(ops::LogitBias) + T * D * 2 +
           2 * L * D * 2 + L * static_cast<size_t>(c.vocab_size) * 4 + mtp +
           CudaLayerExec::buffer_bytes(c, layer_limits(c, opts)) +
           (opts.microbatch ? CudaLayerExec::buffer_bytes(c, microbatch_limits(c, opts)) : 0) +
           ops::DeviceContext::workspace_bytes();
}

size_t CudaModel::graph_bytes(const io::ModelConfig&, const CudaModelOptions& opts) {
    if (!opts.cuda_graphs) return 0;
    // Per bucket the step's graph (twice with the two-microbatch schedule), and with MTP the first
    // pass's and (more than one draft) the chained pass's.
    const size_t per_bucket = (opts.microbatch ? 2 : 1) + (opts.mtp_draft_tokens == 0   ? 0
                                                           : opts.mtp_draft_tokens == 1 ? 1
                                                                                        : 2);
    const size_t buckets = decode_buckets(opts).size() * per_bucket;
    // NOTE: an estimate per graph (its kernel nodes), with room for the MLA workspace and cuBLASLt
    // plans the first run allocates. capture_decode_graphs() measured 38 MB for the first bucket
    // and under the 2 MB page of cudaMemGetInfo for each other at V3's widths (docs/PERF.md).
    constexpr size_t kPerGraph = size_t{4} << 20, kFirstRun = size_t{64} << 20;
    return static_cast<size_t>(buckets) * kPerGraph + (buckets > 0 ? kFirstRun : 0);
}

CudaModel::~CudaModel() = default;

const io::ModelConfig& CudaModel::config() const { return impl_->c; }
const CudaModelOptions& CudaModel::options() const { return impl_->opts; }
int64_t CudaModel::graphs_captured() const { return static_cast<int64_t>(impl_->graphs.size()); }

CudaModel::AttentionSplit CudaModel::last_attention_split() const { return impl_->last_split; }

kv::PagedKvCache CudaModel::make_block_allocator() const { return kv::PagedKvCache(impl_->cache_config()); }

void CudaModel::Impl::check_step(const StepBatch& batch) const {
    const int64_t T = batch.num_tokens(), R = batch.num_requests(),
                  rows_n = static_cast<int64_t>(batch.logit_rows.size());
    FANOUT_CHECK(T >= 1 && T <= opts.max_step_tokens, "GPU step: {} tokens; this runner takes 1..{} per step", T,
                 opts.max_step_tokens);
    FANOUT_CHECK(R >= 1 && R <= opts.max_requests, "GPU step: {} requests; this runner takes 1..{}", R,
                 opts.max_requests);
    FANOUT_CHECK(batch.max_blocks <= max_blocks_per_request,
                 "GPU step: a request spans {} cache blocks; max_context {} allows {}", batch.max_blocks,
                 opts.max_context, max_blocks_per_request);
    FANOUT_CHECK(rows_n <= logit_rows_limit(opts),
                 "GPU step: {} logit rows; this runner returns at most {} per step (CudaModelOptions::max_logit_rows)",
                 rows_n, logit_rows_limit(opts));
    FANOUT_CHECK(static_cast<int64_t>(batch.positions.size()) == T && static_cast<int64_t>(batch.slots.size()) == T &&
                     batch.max_blocks >= 0 && static_cast<int64_t>(batch.block_table.size()) == R * batch.max_blocks,
                 "GPU step: {} tokens with {} positions and {} slots, {} requests with a block table of {} entries "
                 "({} per request): they must agree",
                 T, batch.positions.size(), batch.slots.size(), R, batch.block_table.size(), batch.max_blocks);
    for (int64_t i = 0; i < static_cast<int64_t>(batch.block_table.size()); ++i)
        FANOUT_CHECK(batch.block_table[i] < num_blocks,
                     "request {} names cache block {} outside the device cache's {} blocks (negative: none)",
                     i / std::max<int64_t>(batch.max_blocks, 1), batch.block_table[i], num_blocks);
    for (int64_t t = 0; t < T; ++t) {
        FANOUT_CHECK(batch.positions[t] >= 0 && batch.positions[t] < opts.max_context,
                     "token {} has position {} outside [0, {}) (max_context)", t, batch.positions[t], opts.max_context);
        FANOUT_CHECK(batch.tokens[t] >= 0 && batch.tokens[t] < c.vocab_size,
                     "token id {} at index {} is outside the vocabulary [0, {})", batch.tokens[t], t, c.vocab_size);
        FANOUT_CHECK(batch.slots[t] >= 0 && batch.slots[t] < num_blocks * kv::kDefaultBlockSize,
                     "token {} has cache slot {} outside the device cache's {} blocks", t, batch.slots[t], num_blocks);
    }
    for (int32_t r : batch.logit_rows) FANOUT_CHECK(r >= 0 && r < T, "logit row {} outside the step's {} tokens", r, T);
    FANOUT_CHECK(static_cast<int64_t>(batch.query_start.size()) == R + 1 && batch.query_start[0] == 0 &&
                     batch.query_start[R] == T,
                 "GPU step: query_start has {} entries from {} to {}; {} requests of {} tokens need {} from 0 to {}",
                 batch.query_start.size(), batch.query_start.empty() ? 0 : batch.query_start.front(),
                 batch.query_start.empty() ? 0 : batch.query_start.back(), R, T, R + 1, T);
    for (int64_t r = 0; r < R; ++r) {
        const int64_t q = batch.query_start[r + 1] - batch.query_start[r];
        FANOUT_CHECK(batch.kv_len[r] >= 1 && batch.kv_len[r] <= opts.max_context,
                     "request {} has {} cached tokens; max_context is {}", r, batch.kv_len[r], opts.max_context);
        FANOUT_CHECK(q >= 0 && batch.kv_len[r] >= q,
                     "GPU step: request {} has {} query tokens but {} cached tokens (which include them)", r, q,
                     batch.kv_len[r]);
    }
}

CudaModel::Impl::Uploaded CudaModel::Impl::upload_step(const StepBatch& batch, int64_t pad_R, int64_t q, bool all_rows,
                                                       bool microbatch) {
    const int64_t R = batch.num_requests(), W = max_blocks_per_request;
    std::vector<int32_t> toks = batch.tokens, pos = batch.positions, slot = batch.slots, starts = batch.query_start,
                         lens = batch.kv_len, rows_out = batch.logit_rows;
    std::vector<int32_t> table(static_cast<size_t>(pad_R * W), static_cast<int32_t>(pad_block));
    for (int64_t r = 0; r < R; ++r)
        for (int64_t b = 0; b < batch.max_blocks; ++b) {
            const int32_t id = batch.block_table[r * batch.max_blocks + b];
            if (id >= 0) table[static_cast<size_t>(r * W + b)] = id;
        }
    for (int64_t r = R; r < pad_R; ++r) {  // padding requests: q tokens at positions 0.., in the scratch block
        for (int64_t i = 0; i < q; ++i) {
            toks.push_back(0);
            pos.push_back(static_cast<int32_t>(i));
            slot.push_back(static_cast<int32_t>(pad_block * kv::kDefaultBlockSize + i));
            if (all_rows) rows_out.push_back(static_cast<int32_t>(r * q + i));
        }
        starts.push_back(static_cast<int32_t>((r + 1) * q));
        lens.push_back(static_cast<int32_t>(q));
        if (!all_rows) rows_out.push_back(static_cast<int32_t>((r + 1) * q - 1));
    }
    tokens.upload(toks.data(), toks.size(), stream);
    positions.upload(pos.data(), pos.size(), stream);
    slots.upload(slot.data(), slot.size(), stream);
    query_start.upload(starts.data(), starts.size(), stream);
    kv_len.upload(lens.data(), lens.size(), stream);
    block_table.upload(table.data(), table.size(), stream);
    logit_rows.upload(rows_out.data(), rows_out.size(), stream);
    Uploaded up{static_cast<int>(rows_out.size()), {}};
    if (microbatch) {
        const int64_t r = microbatch_split(starts);
        up.split = {true, static_cast<int>(r), starts[static_cast<size_t>(r)]};
        std::vector<int32_t> second(starts.begin() + r, starts.end());
        for (int32_t& v : second) v -= up.split.T0;
        query_start_mb.upload(second.data(), second.size(), stream);
    }
    return up;
}

std::vector<int32_t> CudaModel::forward_sample(const StepBatch& batch, std::span<const ops::SamplingRow> sampling,
                                               std::span<const ops::LogitBias> logit_bias) {
    Impl& m = *impl_;
    const io::ModelConfig& c = m.c;
    const int64_t T = batch.num_tokens(), R = batch.num_requests(),
                  rows_n = static_cast<int64_t>(batch.logit_rows.size());
    FANOUT_CHECK(!batch.microbatch || m.exec_mb,
                 "GPU step: two microbatches, but the runner was made without the two-microbatch schedule "
                 "(CudaModelOptions::microbatch)");
    const bool keep_hidden = batch.all_hidden;
    FANOUT_CHECK(!keep_hidden || m.w.mtp, "GPU step: all_hidden without MTP (CudaModelOptions::mtp_draft_tokens)");
    if (T == 0 && m.opts.ep) {  // this rank's empty step of the EP group
        FANOUT_CHECK(R == 0 && sampling.empty(), "GPU step: an empty step has no requests and samples nothing");
        m.last_split = {};
        m.run(0, 0, 0, 0, false, false, {}, Impl::Split{batch.microbatch, 0, 0});
        FANOUT_CUDA_CHECK(cudaStreamSynchronize(m.stream));
        m.opts.ep->raise_if_failed();
        if (batch.microbatch) m.opts.microbatch_ep->raise_if_failed();
        m.kept_rows = 0;
        return {};
    }
    m.check_step(batch);
    FANOUT_CHECK(sampling.empty() || static_cast<int64_t>(sampling.size()) == rows_n,
                 "GPU step: {} sampling rows for {} logit rows", sampling.size(), rows_n);
    for (size_t r = 0; r < sampling.size(); ++r) {
        const ops::SamplingRow& row = sampling[r];
        FANOUT_CHECK(row.bias_begin >= 0 && row.bias_count >= 0 &&
                         static_cast<size_t>(row.bias_begin) + static_cast<size_t>(row.bias_count) <= logit_bias.size(),
                     "GPU step: sampling row {} has logit-bias entries [{}, +{}) of {}", r, row.bias_begin,
                     row.bias_count, logit_bias.size());
        FANOUT_CHECK(row.draft < c.vocab_size, "GPU step: sampling row {} checks draft token {} outside [0, {})", r,
                     row.draft, c.vocab_size);
        for (int32_t j = row.bias_begin; j < row.bias_begin + row.bias_count; ++j) {
            FANOUT_CHECK(logit_bias[j].id >= 0 && logit_bias[j].id < c.vocab_size,
                         "GPU step: logit_bias token id {} (row {}) is outside the vocabulary [0, {})",
                         logit_bias[j].id, r, c.vocab_size);
            // The sampler's threads add a row's biases in place, one per id (ops/sampling.h's rule).
            if (j > row.bias_begin) {
                const int32_t prev = logit_bias[j - 1].id;
                FANOUT_CHECK(logit_bias[j].id > prev,
                             "GPU step: logit_bias token ids of row {} must be ascending and unique (token id {} "
                             "after {})",
                             r, logit_bias[j].id, prev);
            }
        }
    }

    // Graphs serve steps whose requests all have the same query length and return the last row's
    // logits of each (decode) or every row's (MTP verification).
    const int64_t q = batch.query_start[1] - batch.query_start[0];
    bool same_q = true, last_rows = rows_n == R, all_rows = rows_n == T;
    for (int64_t r = 0; r < R; ++r) {
        same_q = same_q && batch.query_start[r + 1] - batch.query_start[r] == q;
        last_rows = last_rows && batch.logit_rows[r] == batch.query_start[r + 1] - 1;
    }
    for (int64_t i = 0; i < rows_n && all_rows; ++i) all_rows = batch.logit_rows[i] == i;
    if (q == 1) all_rows = false;  // the same rows as last_rows: one graph
    const int64_t R_pad = next_pow2(R);
    const bool graph = m.opts.cuda_graphs && same_q && (last_rows || all_rows) && !sampling.empty() &&
                       q <= kMaxGraphQueryLen && R_pad * q <= m.opts.max_step_tokens && R_pad <= m.opts.max_requests &&
                       (all_rows ? R_pad * q : R_pad) <= logit_rows_limit(m.opts);  // the padded rows fit
    const Impl::Uploaded up = m.upload_step(batch, graph ? R_pad : R, q, all_rows, batch.microbatch);
    const int rows_step = up.rows;
    if (!sampling.empty()) {
        std::vector<ops::SamplingRow> srows(sampling.begin(), sampling.end());
        srows.resize(static_cast<size_t>(rows_step));  // padding rows: greedy
        m.sampling.upload(srows.data(), srows.size(), m.stream);
    }
    if (logit_bias.size() > m.logit_bias.size()) {
        // The graphs read the old array's address: drop them with it (the previous step synced the stream).
        m.drop_graphs();
        m.logit_bias = DeviceArray<ops::LogitBias>(std::max(logit_bias.size(), 2 * m.logit_bias.size()));
    }
    if (!logit_bias.empty()) m.logit_bias.upload(logit_bias.data(), logit_bias.size(), m.stream);
    const bool sample = !sampling.empty();

    if (graph) {
        m.last_split = {R, 0};
        m.replay_step(q, R_pad, rows_step, sample, all_rows, keep_hidden, up.split);
    } else {
        // Prefill chunks run attention in the MHA form, the decodes before them in the absorbed
        // form (mha_split).
        m.run(static_cast<int>(T), static_cast<int>(R), static_cast<int>(batch.max_query_len()), rows_step, sample,
              keep_hidden, m.upload_mha_split(batch, up.split), up.split);
    }
    m.kept_rows = keep_hidden ? T : 0;
    std::vector<int32_t> out;
    if (sample) {
        out.resize(static_cast<size_t>(rows_step));
        FANOUT_CUDA_CHECK(cudaMemcpyAsync(out.data(), m.out_tokens.get(), out.size() * sizeof(int32_t),
                                          cudaMemcpyDeviceToHost, m.stream));
    }
    FANOUT_CUDA_CHECK(cudaStreamSynchronize(m.stream));
    if (m.opts.ep) m.opts.ep->raise_if_failed();
    if (m.opts.microbatch_ep && batch.microbatch) m.opts.microbatch_ep->raise_if_failed();
    out.resize(static_cast<size_t>(std::min<int64_t>(rows_n, static_cast<int64_t>(out.size()))));
    return out;
}

std::vector<int32_t> CudaModel::draft_mtp(const StepBatch& batch, std::span<const int32_t> hidden_rows, bool chained) {
    Impl& m = *impl_;
    FANOUT_CHECK(m.w.mtp.has_value(), "draft_mtp: the GPU runner was made without MTP (mtp_draft_tokens 0)");
    const int64_t T = batch.num_tokens(), R = batch.num_requests(),
                  rows_n = static_cast<int64_t>(batch.logit_rows.size());
    FANOUT_CHECK(static_cast<int64_t>(hidden_rows.size()) == T, "draft_mtp: {} hidden rows for {} tokens",
                 hidden_rows.size(), T);
    if (T == 0 && m.opts.ep) {  // this rank's pass of the group
        FANOUT_CHECK(R == 0, "draft_mtp: an empty pass has no requests");
        m.last_split = {};
        m.run_mtp(0, 0, 0, 0, chained, {});
        FANOUT_CUDA_CHECK(cudaStreamSynchronize(m.stream));
        m.opts.ep->raise_if_failed();
        m.kept_mtp_rows = 0;
        return {};
    }
    m.check_step(batch);
    const int64_t kept = chained ? m.kept_mtp_rows : m.kept_rows;
    for (int32_t r : hidden_rows)
        FANOUT_CHECK(r >= 0 && r < kept, "draft_mtp: hidden row {} outside the {} kept by the last {}", r, kept,
                     chained ? "MTP pass" : "all_hidden step");
    // Graphs serve passes whose requests all have the same query length and one logit row each (at
    // any of its rows): the engine pads a pass over checked chunks to the chunk's length.
    const int64_t q = batch.query_start[1] - batch.query_start[0];
    bool uniform = rows_n == R;
    for (int64_t r = 0; r < R && uniform; ++r)
        uniform = batch.query_start[r + 1] - batch.query_start[r] == q && batch.logit_rows[r] >= batch.query_start[r] &&
                  batch.logit_rows[r] < batch.query_start[r + 1];
    const int64_t R_pad = next_pow2(R);
    const bool graph = m.opts.cuda_graphs && uniform && q <= kMaxGraphQueryLen && R_pad * q <= m.opts.max_step_tokens &&
                       R_pad <= m.opts.max_requests && R_pad <= logit_rows_limit(m.opts);
    const int rows_step = m.upload_step(batch, graph ? R_pad : R, q, false).rows;
    std::vector<int32_t> prev(hidden_rows.begin(), hidden_rows.end());
    prev.resize(static_cast<size_t>(graph ? R_pad * q : T), 0);  // padding requests read row 0
    m.prev_rows.upload(prev.data(), prev.size(), m.stream);
    const std::vector<ops::SamplingRow> greedy(static_cast<size_t>(rows_step));
    if (rows_step > 0) m.sampling.upload(greedy.data(), greedy.size(), m.stream);
    if (graph) {
        m.last_split = {R, 0};
        const int Tg = static_cast<int>(R_pad * q);
        m.replay({chained ? Impl::Pass::kMtpChained : Impl::Pass::kMtp, q, R_pad, true, false, false, false},
                 [&] { m.run_mtp(Tg, static_cast<int>(R_pad), static_cast<int>(q), rows_step, chained, {}); });
    } else {
        m.run_mtp(static_cast<int>(T), static_cast<int>(R), static_cast<int>(batch.max_query_len()), rows_step, chained,
                  m.upload_mha_split(batch, {}));
    }
    std::vector<int32_t> out(static_cast<size_t>(rows_n));
    if (rows_n > 0)
        FANOUT_CUDA_CHECK(cudaMemcpyAsync(out.data(), m.out_tokens.get(), out.size() * sizeof(int32_t),
                                          cudaMemcpyDeviceToHost, m.stream));
    FANOUT_CUDA_CHECK(cudaStreamSynchronize(m.stream));
    if (m.opts.ep) m.opts.ep->raise_if_failed();
    m.kept_mtp_rows = rows_n;
    return out;
}

double CudaModel::Impl::time_replays(const decltype(graphs)::key_type& key, int n) {
    const cudaGraphExec_t g = graphs.at(key).exec;
    struct Events {  // destroyed on every path out
        cudaEvent_t e[2] = {nullptr, nullptr};
        ~Events() {
            for (cudaEvent_t x : e)
                if (x) cudaEventDestroy(x);
        }
    } ev;
    FANOUT_CUDA_CHECK(cudaEventCreate(&ev.e[0]));
    FANOUT_CUDA_CHECK(cudaEventCreate(&ev.e[1]));
    FANOUT_CUDA_CHECK(cudaGraphLaunch(g, stream));
    FANOUT_CUDA_CHECK(cudaEventRecord(ev.e[0], stream));
    for (int i = 0; i < n; ++i) FANOUT_CUDA_CHECK(cudaGraphLaunch(g, stream));
    FANOUT_CUDA_CHECK(cudaEventRecord(ev.e[1], stream));
    FANOUT_CUDA_CHECK(cudaEventSynchronize(ev.e[1]));
    float ms = 0;
    FANOUT_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.e[0], ev.e[1]));
    return 1000.0 * ms / n;
}

std::vector<CudaModel::GraphCapture> CudaModel::capture_decode_graphs() {
    Impl& m = *impl_;
    std::vector<GraphCapture> out;
    if (!m.opts.cuda_graphs) return out;
    // The decode shape: one token per request, or with MTP the verification's 1 + drafts, every
    // row's logits and hidden states kept.
    const int64_t q = decode_query_len(m.opts);
    const bool mtp = q > 1;
    const bool two = m.exec_mb != nullptr;
    constexpr int kTimedReplays = 5;
    for (const int64_t R : decode_buckets(m.opts)) {
        // R padding requests of q tokens at positions 0.. in the scratch block, greedy.
        StepBatch none;
        none.query_start = {0};
        const Impl::Uploaded up = m.upload_step(none, R, q, mtp, two);
        const std::vector<ops::SamplingRow> srows(static_cast<size_t>(up.rows));
        m.sampling.upload(srows.data(), srows.size(), m.stream);
        FANOUT_CUDA_CHECK(cudaStreamSynchronize(m.stream));
        size_t free_before = 0, free_after = 0, total = 0;
        FANOUT_CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
        const auto t0 = std::chrono::steady_clock::now();
        m.replay_step(q, R, up.rows, true, mtp, mtp);
        if (two) m.replay_step(q, R, up.rows, true, mtp, mtp, up.split);
        GraphCapture g{.requests = R, .tokens = R * q};
        if (two) {  // both schedules of this bucket, timed (under EP every rank replays them together)
            g.step_us = m.time_replays({Impl::Pass::kModel, q, R, true, mtp, mtp, false}, kTimedReplays);
            g.microbatch_step_us = m.time_replays({Impl::Pass::kModel, q, R, true, mtp, mtp, true}, kTimedReplays);
        }
        if (mtp) {
            // The MTP passes of a decode step: over the checked chunks (padded to q rows), then
            // chained over one draft each.
            const std::vector<int32_t> zeros(static_cast<size_t>(R * q), 0);
            m.prev_rows.upload(zeros.data(), zeros.size(), m.stream);
            const int first_rows = m.upload_step(none, R, q, false).rows;
            m.replay({Impl::Pass::kMtp, q, R, true, false, false, false}, [&] {
                m.run_mtp(static_cast<int>(R * q), static_cast<int>(R), static_cast<int>(q), first_rows, false, {});
            });
            if (m.opts.mtp_draft_tokens > 1) {
                const int chained_rows = m.upload_step(none, R, 1, false).rows;
                m.replay({Impl::Pass::kMtpChained, 1, R, true, false, false, false},
                         [&] { m.run_mtp(static_cast<int>(R), static_cast<int>(R), 1, chained_rows, true, {}); });
            }
        }
        FANOUT_CUDA_CHECK(cudaStreamSynchronize(m.stream));
        if (m.opts.ep) m.opts.ep->raise_if_failed();
        if (m.opts.microbatch_ep) m.opts.microbatch_ep->raise_if_failed();
        FANOUT_CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
        g.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        g.bytes = static_cast<double>(free_before) - static_cast<double>(free_after);
        out.push_back(g);
    }
    return out;
}

const StreamStats& CudaModel::upload_stats() const { return impl_->upload; }

Tensor CudaModel::forward_logits(const StepBatch& batch) {
    forward_sample(batch, {});
    Impl& m = *impl_;
    const int64_t rows_n = static_cast<int64_t>(batch.logit_rows.size());
    Tensor out = Tensor::zeros({rows_n, m.c.vocab_size}, DType::kF32);
    FANOUT_CUDA_CHECK(cudaMemcpy(out.data(), m.logits.get(), out.nbytes(), cudaMemcpyDeviceToHost));
    return out;
}

GenerateResult generate_cuda(CudaModel& model, kv::PagedKvCache& blocks, const GenerateRequest& req,
                             const std::function<void(int32_t)>& on_token) {
    GenerateRequest r = req;
    r.prefill_chunk = std::min(r.prefill_chunk, model.options().max_step_tokens);
    const int64_t total = static_cast<int64_t>(req.prompt.size()) + req.max_tokens;
    FANOUT_CHECK(total <= model.options().max_context,
                 "prompt ({} tokens) + max_tokens ({}) exceeds the GPU runner's max_context {}", req.prompt.size(),
                 req.max_tokens, model.options().max_context);
    std::vector<ops::LogitBias> bias;
    for (const auto& [id, b] : req.sampling.logit_bias) bias.push_back({id, b});
    const SampleStep step = [&](const StepBatch& batch, ops::Sampler& sampler) -> int32_t {
        if (batch.logit_rows.empty()) {
            model.forward_sample(batch, {});
            return -1;
        }
        const ops::SamplingParams& p = sampler.params();
        ops::SamplingRow row{p.temperature, p.top_k, p.top_p, sampler.next_uniform()};
        row.bias_count = static_cast<int32_t>(bias.size());  // all of `bias`, from 0
        return model.forward_sample(batch, std::span(&row, 1), bias).at(0);
    };
    return generate_loop(model.config(), blocks, r, step, on_token);
}

}  // namespace fanout::model

// DeepSeek-V3 forward pass, built from ops/ only.
//
// A step takes a StepBatch — a list of requests, each with its own query tokens (1 for decode, 2+
// for MTP verification, many for a prefill chunk), start position and block table — appends the
// step's latent KV entries to the paged cache and returns the logits of the rows asked for. The
// same forward serves prefill, decode and mixed batches.
//
// Each decoder layer runs as the seed's stages (DESIGN §4), as separate methods over a LayerState
// so that a scheduler can interleave two microbatches stage by stage:
//   1 attn_in:  input norm, q / kv_a projections, RoPE, KV append
//   2 attn_out: attention (MHA form or absorbed form), o_proj, residual, post norm, router (under
//               tensor parallelism: this rank's heads, o_proj's sum over the TP group, then the
//               rank's slice of the tokens on through stage 6, all-gathered at its end)
//   3 dispatch send (EP): this rank's tokens to the ranks holding their top-k experts
//   4 shared:   the shared expert (runs between dispatch send and recv)
//   5 experts:  routed experts over per-expert contiguous rows (the grouped-GEMM layout) — under
//               EP dispatch receive, this rank's experts on the masked receive layout, combine send
//   6 combine:  weighted sum of expert outputs back into the residual stream (EP: combine receive)
#pragma once

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "fanout/comm/ep.h"
#include "fanout/comm/tensor_parallel.h"
#include "fanout/core/thread_pool.h"
#include "fanout/io/model_config.h"
#include "fanout/kv/paged_kv_cache.h"
#include "fanout/model/weights.h"
#include "fanout/ops/mla_attention.h"
#include "fanout/ops/rope.h"

namespace fanout::model {

// kAuto: the absorbed form when no request in the step has more than absorbed_max_query query
// tokens (decode: 1), else the MHA form (runs_absorbed).
enum class AttentionForm { kAuto, kMha, kAbsorbed };

struct ForwardOptions {
    ops::Fp8Mode fp8_mode = ops::Fp8Mode::kDequant;
    // This rank's EP group (DeepseekV3::ep_config: the f32 payload): the routed experts run where
    // they are held — tokens dispatched to the ranks holding their top-k experts and combined back.
    // Every rank of the group runs every layer in step, a rank without tokens with an empty batch.
    // nullptr: every expert is local (the model was loaded with ep 1).
    comm::ExpertParallel* ep = nullptr;
    AttentionForm attention = AttentionForm::kAuto;
    // The server sets model::absorbed_form_max_query (step_cost.h), so small prefill chunks deep in
    // a long context do not re-expand it each step; 1 keeps prefill in the MHA form.
    int64_t absorbed_max_query = 1;
    // The second microbatch's EP group (StepBatch::microbatch under expert parallelism): a second
    // endpoint of the same ranks, so both microbatches' exchanges can be in flight at once.
    comm::ExpertParallel* microbatch_ep = nullptr;
    // This rank's TP group (a model loaded with tp > 1): the tp ranks of a DP group run the same
    // step, each its share of the heads; o_proj's partial sums are all-reduced, the MoE half runs
    // on the rank's slice of the tokens (comm::tp_slice_begin) and the slices are all-gathered.
    comm::TensorParallel* tp = nullptr;
};

struct StepBatch;
// Whether the CPU model runs `batch`'s attention in the absorbed form under `opts` (else the MHA form).
bool runs_absorbed(const StepBatch& batch, const ForwardOptions& opts);

// RoPE's frequencies for a config (YaRN included).
ops::RopeTable rope_table(const io::ModelConfig& c);

// One step's requests, flattened. Build it with StepBatchBuilder.
struct StepBatch {
    std::vector<int32_t> tokens;       // [T]
    std::vector<int32_t> positions;    // [T]
    std::vector<int32_t> slots;        // [T] cache slot of each token
    std::vector<int32_t> query_start;  // [R + 1]
    std::vector<int32_t> kv_len;       // [R] cached tokens after this step
    std::vector<int32_t> block_table;  // [R, max_blocks], padded with -1
    int64_t max_blocks = 0;
    std::vector<int32_t> logit_rows;  // rows of [T] whose logits are returned, in order
    bool all_hidden = false;          // Output::hidden for every token, not only the logit rows (MTP drafting)
    // Run as two microbatches (split_microbatches) whose layers interleave stage by stage, so one's
    // dispatch and combine are in flight while the other computes (the seed's two-microbatch
    // schedule). Under expert parallelism every rank of the group runs a step the same way: the
    // engines agree per step (EngineConfig::microbatch).
    bool microbatch = false;

    int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
    int64_t num_requests() const { return static_cast<int64_t>(kv_len.size()); }
    int64_t max_query_len() const;
    ops::AttentionMetadata attention_metadata() const;
};

// A step's requests as two microbatches: requests [0, r) and [r, R), r = microbatch_split (the
// second is empty for one request — it still takes part in the exchanges). Logit rows and
// positions keep their order: the first's tokens, then the second's, are the step's.
std::pair<StepBatch, StepBatch> split_microbatches(const StepBatch& batch);
// Where a step of these request boundaries (StepBatch::query_start) splits: the r that balances
// the two microbatches' tokens, with at least one request in the first (0 for no requests).
int64_t microbatch_split(std::span<const int32_t> query_start);

class StepBatchBuilder {
  public:
    explicit StepBatchBuilder(const kv::PagedKvCache& cache) : cache_(cache) {}
    // Query tokens of one request at positions start, start+1, ...; `seq` must already have room
    // for start + tokens.size() tokens. logits: kLast = last token's, kAll = every token's.
    enum class Logits { kNone, kLast, kAll };
    StepBatchBuilder& add(std::span<const int32_t> tokens, int64_t start, const kv::SequenceBlocks& seq,
                          Logits logits = Logits::kLast);
    StepBatch build();

  private:
    const kv::PagedKvCache& cache_;
    StepBatch batch_;
    std::vector<std::vector<int32_t>> tables_;
};

// Intermediate tensors of one layer for one (micro)batch.
struct LayerState {
    Tensor hidden;                // [T, D] residual stream, updated in place
    int32_t num_tokens = 0;       // T, where the EP backend reads it
    Tensor q;                     // [T, H, nope + rope]
    Tensor normed;                // [T, D] post-attention norm (MLP / expert input)
    Tensor topk_idx;              // [T, top_k] i32
    Tensor topk_weight;           // [T, top_k] f32
    Tensor shared_out;            // [T, D]
    Tensor expert_rows;           // [T * top_k, D] expert outputs, grouped by expert (EP: [local, max_m, D])
    std::vector<int32_t> row_of;  // [T * top_k] assignment (t, k) -> row in expert_rows
    int64_t tp_tokens = 0;        // the step's tokens (under TP, hidden holds the rank's slice of them)
};

class DeepseekV3 {
  public:
    DeepseekV3(io::ModelConfig config, ModelWeights weights);
    static std::unique_ptr<DeepseekV3> load(const std::string& dir, const ParallelConfig& plan = {},
                                            const LoadOptions& opts = {});

    const io::ModelConfig& config() const { return config_; }
    const ModelWeights& weights() const { return weights_; }
    const ops::RopeTable& rope() const { return rope_; }
    // Attention heads this rank computes: all of them, or its share under tensor parallelism.
    int64_t heads() const { return config_.num_attention_heads / weights_.parallel.tp; }
    // Cache layers: the decoder layers, then the MTP layer if any; entries of `dtype` (f32, bf16, or
    // kFP8E4M3: the FP8 entry of ops/fp8_constants.h).
    kv::KvCacheConfig kv_cache_config(int64_t num_blocks, DType dtype = DType::kF32) const;

    struct Output {
        Tensor logits;  // [logit_rows, vocab] f32
        Tensor
            hidden;  // [logit_rows, D] f32 ([T, D] with batch.all_hidden), after the final norm (the MTP head's input)
    };
    Output forward(const StepBatch& batch, kv::PagedKvCache& cache, const ForwardOptions& opts, const Stream& s) const;
    // The MTP head: batch.tokens are the next tokens t+1, prev_hidden [T, D] the main model's
    // final-normed hidden states at t; returns logits for t+2 (at batch.logit_rows).
    Output forward_mtp(const StepBatch& batch, const Tensor& prev_hidden, kv::PagedKvCache& cache,
                       const ForwardOptions& opts, const Stream& s) const;

    // The stages of one layer (see the file comment); `layer` indexes cache layers.
    void stage_attn_in(const LayerWeights& w, int64_t layer, LayerState& st, const StepBatch& batch,
                       kv::PagedKvCache& cache, const Stream& s, const ForwardOptions& opts) const;
    void stage_attn_out(const LayerWeights& w, int64_t layer, LayerState& st, const StepBatch& batch,
                        kv::PagedKvCache& cache, const Stream& s, const ForwardOptions& opts) const;
    // Under EP (opts.ep): sends this rank's tokens to the ranks holding their experts.
    void stage_dispatch_send(const LayerWeights& w, LayerState& st, const ForwardOptions& opts) const;
    void stage_shared(const LayerWeights& w, LayerState& st, const Stream& s, const ForwardOptions& opts) const;
    // The routed experts: this rank's on what dispatch delivered (then combine send), or all of them.
    void stage_experts(const LayerWeights& w, LayerState& st, const Stream& s, const ForwardOptions& opts) const;
    // hidden += shared (or dense MLP) output + the weighted expert outputs (under EP: combine receive).
    void stage_combine(const LayerWeights& w, LayerState& st, const Stream& s, const ForwardOptions& opts) const;

    // This rank's EP group for `parallel` (its rank and size), carrying f32 tokens of steps of up
    // to max_tokens_per_rank tokens, for LocalFabric / make_mpi_ep.
    comm::EpConfig ep_config(const ParallelConfig& parallel, int64_t max_tokens_per_rank) const;

  private:
    Tensor embed(const Tensor& table, std::span<const int32_t> tokens) const;
    void run_layer(const LayerWeights& w, int64_t layer, LayerState& st, const StepBatch& batch,
                   kv::PagedKvCache& cache, const ForwardOptions& opts, const Stream& s) const;
    // The decoder layers over two microbatches, stage by stage: both attentions and dispatch sends,
    // then both expert halves, then both combines; returns the residual stream of the whole step.
    Tensor run_microbatched(const StepBatch& batch, kv::PagedKvCache& cache, const ForwardOptions& opts,
                            const Stream& s) const;
    Output head(const Tensor& hidden, const Tensor& norm, const ops::LinearWeight& lm_head, const StepBatch& batch,
                const ForwardOptions& opts, const Stream& s) const;
    void mlp(const MlpWeights& w, const Tensor& x, Tensor& out, const ForwardOptions& opts, const Stream& s) const;
    // stage_combine's sum into the residual (the rank's slice under TP).
    void combine_into_residual(const LayerWeights& w, LayerState& st, const Stream& s,
                               const ForwardOptions& opts) const;

    io::ModelConfig config_;
    ModelWeights weights_;
    ops::RopeTable rope_;
};

}  // namespace fanout::model

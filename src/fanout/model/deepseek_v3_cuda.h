// The GPU model runner: DeepSeek-V3's forward pass on one GPU — holding every expert, or one EP
// rank's block of them (CudaModelOptions::ep) — over a paged latent KV cache in device memory,
// with sampling on the device and CUDA graphs for decode steps.
//
// Weights come from a loaded DeepseekV3 (its checks and shard plan) and are rearranged once for
// the GPU: q_a and kv_a as one GEMM, each MLP's gate and up as one, kv_b split into the per-head
// k_b (transposed for the absorbed form) and v_b batched GEMMs, experts stacked for the grouped
// GEMM. FP8 checkpoints run every projection as DeepSeek's FP8 W8A8 (block-quantized weights,
// activations quantized per 1×128 on the fly); bf16/f32 checkpoints run in bf16 with f32
// accumulation. Activations between kernels are bf16; the router's logits and the final logits f32.
//
// Attention: prefill chunks run MLA in the MHA form (each context's latent expanded by kv_b into
// per-head K and V, causal flash attention — fewer FLOPs per score for long prompts), all of a
// step's in one launch; decodes and MTP verification run the absorbed form over the paged cache,
// which is read, never expanded. A step with both (continuous batching) runs both: its decodes
// come first (the scheduler's order) and their rows take the absorbed form, the chunks after
// them the MHA form (see mha_split in the .cc for when a step stays all absorbed).
//
// CUDA graphs: a step whose requests all have the same query length q ≤ 4 (decode: 1; MTP
// verification: 1 + drafts) and return the last row's logits or every row's is padded to the next
// bucket of requests (1, 2, 4, 8, …, max_requests) with dummy requests that write a scratch cache
// block, and replays that bucket's graph (one per schedule: as one batch, or as two microbatches
// of half the bucket each), captured on first use. Everything
// the graph reads (tokens, positions, slots, block tables, kv lengths, sampling rows) sits at
// fixed device addresses refreshed before each replay; MoE expert counts are computed on the
// device, so one graph serves any routing. Other steps (prefill) run eagerly. (The logit-bias
// array grows when a step brings more entries than it holds; the graphs, which captured its old
// address, are then dropped and captured again.)
//
// MTP speculative decoding (CudaModelOptions::mtp_draft_tokens): the MTP layer is uploaded and has
// its own cache layer; a step with batch.all_hidden keeps every row's final-normed hidden state on
// the device, its sampling rows check the drafts there (SamplingRow::draft), and draft_mtp() runs
// the MTP layer over those hidden states — nothing but token ids crosses to the host. Start-up
// captures the verification shape (1 + drafts rows per request) instead of the plain decode one.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "fanout/model/deepseek_v3.h"
#include "fanout/model/generate.h"
#include "fanout/model/weight_upload.h"
#include "fanout/ops/sampling_cuda.h"

namespace fanout::model {

// Decode (1) and MTP verification (2 with one draft token, up to 4) steps replay graphs; prefill
// chunks, whose lengths vary, run eagerly — those longer than this in the MHA form.
inline constexpr int64_t kMaxGraphQueryLen = 4;

struct CudaModelOptions {
    int64_t max_step_tokens = 256;  // query tokens in one step (generate_cuda splits prefill into chunks of this)
    int64_t max_requests = 64;      // requests in one step
    int64_t max_context = 4096;     // tokens of one request (prompt + generated)
    int64_t num_kv_blocks = 0;      // device cache blocks; 0: max_requests × max_context / block_size
    // The cache's entries: bf16, or kFP8E4M3 (ops/fp8_constants.h's MlaFp8Layout: the latent in
    // e4m3 with a scale per 128 values, 57% of bf16's bytes at V3's widths; appended quantized,
    // read by the decode kernels and the MHA form's gather as bf16(e4m3 · scale)).
    DType kv_dtype = DType::kBF16;
    bool cuda_graphs = true;
    // Rows whose logits one step returns; 0: min(max_step_tokens, max_requests × 4) — one per
    // request, or a few under MTP verification. `score` (every position) sets max_step_tokens.
    int64_t max_logit_rows = 0;
    // A step's prefill chunks run the MHA form (their contexts' latents expanded per head) while
    // their contexts total at most this many keys; past it the absorbed form, which reads the
    // cache as it is, so the expansion buffers stay bounded (H · (nope + v) bf16 per key and its
    // latent: ~66 KB at V3's widths, 1 GB at 16,384). 0: always the absorbed form.
    int64_t max_mha_context = 16384;
    // This GPU's EP group (comm/ep_gpu.h; FP8 payload for FP8 experts, bf16 otherwise; steps of up
    // to max_step_tokens per rank): the model then holds this rank's block of routed experts
    // (loaded with its ParallelConfig), and every step — an empty one too, forward_sample of a
    // batch without tokens — takes part in every MoE layer's dispatch and combine. nullptr: every
    // expert on this GPU (EP1), the local permute.
    comm::ExpertParallel* ep = nullptr;
    // The stream every step runs on, which the EP backend's calls must share (borrowed); nullptr:
    // the runner makes one of its own.
    cudaStream_t stream = nullptr;
    // > 0: MTP speculative decoding with this many draft tokens per step (the model must have an
    // MTP layer): the layer's weights and cache layer on the device, draft_mtp(), and the
    // verification graphs. 0: the MTP layer is not read.
    int64_t mtp_draft_tokens = 0;
    // The two-microbatch schedule (StepBatch::microbatch; cuda_layer.h's run_microbatched): a
    // second layer exec with its own step buffers (the absorbed form only: a one-request prefill
    // chunk runs in the first microbatch, the second empty) and, under expert parallelism,
    // microbatch_ep — a second backend of the same ranks on the same stream, so both microbatches'
    // exchanges can be in flight at once. false: a microbatched step is refused.
    bool microbatch = false;
    comm::ExpertParallel* microbatch_ep = nullptr;
};

class CudaModel {
  public:
    // Streams `model`'s weights to the current device (weight_upload.h: checking the values a
    // load with check_values false left unchecked) and allocates the cache and step buffers. The
    // DeepseekV3 may be destroyed afterwards.
    CudaModel(const DeepseekV3& model, const CudaModelOptions& opts = {}, const LoadProgress& progress = {});
    // Device bytes of the step buffers the constructor allocates for `opts` (everything but the
    // weights and the KV cache), for the memory plan before loading.
    static size_t workspace_bytes(const io::ModelConfig& c, const CudaModelOptions& opts);
    // Device bytes capture_decode_graphs() is planned to take for `opts` (graph nodes and what
    // the kernels allocate on their first run), for the memory plan.
    static size_t graph_bytes(const io::ModelConfig& c, const CudaModelOptions& opts);
    ~CudaModel();
    CudaModel(const CudaModel&) = delete;
    CudaModel& operator=(const CudaModel&) = delete;

    const io::ModelConfig& config() const;
    const CudaModelOptions& options() const;
    // A host block allocator with the device cache's geometry (it holds no entries): build
    // StepBatches with it, as with the CPU model's cache.
    kv::PagedKvCache make_block_allocator() const;

    // One step: appends the step's entries to the device cache and returns the logits of
    // batch.logit_rows as f32 [rows, vocab] on the host.
    Tensor forward_logits(const StepBatch& batch);
    // One step sampled on the device: one token per logit row (`rows` has one entry per logit row;
    // its bias_begin/bias_count index `logit_bias`, each id in the vocabulary and once per row).
    // Under expert parallelism a batch without tokens is this rank's empty step of the group.
    // With batch.all_hidden (MTP on), every row's final-normed hidden state stays on the device
    // for draft_mtp(); a row with SamplingRow::draft checks that draft.
    std::vector<int32_t> forward_sample(const StepBatch& batch, std::span<const ops::SamplingRow> rows,
                                        std::span<const ops::LogitBias> logit_bias = {});
    // The MTP layer (engine::ModelRunner::draft_mtp): token i of `batch` reads hidden state
    // hidden_rows[i] — of the last all_hidden step, or (`chained`) of the last draft_mtp's logit
    // rows; returns the greedy draft of each logit row. Under expert parallelism a batch without
    // tokens is this rank's pass of the group.
    std::vector<int32_t> draft_mtp(const StepBatch& batch, std::span<const int32_t> hidden_rows, bool chained);

    int64_t graphs_captured() const;
    // How the last step (or MTP pass) ran attention: its first `absorbed` requests in the absorbed
    // form, the `mha` after them (its prefill chunks) in the MHA form.
    struct AttentionSplit {
        int64_t absorbed = 0, mha = 0;
    };
    AttentionSplit last_attention_split() const;
    // Captures the decode graph (one query token per request, sampled) of every request bucket
    // now — the start-up's last phase — so no step captures while serving; returns what each
    // took: its bucket, seconds, and the device memory it cost (free memory before − after).
    // Under expert parallelism each capture's eager run is a step of the group: every rank calls
    // this together (after a barrier: a rank still loading would leave the others waiting).
    // With the two-microbatch schedule (CudaModelOptions::microbatch) each bucket's step is also
    // captured as two microbatches, and both graphs are replayed a few times and timed: what
    // `--microbatch auto` chooses by (engine::microbatch_min_tokens_from).
    struct GraphCapture {
        int64_t requests = 0, tokens = 0;  // the bucket: requests, and its step's query tokens
        double seconds = 0, bytes = 0;
        double step_us = 0, microbatch_step_us = 0;  // replay times (0: not measured)
    };
    std::vector<GraphCapture> capture_decode_graphs();
    // What streaming the weights did (weight_upload.h).
    const StreamStats& upload_stats() const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// generate() (generate.h) on the GPU runner: the same request checks, chunked prefill, and the
// same tokens for the same seed (each sampled token takes its request generator's next draw).
GenerateResult generate_cuda(CudaModel& model, kv::PagedKvCache& blocks, const GenerateRequest& req,
                             const std::function<void(int32_t)>& on_token = {});

}  // namespace fanout::model

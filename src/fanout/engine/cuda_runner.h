// The engine's ModelRunner on one GPU (CUDA builds): the GPU model runner (CudaModel) behind
// `fanout serve --device cuda`. The KV cache lives on the device; the engine's PagedKvCache only
// allocates its blocks (num_layers 0). Tokens are sampled on the device (samples_on_device), with
// each request's own generator draws, so they are the tokens the host samplers would pick from the
// same logits. Decode steps replay CUDA graphs (deepseek_v3_cuda.h).
#pragma once

#include <memory>
#include <string>

#include "fanout/engine/engine.h"
#include "fanout/model/deepseek_v3_cuda.h"

namespace fanout::engine {

class CudaRunner : public ModelRunner {
  public:
    // opts.num_kv_blocks must be the engine's EngineConfig::num_kv_blocks; `progress` sees the
    // weights stream to the device.
    CudaRunner(const model::DeepseekV3& model, const model::CudaModelOptions& opts,
               const model::LoadProgress& progress = {});
    // The GPU model, for start-up work (graph capture) and its load statistics.
    model::CudaModel& model() { return *gpu_; }
    int64_t vocab_size() const override { return config_.vocab_size; }
    int64_t max_context() const override { return gpu_->options().max_context; }
    std::vector<int64_t> eos_ids() const override { return config_.eos_token_ids; }
    kv::KvCacheConfig kv_cache_config(int64_t num_blocks) const override;
    Tensor forward(const model::StepBatch& batch, kv::PagedKvCache& cache) override;
    bool samples_on_device() const override { return true; }
    // Ready when the GPU model was made with at least this many draft tokens
    // (CudaModelOptions::mtp_draft_tokens: the MTP layer and its cache layer on the device).
    std::string enable_mtp(int draft_tokens) override;
    std::vector<int32_t> forward_sample(const model::StepBatch& batch, kv::PagedKvCache& cache,
                                        std::span<const ops::SamplingRow> rows,
                                        std::span<const ops::LogitBias> logit_bias) override;
    std::vector<int32_t> draft_mtp(const model::StepBatch& batch, std::span<const int32_t> hidden_rows, bool chained,
                                   kv::PagedKvCache& cache) override;
    // Ready when the GPU model was made with the two-microbatch schedule
    // (CudaModelOptions::microbatch: the second layer exec, and under EP its second backend).
    std::string microbatch_support() const override;
    int64_t mha_requests() const override { return gpu_->last_attention_split().mha; }

    // The current device's name, free and total memory (bytes), for the memory plan.
    struct DeviceMemory {
        std::string name;
        int device = 0;
        double free_bytes = 0, total_bytes = 0;
    };
    static DeviceMemory device_memory();

  private:
    io::ModelConfig config_;
    std::unique_ptr<model::CudaModel> gpu_;
};

}  // namespace fanout::engine

#include "fanout/engine/cuda_runner.h"

#include <cuda_runtime.h>

#include "fanout/core/cuda_check.h"

namespace fanout::engine {

CudaRunner::CudaRunner(const model::DeepseekV3& model, const model::CudaModelOptions& opts,
                       const model::LoadProgress& progress)
    : config_(model.config()), gpu_(std::make_unique<model::CudaModel>(model, opts, progress)) {}

std::string CudaRunner::enable_mtp(int draft_tokens) {
    const int64_t made = gpu_->options().mtp_draft_tokens;
    if (made >= draft_tokens) return "";
    return made == 0 ? "the GPU model was made without the MTP layer (CudaModelOptions::mtp_draft_tokens 0)"
                     : fmt::format("the GPU model was made for {} draft tokens", made);
}

std::string CudaRunner::microbatch_support() const {
    return gpu_->options().microbatch
               ? ""
               : "the GPU model was made without the two-microbatch schedule (CudaModelOptions::microbatch)";
}

std::vector<int32_t> CudaRunner::draft_mtp(const model::StepBatch& batch, std::span<const int32_t> hidden_rows,
                                           bool chained, kv::PagedKvCache&) {
    return gpu_->draft_mtp(batch, hidden_rows, chained);
}

CudaRunner::DeviceMemory CudaRunner::device_memory() {
    int count = 0;
    FANOUT_CHECK(cudaGetDeviceCount(&count) == cudaSuccess && count > 0, "--device cuda: no CUDA device is visible");
    DeviceMemory m;
    FANOUT_CUDA_CHECK(cudaGetDevice(&m.device));
    cudaDeviceProp prop{};
    FANOUT_CUDA_CHECK(cudaGetDeviceProperties(&prop, m.device));
    m.name = prop.name;
    size_t free_b = 0, total_b = 0;
    FANOUT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    m.free_bytes = static_cast<double>(free_b);
    m.total_bytes = static_cast<double>(total_b);
    return m;
}

kv::KvCacheConfig CudaRunner::kv_cache_config(int64_t num_blocks) const {
    const kv::KvCacheConfig k = gpu_->make_block_allocator().config();
    FANOUT_CHECK(num_blocks == k.num_blocks, "the GPU runner's device cache has {} blocks; the engine asked for {}",
                 k.num_blocks, num_blocks);
    return k;
}

Tensor CudaRunner::forward(const model::StepBatch& batch, kv::PagedKvCache&) { return gpu_->forward_logits(batch); }

std::vector<int32_t> CudaRunner::forward_sample(const model::StepBatch& batch, kv::PagedKvCache&,
                                                std::span<const ops::SamplingRow> rows,
                                                std::span<const ops::LogitBias> logit_bias) {
    return gpu_->forward_sample(batch, rows, logit_bias);
}

}  // namespace fanout::engine

#include "fanout/engine/cuda_runner.h"

namespace fanout::engine {

CudaRunner::CudaRunner(const model::DeepseekV3& model, const model::CudaModelOptions& opts)
    : config_(model.config()), gpu_(std::make_unique<model::CudaModel>(model, opts)) {}

double CudaRunner::block_bytes(const io::ModelConfig& c) {
    return static_cast<double>(c.num_hidden_layers * kv::kDefaultBlockSize * c.kv_entry_dim()) * dtype_size(DType::kBF16);
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

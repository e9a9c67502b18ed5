#include "emulated_ep.h"

#include <vector>

#include "fanout/core/cuda_check.h"
#include "fanout/ops/model_glue_cuda.h"
#include "kernels_bench.h"

namespace fanout::bench {

EmulatedEp::EmulatedEp(const comm::EpConfig& config, cudaStream_t stream) : config_(config), stream_(stream) {
    comm::validate(config_);
    FANOUT_CHECK(config_.payload == comm::Payload::kFp8, "the emulated EP backend carries FP8 tokens");
    const size_t rows = static_cast<size_t>(config_.local_experts()) * config_.rows_per_expert();
    counts_ = model::DeviceArray<int32_t>(static_cast<size_t>(config_.local_experts()));
    tokens_ = model::DeviceArray<uint8_t>(rows * config_.hidden);
    scales_ = model::DeviceArray<float>(rows * config_.scale_blocks());
    // Any finite values do: the GEMMs' time does not depend on them.
    ops::launch_random_fp8(tokens_.get(), tokens_.size(), 7, stream_);
    ops::launch_random_f32(scales_.get(), scales_.size(), 0.01f, 0.02f, 8, stream_);
    scratch_ = model::DeviceArray<uint16_t>(static_cast<size_t>(config_.max_tokens_per_rank) * config_.hidden);
    set_rows(0);
}

void EmulatedEp::set_rows(int m) {
    FANOUT_CHECK(m >= 0 && anchor_count_max(m) <= config_.rows_per_expert(),
                 "emulated dispatch of up to {} rows per expert ({} on average), room for {}", anchor_count_max(m), m,
                 config_.rows_per_expert());
    const int experts = config_.local_experts();
    const std::vector<int32_t> counts = anchor_counts(experts, m, experts * m, static_cast<uint32_t>(config_.world));
    // Pageable: the copy has taken the host vector before it returns.
    FANOUT_CUDA_CHECK(cudaMemcpyAsync(counts_.get(), counts.data(), counts.size() * sizeof(int32_t),
                                      cudaMemcpyHostToDevice, stream_));
}

comm::ExpertBatch EmulatedEp::recv_batch() const {
    return {counts_.get(), tokens_.get(), scales_.get(), config_.rows_per_expert()};
}

void EmulatedEp::combine_recv(const float*, void* out) {
    FANOUT_CUDA_CHECK(cudaMemsetAsync(
        out, 0, static_cast<size_t>(config_.max_tokens_per_rank) * config_.hidden * config_.output_bytes(), stream_));
}

}  // namespace fanout::bench

// `fanout bench layer`'s stand-in for dispatch and combine: an EP backend (comm/ep.h) that moves
// nothing. The local experts "receive" m rows of random FP8 tokens each on average — what EP-N's
// dispatch would deliver to one rank at the benchmarked batch — spread as routing spreads them
// (bench kernels' anchor_counts: each in [0.7, 1.3] × m, m · experts in all), and combine receive
// writes zeros. The layer runs its real expert-parallel path on it (model/cuda_layer.h), so the
// emulated and the real communication (the nvlink / nccl backends) differ only in the backend.
#pragma once

#include <cuda_runtime.h>

#include "fanout/comm/ep.h"
#include "fanout/model/cuda_layer.h"

namespace fanout::bench {

class EmulatedEp final : public comm::ExpertParallel {
  public:
    // Receive rows for config.rows_per_expert() per local expert (FP8 payload), on `stream`.
    EmulatedEp(const comm::EpConfig& config, cudaStream_t stream);
    // From now on the local experts receive m rows each on average, each at most
    // anchor_count_max(m) (≤ rows_per_expert): the same counts for the same m and EP size.
    // Exactly m each (every count the same, as before the twenty-eighth session) made the layer
    // favour tiles that fit m exactly: at m = 128 or 1,024, 128-row tiles never had a block with
    // only a few rows, which real routing gives them on about every other expert.
    void set_rows(int m);

    const comm::EpConfig& config() const override { return config_; }
    void dispatch_send(const comm::DispatchInput&) override {}
    void dispatch_recv() override {}
    comm::ExpertBatch recv_batch() const override;
    void combine_send(const void*) override {}
    void combine_recv(const float*, void* out) override;
    // As the GPU backends' fused combine is timed here: combine_recv's stand-in (into a scratch
    // buffer), the residual untouched.
    void combine_recv_add(const float* w, void*) override { combine_recv(w, scratch_.get()); }
    // Its launches (combine's zeros) go on `stream`, the layer's: set_expert_parallel checks it.
    void* device_stream() const override { return stream_; }

  private:
    comm::EpConfig config_;
    cudaStream_t stream_;
    model::DeviceArray<int32_t> counts_;
    model::DeviceArray<uint8_t> tokens_;
    model::DeviceArray<float> scales_;
    model::DeviceArray<uint16_t> scratch_;  // combine_recv_add's stand-in output [max tokens, hidden]
};

}  // namespace fanout::bench

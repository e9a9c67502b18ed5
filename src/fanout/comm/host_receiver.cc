#include "fanout/comm/host_receiver.h"

#include <algorithm>
#include <cstring>

#include "fanout/core/error.h"

namespace fanout::comm {

int check_dispatch(const EpConfig& c, const DispatchInput& in) {
    const int T = *in.num_tokens, K = c.experts_per_token;
    FANOUT_CHECK(T >= 0 && T <= c.max_tokens_per_rank, "EP dispatch: rank {} has {} tokens, outside [0, {}]", c.rank, T,
                 c.max_tokens_per_rank);
    for (int i = 0; i < T * K; ++i) {
        const int e = in.topk_idx[i];
        FANOUT_CHECK(e >= 0 && e < c.num_experts,
                     "EP dispatch: rank {} token {} choice {} names expert {} outside [0, {})", c.rank, i / K, i % K, e,
                     c.num_experts);
    }
    return T;
}

HostReceiver::HostReceiver(const EpConfig& c) : config_(c) {
    const size_t rows = static_cast<size_t>(c.local_experts()) * c.rows_per_expert();
    counts_.assign(static_cast<size_t>(c.local_experts()), 0);
    tokens_.assign(rows * c.payload_bytes(), 0);
    if (c.payload == Payload::kFp8) scales_.assign(rows * c.scale_blocks(), 0.0f);
    origin_.assign(rows, Origin{});
}

void HostReceiver::begin_step() { std::fill(counts_.begin(), counts_.end(), 0); }

void HostReceiver::place(int e, Origin from, const uint8_t* payload, const float* scales) {
    const int M = config_.rows_per_expert();
    const int row = counts_[e]++;
    if (row >= M) return;
    const size_t r = static_cast<size_t>(e) * M + row, pb = config_.payload_bytes(), nb = config_.scale_blocks();
    std::memcpy(tokens_.data() + r * pb, payload, pb);
    if (config_.payload == Payload::kFp8) std::memcpy(scales_.data() + r * nb, scales, nb * sizeof(float));
    origin_[r] = from;
}

ExpertBatch HostReceiver::batch() const {
    return {counts_.data(), tokens_.data(), config_.payload == Payload::kFp8 ? scales_.data() : nullptr,
            config_.rows_per_expert()};
}

}  // namespace fanout::comm

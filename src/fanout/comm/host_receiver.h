// What the host-memory EP backends (`local`, `mpi`) share: checking a dispatch input, the receive
// side (the masked layout filled in arrival order, with each row's origin) and the weighted
// combine at the tokens' rank. Internal to comm/.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "fanout/comm/ep.h"
#include "fanout/core/dtype.h"

namespace fanout::comm {

// The token count of `in`, after checking it and every expert id; throws fanout::Error naming the
// rank, token and choice at fault.
int check_dispatch(const EpConfig& c, const DispatchInput& in);

class HostReceiver {
  public:
    struct Origin {
        int rank = 0, token = 0, choice = 0;
    };

    explicit HostReceiver(const EpConfig& c);

    void begin_step();  // no rows yet
    // One received (token, choice) for local expert `e`; rows past max_m are counted, not stored
    // (they add nothing to the combine). scales: null for a bf16 payload.
    void place(int e, Origin from, const uint8_t* payload, const float* scales);
    ExpertBatch batch() const;

    // fn(row index in the masked layout, origin) for every stored row.
    template <typename Fn>
    void for_each_row(Fn&& fn) const {
        const int M = config_.rows_per_expert();
        for (int e = 0; e < config_.local_experts(); ++e)
            for (int row = 0; row < counts_[e] && row < M; ++row) {
                const size_t r = static_cast<size_t>(e) * M + row;
                fn(r, origin_[r]);
            }
    }

  private:
    EpConfig config_;
    std::vector<int32_t> counts_;
    std::vector<uint8_t> tokens_;
    std::vector<float> scales_;
    std::vector<Origin> origin_;  // per stored row: where its token came from
};

// out[t] = Σ_k weight[t, k] · returned(t, k) in f32, in choice order, written as `Out` (bf16 as
// uint16_t, or float) [T, H]; returned(t, k) is the expert output row (of `Out` values) that came
// back for token t's k-th choice, or nullptr when it was dropped.
template <typename Out, typename RowOf>
void combine_rows(int T, int K, int H, const float* weight, RowOf&& returned, Out* out) {
    const auto load = [](Out v) {
        if constexpr (std::is_same_v<Out, float>)
            return v;
        else
            return bf16_to_f32(v);
    };
    std::vector<float> acc(static_cast<size_t>(H));
    for (int t = 0; t < T; ++t) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int k = 0; k < K; ++k) {
            const Out* row = returned(t, k);
            if (row == nullptr) continue;
            const float w = weight[static_cast<size_t>(t) * K + k];
            for (int d = 0; d < H; ++d) acc[d] += w * load(row[d]);
        }
        for (int d = 0; d < H; ++d) {
            if constexpr (std::is_same_v<Out, float>)
                out[static_cast<size_t>(t) * H + d] = acc[d];
            else
                out[static_cast<size_t>(t) * H + d] = f32_to_bf16(acc[d]);
        }
    }
}

// combine_rows over rows of raw bytes, in the output type of `c`'s payload.
template <typename RowOf>
void combine_rows_bytes(const EpConfig& c, int T, const float* weight, RowOf&& returned, void* out) {
    const int K = c.experts_per_token, H = c.hidden;
    if (c.payload == Payload::kF32)
        combine_rows<float>(
            T, K, H, weight, [&](int t, int k) { return reinterpret_cast<const float*>(returned(t, k)); },
            static_cast<float*>(out));
    else
        combine_rows<uint16_t>(
            T, K, H, weight, [&](int t, int k) { return reinterpret_cast<const uint16_t*>(returned(t, k)); },
            static_cast<uint16_t*>(out));
}

}  // namespace fanout::comm

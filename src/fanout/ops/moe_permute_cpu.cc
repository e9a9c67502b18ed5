// The MoE permute's and un-permute's CPU references (moe_permute.h): the plain loops the GPU
// kernels are checked against.
#include <algorithm>
#include <cstring>
#include <vector>

#include "fanout/core/dtype.h"
#include "fanout/core/error.h"
#include "fanout/ops/fp8_constants.h"
#include "fanout/ops/moe_permute.h"

namespace fanout::ops {

void moe_permute_cpu(const uint8_t* x, const float* sx, const int32_t* topk_idx, int T, int K, int D, int expert_begin,
                     int num_local, int cap, int spill_rows, uint8_t* out_x, float* out_s, int32_t* counts,
                     int32_t* spill_block_expert, int32_t* slot) {
    FANOUT_CHECK(num_local > 0 && cap >= 0 && spill_rows >= 0 && spill_rows % kMoeSpillBlock == 0,
                 "moe_permute: num_local {}, cap {}, spill_rows {} (a multiple of 128)", num_local, cap, spill_rows);
    const size_t nb = static_cast<size_t>((D + kFp8Block - 1) / kFp8Block);
    // Each choice's rank among its expert's choices in (t, k) order, and the experts' counts.
    std::vector<int32_t> rank(static_cast<size_t>(T) * K, -1), count(static_cast<size_t>(num_local), 0);
    for (int i = 0; i < T * K; ++i) {
        const int e = topk_idx[i] - expert_begin;
        if (e >= 0 && e < num_local) rank[i] = count[e]++;
    }
    // Spill segments: expert e's choices past the cap from spill_begin[e], padded to 128 rows.
    std::vector<int64_t> spill_begin(static_cast<size_t>(num_local) + 1, 0);
    for (int e = 0; e < num_local; ++e) {
        const int64_t extra = std::max(count[e] - cap, 0);
        spill_begin[e + 1] = spill_begin[e] + (extra + kMoeSpillBlock - 1) / kMoeSpillBlock * kMoeSpillBlock;
    }
    FANOUT_CHECK(spill_begin[num_local] <= spill_rows,
                 "moe_permute: the spilled choices need {} rows, the region has {} (an expert repeated in a token?)",
                 spill_begin[num_local], spill_rows);
    for (int j = 0; j < spill_rows / kMoeSpillBlock; ++j) spill_block_expert[j] = -1;
    for (int e = 0; e < num_local; ++e)
        for (int64_t r = spill_begin[e]; r < spill_begin[e + 1]; r += kMoeSpillBlock)
            spill_block_expert[r / kMoeSpillBlock] = e;
    const int64_t masked_rows = static_cast<int64_t>(num_local) * cap;
    for (int i = 0; i < T * K; ++i) {
        slot[i] = -1;
        if (rank[i] < 0) continue;
        const int e = topk_idx[i] - expert_begin, r = rank[i];
        const int64_t row = r < cap ? static_cast<int64_t>(e) * cap + r : masked_rows + spill_begin[e] + (r - cap);
        const size_t t = static_cast<size_t>(i / K);
        std::memcpy(out_x + row * D, x + t * D, static_cast<size_t>(D));
        if (sx != nullptr) std::memcpy(out_s + row * nb, sx + t * nb, nb * sizeof(float));
        slot[i] = static_cast<int32_t>(row);
    }
    std::memcpy(counts, count.data(), count.size() * sizeof(int32_t));
}

void moe_unpermute_cpu(const uint16_t* y, const int32_t* slot, const float* weight, int T, int K, int D,
                       const uint16_t* base, uint16_t* out) {
    std::vector<float> acc(static_cast<size_t>(D));
    for (int t = 0; t < T; ++t) {
        for (int d = 0; d < D; ++d) acc[d] = base != nullptr ? bf16_to_f32(base[static_cast<size_t>(t) * D + d]) : 0.0f;
        for (int k = 0; k < K; ++k) {
            const int32_t r = slot[t * K + k];
            if (r < 0) continue;
            const float w = weight[t * K + k];
            for (int d = 0; d < D; ++d) acc[d] += w * bf16_to_f32(y[static_cast<size_t>(r) * D + d]);
        }
        for (int d = 0; d < D; ++d) out[static_cast<size_t>(t) * D + d] = f32_to_bf16(acc[d]);
    }
}

}  // namespace fanout::ops

#include <cstring>
#include <vector>

#include "fanout/core/dtype.h"
#include "fanout/ops/fp8_constants.h"
#include "fanout/ops/moe_permute.h"

namespace fanout::ops {

void moe_permute_masked_cpu(const uint8_t* x, const float* sx, const int32_t* topk_idx, int T, int K, int D,
                            int expert_begin, int num_local, int max_m, uint8_t* out_x, float* out_s, int32_t* counts,
                            int32_t* slot) {
    const int nb = static_cast<int>((D + kFp8Block - 1) / kFp8Block);
    std::vector<int32_t> filled(static_cast<size_t>(num_local), 0);
    for (int i = 0; i < T * K; ++i) {
        const int e = topk_idx[i] - expert_begin;
        slot[i] = -1;
        if (e < 0 || e >= num_local) continue;
        const int r = filled[e]++;
        if (r >= max_m) continue;
        const size_t row = static_cast<size_t>(e) * max_m + r;
        std::memcpy(out_x + row * D, x + static_cast<size_t>(i / K) * D, static_cast<size_t>(D));
        std::memcpy(out_s + row * nb, sx + static_cast<size_t>(i / K) * nb, static_cast<size_t>(nb) * sizeof(float));
        slot[i] = static_cast<int32_t>(row);
    }
    std::memcpy(counts, filled.data(), filled.size() * sizeof(int32_t));
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

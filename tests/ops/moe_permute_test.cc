// The MoE permutation's CPU reference: stable (t, k) order per expert, counts past max_m dropped
// with slot -1, non-local experts skipped; the un-permute's weighted sum.
#include "fanout/ops/moe_permute.h"

#include <gtest/gtest.h>

#include <vector>

#include "fanout/core/dtype.h"

namespace fanout::ops {
namespace {

TEST(MoePermute, StableOrderOverflowAndNonLocalExperts) {
    const int T = 4, K = 2, D = 3, begin = 10, local = 3, max_m = 2;
    // token: choices (experts); local experts are 10, 11, 12.
    const std::vector<int32_t> idx = {10, 12, 11, 10, 10, 99, 10, 11};
    std::vector<uint8_t> x(T * D);
    std::vector<float> sx(T);
    for (int t = 0; t < T; ++t) {
        for (int d = 0; d < D; ++d) x[t * D + d] = uint8_t(10 * t + d);
        sx[t] = float(t) + 0.5f;
    }
    std::vector<uint8_t> ox(local * max_m * D, 0xee);
    std::vector<float> os(local * max_m, -1.0f);
    std::vector<int32_t> counts(local), slot(T * K);
    moe_permute_masked_cpu(x.data(), sx.data(), idx.data(), T, K, D, begin, local, max_m, ox.data(), os.data(),
                           counts.data(), slot.data());
    EXPECT_EQ(counts, (std::vector<int32_t>{4, 2, 1}));  // expert 10 got 4 rows, 2 of them past max_m
    // expert 10: tokens 0 (row 0), 1 (row 1), then 2 and 3 dropped.
    EXPECT_EQ(slot, (std::vector<int32_t>{0, 4, 2, 1, -1, -1, -1, 3}));
    EXPECT_EQ(ox[1 * D + 0], 10);  // expert 10 row 1 = token 1
    EXPECT_EQ(os[1], 1.5f);
    EXPECT_EQ(ox[3 * D + 2], 32);  // expert 11 row 1 = token 3
    EXPECT_EQ(ox[5 * D], 0xee);    // expert 12 row 1 never written
}

TEST(MoePermute, UnpermuteIsTheWeightedSumOverValidSlots) {
    const int T = 2, K = 2, D = 2;
    const std::vector<uint16_t> y = {f32_to_bf16(1.0f), f32_to_bf16(2.0f), f32_to_bf16(3.0f), f32_to_bf16(4.0f)};
    const std::vector<int32_t> slot = {1, -1, 0, 1};
    const std::vector<float> w = {0.5f, 100.0f, 2.0f, -1.0f};
    const std::vector<uint16_t> base = {f32_to_bf16(10.0f), f32_to_bf16(20.0f), f32_to_bf16(0.0f), f32_to_bf16(1.0f)};
    std::vector<uint16_t> out(T * D);
    moe_unpermute_cpu(y.data(), slot.data(), w.data(), T, K, D, base.data(), out.data());
    EXPECT_EQ(bf16_to_f32(out[0]), 11.5f);  // 10 + 0.5·3
    EXPECT_EQ(bf16_to_f32(out[1]), 22.0f);  // 20 + 0.5·4
    EXPECT_EQ(bf16_to_f32(out[2]), -1.0f);  // 0 + 2·1 − 1·3
    EXPECT_EQ(bf16_to_f32(out[3]), 1.0f);   // 1 + 2·2 − 1·4
}

}  // namespace
}  // namespace fanout::ops

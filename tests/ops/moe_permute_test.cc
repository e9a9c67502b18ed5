// The MoE permutation's CPU reference (moe_permute.h): hand-checked steps in the capped masked
// layout with spills, the pure contiguous (cap 0) and pure masked (cap >= T) layouts, the spill
// bound against every routing of small shapes, the layout's invariants on random skewed routings
// of odd shapes; and the un-permute's weighted sum.
#include "fanout/ops/moe_permute.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "fanout/core/dtype.h"
#include "fanout/core/error.h"
#include "test_util.h"

namespace fanout::ops {
namespace {

using fanout::testing::skewed_routing;

// One permute on the CPU with its outputs poisoned first: rows 0xee, scales -1, the rest -7.
struct Permuted {
    int rows = 0, nb = 0;
    std::vector<uint8_t> x;
    std::vector<float> s;
    std::vector<int32_t> counts, blocks, slot;
};

Permuted permute(const std::vector<uint8_t>& x, const std::vector<float>& sx, const std::vector<int32_t>& idx, int T,
                 int K, int D, int begin, int local, int cap, int spill_rows) {
    Permuted p;
    p.nb = (D + 127) / 128;
    p.rows = local * cap + spill_rows;
    p.x.assign(size_t(p.rows) * D, 0xee);
    p.s.assign(size_t(p.rows) * p.nb, -1.0f);
    p.counts.assign(size_t(local), -7);
    p.blocks.assign(size_t(spill_rows / 128), -7);
    p.slot.assign(idx.size(), -7);
    moe_permute_cpu(x.data(), sx.data(), idx.data(), T, K, D, begin, local, cap, spill_rows, p.x.data(), p.s.data(),
                    p.counts.data(), p.blocks.data(), p.slot.data());
    return p;
}

// Token t's row is bytes 10·t + d, its scale t + 0.5.
struct Tokens {
    std::vector<uint8_t> x;
    std::vector<float> sx;
    Tokens(int T, int D) : x(size_t(T) * D), sx(size_t(T)) {
        for (int t = 0; t < T; ++t) {
            for (int d = 0; d < D; ++d) x[size_t(t) * D + d] = uint8_t(10 * t + d);
            sx[size_t(t)] = float(t) + 0.5f;
        }
    }
};

// Local experts 10, 11, 12; 99 belongs to another rank. Expert 10 gets 6 choices, 11 gets 3, 12 gets 2.
constexpr int kT = 6, kK = 2, kD = 3, kBegin = 10, kLocal = 3;
const std::vector<int32_t> kIdx = {10, 12, 10, 11, 10, 99, 11, 10, 12, 10, 10, 11};

TEST(MoePermute, CappedMaskedRowsThenSpillSegments) {
    const Tokens tok(kT, kD);
    const int cap = 2, spill_rows = int(moe_spill_rows(kT, kK, kLocal, cap));
    EXPECT_EQ(spill_rows, 512);  // 12 choices + 3 experts · (127 − 2) = 387, rounded up
    const Permuted p = permute(tok.x, tok.sx, kIdx, kT, kK, kD, kBegin, kLocal, cap, spill_rows);
    EXPECT_EQ(p.counts, (std::vector<int32_t>{6, 3, 2}));  // full counts, past the cap
    // Masked rows 0..5 (expert e's first two at 2e, 2e + 1); expert 10's last four from row 6, its
    // segment padded to 128; expert 11's third at 6 + 128; 99 is not local.
    EXPECT_EQ(p.slot, (std::vector<int32_t>{0, 4, 1, 2, 6, -1, 3, 7, 5, 8, 9, 134}));
    EXPECT_EQ(p.blocks, (std::vector<int32_t>{0, 1, -1, -1}));
    EXPECT_EQ(p.x[7 * kD + 1], 31);  // row 7: expert 10's 4th choice, token 3
    EXPECT_EQ(p.s[7], 3.5f);
    EXPECT_EQ(p.x[134 * kD + 2], 52);  // row 134: expert 11's spilled choice, token 5
    EXPECT_EQ(p.s[134], 5.5f);
    EXPECT_EQ(p.x[5 * kD], 40);     // expert 12's second, token 4
    EXPECT_EQ(p.x[10 * kD], 0xee);  // expert 10's padding: untouched
    EXPECT_EQ(p.s[135], -1.0f);     // expert 11's padding
}

TEST(MoePermute, CapZeroIsThePureContiguousLayout) {
    const Tokens tok(kT, kD);
    const int spill_rows = int(moe_spill_rows(kT, kK, kLocal, 0));
    EXPECT_EQ(spill_rows, 512);  // 12 + 3 · 127 = 393, rounded up
    const Permuted p = permute(tok.x, tok.sx, kIdx, kT, kK, kD, kBegin, kLocal, 0, spill_rows);
    EXPECT_EQ(p.counts, (std::vector<int32_t>{6, 3, 2}));
    EXPECT_EQ(p.slot, (std::vector<int32_t>{0, 256, 1, 128, 2, -1, 129, 3, 257, 4, 5, 130}));
    EXPECT_EQ(p.blocks, (std::vector<int32_t>{0, 1, 2, -1}));
    for (int r = 0; r < 6; ++r) EXPECT_EQ(p.x[size_t(r) * kD], 10 * r) << r;  // expert 10: tokens 0..5
    EXPECT_EQ(p.x[257 * kD], 40);                                             // expert 12's second: token 4
    EXPECT_EQ(p.x[6 * kD], 0xee);
}

TEST(MoePermute, CapOfTIsThePureMaskedLayout) {
    const Tokens tok(kT, kD);
    EXPECT_EQ(moe_spill_rows(kT, kK, kLocal, kT), 0);
    const Permuted p = permute(tok.x, tok.sx, kIdx, kT, kK, kD, kBegin, kLocal, kT, 0);
    EXPECT_EQ(p.counts, (std::vector<int32_t>{6, 3, 2}));
    EXPECT_EQ(p.slot, (std::vector<int32_t>{0, 12, 1, 6, 2, -1, 7, 3, 13, 4, 5, 8}));
    EXPECT_EQ(p.x[8 * kD + 2], 52);  // expert 11 row 2: token 5
    EXPECT_EQ(p.x[9 * kD], 0xee);    // expert 11 row 3: past its count
}

TEST(MoePermute, SpillRegionTooSmallIsAnError) {
    const Tokens tok(kT, kD);
    const std::string msg =
        fanout::testing::error_of([&] { permute(tok.x, tok.sx, kIdx, kT, kK, kD, kBegin, kLocal, 2, 128); });
    EXPECT_NE(msg.find("256 rows"), std::string::npos) << msg;
}

TEST(MoePermute, MaskedCapIsFourTimesTheUniformMean) {
    EXPECT_EQ(moe_masked_cap(1, 8, 256), 1);     // never more than T
    EXPECT_EQ(moe_masked_cap(64, 8, 256), 16);   // mean 2: at least 16
    EXPECT_EQ(moe_masked_cap(256, 8, 256), 32);  // mean 8
    EXPECT_EQ(moe_masked_cap(100, 8, 256), 16);  // mean ceil(3.1) = 4: 16
    EXPECT_EQ(moe_masked_cap(300, 8, 256), 48);  // mean ceil(9.4) = 10: 40, rounded up to 48
    EXPECT_EQ(moe_masked_cap(2048, 8, 256), 256);
    EXPECT_EQ(moe_masked_cap(0, 8, 256), 0);
    EXPECT_EQ(moe_spill_rows(8192, 8, 256, 0), 65536 + 256 * 127);
    EXPECT_EQ(moe_spill_rows(256, 8, 256, 256), 0);
}

// The most padded spill rows any routing can need: experts' counts c_e ≤ T (distinct experts per
// token) with Σ c_e ≤ T·K — every such vector is some routing's — maximized by a knapsack over
// the experts. moe_spill_rows must cover it.
TEST(MoePermute, SpillBoundCoversEveryRouting) {
    for (int T : {1, 2, 5, 17, 40, 130, 300})
        for (int K : {1, 2, 3, 8})
            for (int local : {1, 2, 3, 7})
                for (int cap : {0, 1, 2, 5, 16, 100, 127, 128, 200, 300}) {
                    const int choices = T * K;
                    std::vector<int64_t> best(size_t(choices) + 1, -1);  // best[j]: the most rows with j choices
                    best[0] = 0;
                    for (int e = 0; e < local; ++e) {
                        std::vector<int64_t> next = best;
                        for (int j = 0; j <= choices; ++j) {
                            if (best[j] < 0) continue;
                            for (int c = 1; c <= T && j + c <= choices; ++c) {
                                const int64_t pad = (std::max(c - cap, 0) + 127) / 128 * 128;
                                next[j + c] = std::max(next[j + c], best[j] + pad);
                            }
                        }
                        best = next;
                    }
                    const int64_t most = *std::max_element(best.begin(), best.end());
                    const int64_t bound = moe_spill_rows(T, K, local, cap);
                    ASSERT_GE(bound, most) << "T " << T << " K " << K << " local " << local << " cap " << cap;
                    ASSERT_EQ(bound % 128, 0);
                }
}

// The layout's invariants on random odd shapes: full counts, each expert's choices in (t, k)
// order at e·cap + r below the cap and at consecutive rows of its own segment past it, segments
// in expert order padded to 128 rows, spill_block_expert naming them, rows and scales copied.
TEST(MoePermute, RandomSkewedRoutingsKeepTheLayout) {
    std::mt19937 rng(77);
    for (int iter = 0; iter < 60; ++iter) {
        const int T = 1 + int(rng() % 300), K = 1 + int(rng() % 8), E = K + int(rng() % 60);
        const int local = 1 + int(rng() % E), begin = int(rng() % (E - local + 1)), D = 1 + int(rng() % 300);
        const int caps[] = {0, 1, int(rng() % 40), int(moe_masked_cap(T, K, E)), T, T + 5};
        const int cap = caps[iter % 6];
        const int spill_rows = int(moe_spill_rows(T, K, local, cap));
        const auto idx = skewed_routing(T, K, E, 100 + iter, iter % 3 == 0 ? 0.0 : 1.5);
        std::vector<uint8_t> x(size_t(T) * D);
        for (auto& v : x) v = uint8_t(rng());
        const auto sx = fanout::testing::random_floats(size_t(T) * ((D + 127) / 128), 200 + iter);
        const Permuted p = permute(x, sx, idx, T, K, D, begin, local, cap, spill_rows);
        const std::string what = "T " + std::to_string(T) + " K " + std::to_string(K) + " local " +
                                 std::to_string(local) + " cap " + std::to_string(cap) + " D " + std::to_string(D);
        const int masked = local * cap;
        std::vector<int32_t> seen(size_t(local), 0);
        int segment_end = 0;  // the spill rows used by the experts seen so far, in expert order
        std::vector<int> first_spill(size_t(local), -1);
        for (size_t i = 0; i < idx.size(); ++i) {
            const int e = idx[i] - begin;
            if (e < 0 || e >= local) {
                ASSERT_EQ(p.slot[i], -1) << what;
                continue;
            }
            const int r = seen[e]++, row = p.slot[i];
            if (r < cap) {
                ASSERT_EQ(row, e * cap + r) << what;
            } else {
                ASSERT_GE(row, masked) << what;
                ASSERT_LT(row, masked + spill_rows) << what;
                if (first_spill[e] < 0) first_spill[e] = row - masked;
                ASSERT_EQ(row - masked, first_spill[e] + (r - cap)) << what;  // consecutive in (t, k) order
                ASSERT_EQ(p.blocks[(row - masked) / 128], e) << what;
            }
            const size_t t = i / size_t(K);
            for (int d = 0; d < D; ++d) ASSERT_EQ(p.x[size_t(row) * D + d], x[t * D + d]) << what;
            for (int b = 0; b < p.nb; ++b) ASSERT_EQ(p.s[size_t(row) * p.nb + b], sx[t * p.nb + b]) << what;
        }
        ASSERT_EQ(p.counts, seen) << what;
        for (int e = 0; e < local; ++e) {
            const int extra = std::max(seen[e] - cap, 0), blocks = (extra + 127) / 128;
            if (extra == 0) continue;
            ASSERT_EQ(first_spill[e], segment_end) << what << " expert " << e;  // segments back to back
            for (int j = 0; j < blocks; ++j) ASSERT_EQ(p.blocks[size_t(segment_end / 128 + j)], e) << what;
            segment_end += blocks * 128;
        }
        for (size_t j = size_t(segment_end / 128); j < p.blocks.size(); ++j) ASSERT_EQ(p.blocks[j], -1) << what;
        if (cap >= T) {
            ASSERT_EQ(spill_rows, 0) << what;
        }
    }
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

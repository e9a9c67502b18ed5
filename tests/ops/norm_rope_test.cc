// rms_norm, silu_mul and RoPE / YaRN against direct formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "fanout/ops/activation.h"
#include "fanout/ops/rms_norm.h"
#include "fanout/ops/rope.h"
#include "test_util.h"

namespace fanout::ops {
namespace {

using fanout::testing::random_tensor;

TEST(RmsNorm, MatchesFormulaOnOddShapes) {
    ThreadPool pool(2);
    for (auto [M, D] : {std::pair{1, 1}, {7, 33}, {19, 300}}) {
        Tensor x = random_tensor({M, D}, 11, 3.0f), w = random_tensor({D}, 12), out = Tensor::zeros({M, D}, DType::kF32);
        fanout::testing::poison(out);
        rms_norm(x, w, 1e-6f, out, Stream{&pool});
        for (int m = 0; m < M; ++m) {
            double ss = 0;
            for (int d = 0; d < D; ++d) ss += double(x.data_as<float>()[m * D + d]) * x.data_as<float>()[m * D + d];
            const double inv = 1.0 / std::sqrt(ss / D + 1e-6);
            for (int d = 0; d < D; ++d)
                EXPECT_NEAR(out.data_as<float>()[m * D + d], x.data_as<float>()[m * D + d] * inv * w.data_as<float>()[d],
                            1e-5);
        }
    }
}

TEST(SiluMul, MatchesFormula) {
    Tensor g = random_tensor({5, 37}, 13, 6.0f), u = random_tensor({5, 37}, 14), o = Tensor::zeros({5, 37}, DType::kF32);
    silu_mul(g, u, o, Stream{});
    for (int i = 0; i < 5 * 37; ++i) {
        const double a = g.data_as<float>()[i];
        EXPECT_NEAR(o.data_as<float>()[i], a / (1 + std::exp(-a)) * u.data_as<float>()[i], 1e-5);
    }
}

TEST(Rope, PlainRotatesInterleavedPairs) {
    RopeParams p;
    p.dim = 8;
    const RopeTable t = make_rope_table(p);
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(t.inv_freq[i], std::pow(10000.0, -2.0 * i / 8), 1e-7);
    Tensor x = random_tensor({3, 2, 11}, 15);  // 3 tokens, 2 heads, rope part at offset 3
    Tensor before = Tensor::zeros({3, 2, 11}, DType::kF32);
    std::copy_n(x.data_as<float>(), 66, before.data_as<float>());
    const int32_t pos[3] = {0, 5, 4097};
    rope_apply(x, 3, pos, t, Stream{});
    for (int tok = 0; tok < 3; ++tok)
        for (int h = 0; h < 2; ++h) {
            const float* a = before.data_as<float>() + (tok * 2 + h) * 11;
            const float* b = x.data_as<float>() + (tok * 2 + h) * 11;
            for (int d = 0; d < 3; ++d) EXPECT_EQ(a[d], b[d]);  // the nope part is untouched
            for (int i = 0; i < 4; ++i) {
                const double ang = pos[tok] * std::pow(10000.0, -2.0 * i / 8);
                EXPECT_NEAR(b[3 + 2 * i], a[3 + 2 * i] * std::cos(ang) - a[4 + 2 * i] * std::sin(ang), 2e-3);
                EXPECT_NEAR(b[4 + 2 * i], a[4 + 2 * i] * std::cos(ang) + a[3 + 2 * i] * std::sin(ang), 2e-3);
            }
        }
}

TEST(Rope, YarnMatchesDeepSeekFormula) {
    // DeepSeek-V3's own numbers: rope dim 64, factor 40, original 4096, beta 32 / 1.
    RopeParams p;
    p.dim = 64;
    p.yarn = true;
    p.factor = 40;
    p.original_max_position = 4096;
    const RopeTable t = make_rope_table(p);
    const auto corr = [](double rot) {
        return 64 * std::log(4096 / (rot * 2 * std::numbers::pi)) / (2 * std::log(10000.0));
    };
    const double low = std::max(0.0, std::floor(corr(32))), high = std::min(63.0, std::ceil(corr(1)));
    EXPECT_EQ(low, 10);
    EXPECT_EQ(high, 23);
    for (int i = 0; i < 32; ++i) {
        const double base = std::pow(10000.0, -2.0 * i / 64);
        const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
        const double smooth = 1 - ramp;  // 1: keep the frequency, 0: divide it by the factor
        EXPECT_NEAR(t.inv_freq[i], base / 40 * (1 - smooth) + base * smooth, 1e-6 * base) << i;
    }
    EXPECT_EQ(t.inv_freq[0], 1.0f);            // high frequencies extrapolate
    EXPECT_NEAR(t.inv_freq[31], std::pow(10000.0, -62.0 / 64) / 40, 1e-9);  // low ones interpolate
}

TEST(Rope, AttentionFactorScalesCosAndSin) {
    RopeParams p;
    p.dim = 4;
    p.attention_factor = 0.5;
    const RopeTable t = make_rope_table(p);
    Tensor x = Tensor::zeros({1, 1, 4}, DType::kF32);
    for (int i = 0; i < 4; ++i) x.data_as<float>()[i] = 1.0f;
    const int32_t pos[1] = {0};
    rope_apply(x, 0, pos, t, Stream{});
    for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(x.data_as<float>()[i], 0.5f);
}

}  // namespace
}  // namespace fanout::ops

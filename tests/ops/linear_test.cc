// linear and fp8 quantization against double-precision references on odd shapes.
#include <gtest/gtest.h>

#include "fanout/ops/fp8_quant.h"
#include "fanout/ops/gemm.h"
#include "fanout/ops/linear.h"
#include "test_util.h"

namespace fanout::ops {
namespace {

using fanout::testing::random_floats;
using fanout::testing::random_tensor;
using fanout::testing::rel_error;

std::vector<float> reference_linear(const Tensor& x, const std::vector<float>& w, int64_t N) {
    const int64_t M = x.dim(0), K = x.dim(1);
    std::vector<float> y(static_cast<size_t>(M * N));
    for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
            double acc = 0;
            for (int64_t k = 0; k < K; ++k) acc += double(x.data_as<float>()[m * K + k]) * w[n * K + k];
            y[m * N + n] = static_cast<float>(acc);
        }
    return y;
}

class LinearShapes : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(LinearShapes, Bf16MatchesReference) {
    const auto [M, N, K] = GetParam();
    ThreadPool pool(2);
    Tensor x = random_tensor({M, K}, 1);
    std::vector<float> wf = random_floats(size_t(N) * K, 2);
    std::vector<uint16_t> wb(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) {
        wb[i] = f32_to_bf16(wf[i]);
        wf[i] = bf16_to_f32(wb[i]);
    }
    LinearWeight w{DType::kBF16, wb.data(), N, K, nullptr};
    Tensor y = Tensor::zeros({M, N}, DType::kF32);
    fanout::testing::poison(y);
    linear(x, w, y, Fp8Mode::kDequant, Stream{&pool});
    const auto ref = reference_linear(x, wf, N);
    EXPECT_LT(rel_error(y.data_as<float>(), ref.data(), ref.size()), 1e-5);
}

TEST_P(LinearShapes, Fp8DequantExactAndW8A8Close) {
    const auto [M, N, K] = GetParam();
    ThreadPool pool(2);
    Tensor x = random_tensor({M, K}, 3);
    std::vector<float> wf = random_floats(size_t(N) * K, 4, 0.05f);
    std::vector<uint8_t> q(wf.size());
    std::vector<float> scale(size_t(ceil_div(N, kFp8Block) * ceil_div(K, kFp8Block)));
    weight_quant_block(wf.data(), N, K, q.data(), scale.data());
    std::vector<float> deq(wf.size());
    for (int64_t n = 0; n < N; ++n) weight_dequant_row(q.data(), scale.data(), N, K, n, deq.data() + n * K);
    // Block quantization keeps each weight within half an fp8 step of its block's scale.
    EXPECT_LT(rel_error(deq.data(), wf.data(), wf.size()), 0.05);
    LinearWeight w{DType::kFP8E4M3, q.data(), N, K, scale.data()};
    Tensor y = Tensor::zeros({M, N}, DType::kF32), y8 = Tensor::zeros({M, N}, DType::kF32);
    fanout::testing::poison(y);
    fanout::testing::poison(y8);
    linear(x, w, y, Fp8Mode::kDequant, Stream{&pool});
    linear(x, w, y8, Fp8Mode::kW8A8, Stream{&pool});
    const auto ref = reference_linear(x, deq, N);
    EXPECT_LT(rel_error(y.data_as<float>(), ref.data(), ref.size()), 1e-5);
    // Quantizing activations to e4m3 (3 mantissa bits) costs a few percent at most.
    const double e = rel_error(y8.data_as<float>(), ref.data(), ref.size());
    std::printf("[%d x %d x %d] w8a8 vs dequantized relative error %.4f\n", M, N, K, e);
    if (K > 1) {
        EXPECT_GT(e, 0.0) << "w8a8 must actually quantize the activations";
    }
    EXPECT_LT(e, 0.06) << "w8a8 vs dequantized";
}

INSTANTIATE_TEST_SUITE_P(OddShapes, LinearShapes,
                         ::testing::Values(std::make_tuple(1, 1, 1), std::make_tuple(3, 130, 257),
                                           std::make_tuple(17, 200, 128), std::make_tuple(5, 576, 300),
                                           std::make_tuple(64, 33, 129)));

TEST(ActQuant, ScalesAndValuesFollowDeepSeek) {
    const int64_t M = 3, K = 300;
    Tensor x = random_tensor({M, K}, 5, 7.0f);
    x.data_as<float>()[K + 5] = 0.0f;
    for (int64_t k = 256; k < K; ++k) x.data_as<float>()[2 * K + k] = 0.0f;  // an all-zero partial block
    Tensor q = Tensor::zeros({M, K}, DType::kFP8E4M3), s = Tensor::zeros({M, 3}, DType::kF32);
    act_quant(x, q, s, Stream{});
    for (int64_t m = 0; m < M; ++m)
        for (int64_t b = 0; b < 3; ++b) {
            float amax = 0;
            for (int64_t k = b * 128; k < std::min<int64_t>(K, (b + 1) * 128); ++k)
                amax = std::max(amax, std::fabs(x.data_as<float>()[m * K + k]));
            EXPECT_FLOAT_EQ(s.data_as<float>()[m * 3 + b], std::max(amax, kActQuantMinAmax) / 448.0f);
        }
    for (int64_t i = 0; i < M * K; ++i) {
        const float deq = fp8e4m3_to_f32(q.data_as<uint8_t>()[i]) * s.data_as<float>()[(i / K) * 3 + (i % K) / 128];
        EXPECT_NEAR(deq, x.data_as<float>()[i], std::fabs(x.data_as<float>()[i]) * 0.0625 + 1e-6) << i;
    }
}

TEST(Linear, RejectsMismatchedShapes) {
    std::vector<uint16_t> wb(12);
    LinearWeight w{DType::kBF16, wb.data(), 3, 4, nullptr};
    Tensor x = Tensor::zeros({2, 5}, DType::kF32), y = Tensor::zeros({2, 3}, DType::kF32);
    EXPECT_THROW(linear(x, w, y, Fp8Mode::kDequant, Stream{}), Error);
    LinearWeight f8{DType::kFP8E4M3, wb.data(), 3, 4, nullptr};
    Tensor x4 = Tensor::zeros({2, 4}, DType::kF32);
    EXPECT_THROW(linear(x4, f8, y, Fp8Mode::kDequant, Stream{}), Error);
}

}  // namespace
}  // namespace fanout::ops

namespace fanout::ops {
namespace {

// gemm_fp8_cpu against a double-precision evaluation of the same block-scaled sum.
TEST(GemmFp8, MatchesBlockScaledSumOnOddShapes) {
    for (auto [M, N, K] : {std::tuple{1, 1, 1}, {7, 130, 200}, {33, 257, 384}, {5, 64, 129}}) {
        const int64_t nbk = ceil_div(K, 128);
        std::vector<uint8_t> x(size_t(M * K)), w(size_t(N * K));
        const auto xf = fanout::testing::random_floats(x.size(), 31, 400.0f), wf = fanout::testing::random_floats(w.size(), 32, 400.0f);
        for (size_t i = 0; i < x.size(); ++i) x[i] = f32_to_fp8e4m3(xf[i]);
        for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_fp8e4m3(wf[i]);
        const auto sx = fanout::testing::random_floats(size_t(M * nbk), 33, 0.01f), sw = fanout::testing::random_floats(size_t(ceil_div(N, 128) * nbk), 34, 0.01f);
        std::vector<float> y(size_t(M * N), NAN);
        ThreadPool pool(2);
        gemm_fp8_cpu(x.data(), sx.data(), w.data(), sw.data(), y.data(), M, N, K, Stream{&pool});
        std::vector<float> ref(y.size());
        for (int m = 0; m < M; ++m)
            for (int n = 0; n < N; ++n) {
                double acc = 0;
                for (int k = 0; k < K; ++k)
                    acc += double(fp8e4m3_to_f32(x[m * K + k])) * fp8e4m3_to_f32(w[n * K + k]) * sx[m * nbk + k / 128] *
                           sw[(n / 128) * nbk + k / 128];
                ref[m * N + n] = float(acc);
            }
        EXPECT_LT(fanout::testing::rel_error(y.data(), ref.data(), y.size()), 1e-5) << M << "x" << N << "x" << K;
    }
}

}  // namespace
}  // namespace fanout::ops

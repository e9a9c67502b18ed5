// Grouped GEMM references (contiguous and masked layouts) and the fused activation+quant, against
// per-expert linear / silu_mul / act_quant, with empty experts and untouched padding rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "fanout/ops/activation.h"
#include "fanout/ops/fp8_quant.h"
#include "fanout/ops/grouped_gemm.h"
#include "test_util.h"

namespace fanout::ops {
namespace {

struct Experts {  // E fp8 (or bf16) weights [N, K] and their storage
    std::vector<std::vector<uint8_t>> q;
    std::vector<std::vector<float>> scale;
    std::vector<std::vector<uint16_t>> bf;
    std::vector<LinearWeight> w;
};

Experts make_experts(int E, int64_t N, int64_t K, bool fp8, uint64_t seed) {
    Experts x;
    for (int e = 0; e < E; ++e) {
        const auto v = fanout::testing::random_floats(size_t(N * K), seed + e, 0.1f);
        if (fp8) {
            x.q.emplace_back(v.size());
            x.scale.emplace_back(size_t(ceil_div(N, 128) * ceil_div(K, 128)));
            weight_quant_block(v.data(), N, K, x.q.back().data(), x.scale.back().data());
        } else {
            x.bf.emplace_back(v.size());
            for (size_t i = 0; i < v.size(); ++i) x.bf.back()[i] = f32_to_bf16(v[i]);
        }
    }
    for (int e = 0; e < E; ++e)
        x.w.push_back(fp8 ? LinearWeight{DType::kFP8E4M3, x.q[e].data(), N, K, x.scale[e].data()}
                          : LinearWeight{DType::kBF16, x.bf[e].data(), N, K, nullptr});
    return x;
}

TEST(GroupedGemm, ContiguousEqualsPerExpertLinear) {
    ThreadPool pool(2);
    for (const bool fp8 : {false, true}) {
        for (const Fp8Mode mode : {Fp8Mode::kDequant, Fp8Mode::kW8A8}) {
            const int E = 5;
            const int64_t N = 130, K = 200;
            const std::vector<int64_t> offsets = {0, 3, 3, 10, 11, 40};  // expert 1 is empty
            Experts ex = make_experts(E, N, K, fp8, 7);
            Tensor x = fanout::testing::random_tensor({offsets[E], K}, 8), y = Tensor::zeros({offsets[E], N}, DType::kF32);
            fanout::testing::poison(y);
            grouped_linear_contiguous(x, ex.w, offsets, y, mode, Stream{&pool});
            for (int e = 0; e < E; ++e) {
                if (offsets[e + 1] == offsets[e]) continue;
                Tensor ref = Tensor::zeros({offsets[e + 1] - offsets[e], N}, DType::kF32);
                linear(x.slice_rows(offsets[e], offsets[e + 1]), ex.w[e], ref, mode, Stream{});
                EXPECT_EQ(fanout::testing::max_abs_diff(y.data_as<float>() + offsets[e] * N, ref.data_as<float>(),
                                                        size_t(ref.numel())), 0.0)
                    << "expert " << e << (fp8 ? " fp8" : " bf16");
            }
        }
    }
}

TEST(GroupedGemm, MaskedComputesOnlyTheCountedRows) {
    const int E = 4;
    const int64_t max_m = 9, N = 257, K = 130;
    const std::vector<int32_t> counts = {9, 0, 1, 5};
    Experts ex = make_experts(E, N, K, true, 11);
    Tensor x = fanout::testing::random_tensor({E, max_m, K}, 12), y = Tensor::zeros({E, max_m, N}, DType::kF32);
    fanout::testing::poison(y);
    grouped_linear_masked(x, ex.w, counts, y, Fp8Mode::kW8A8, Stream{});
    for (int e = 0; e < E; ++e) {
        for (int64_t m = 0; m < max_m; ++m) {
            const float* row = y.data_as<float>() + (e * max_m + m) * N;
            if (m >= counts[e]) {
                EXPECT_TRUE(std::isnan(row[0]) && std::isnan(row[N - 1])) << "padding row " << e << "," << m << " written";
                continue;
            }
            Tensor ref = Tensor::zeros({1, N}, DType::kF32);
            linear(x.reshape({E * max_m, K}).slice_rows(e * max_m + m, e * max_m + m + 1), ex.w[e], ref, Fp8Mode::kW8A8,
                   Stream{});
            EXPECT_EQ(fanout::testing::max_abs_diff(row, ref.data_as<float>(), size_t(N)), 0.0);
        }
    }
    const std::vector<int32_t> bad = {10, 0, 0, 0};
    EXPECT_THROW(grouped_linear_masked(x, ex.w, bad, y, Fp8Mode::kW8A8, Stream{}), Error);
}

TEST(GroupedGemm, SiluMulQuantEqualsItsParts) {
    const int64_t E = 3, max_m = 5, I = 300;  // 3 scale blocks, the last partial
    const std::vector<int32_t> counts = {5, 2, 0};
    Tensor gu = fanout::testing::random_tensor({E, max_m, 2 * I}, 13, 4.0f);
    Tensor q = Tensor::zeros({E, max_m, I}, DType::kFP8E4M3), sc = Tensor::zeros({E, max_m, 3}, DType::kF32);
    std::memset(q.data(), 0x7f, size_t(q.nbytes()));  // NaN codes: unwritten rows stay NaN
    fanout::testing::poison(sc);
    ThreadPool pool(2);
    silu_mul_quant_masked(gu, counts, q, sc, Stream{&pool});
    for (int64_t e = 0; e < E; ++e)
        for (int64_t m = 0; m < max_m; ++m) {
            const int64_t r = e * max_m + m;
            if (m >= counts[e]) {
                EXPECT_TRUE(std::isnan(sc.data_as<float>()[r * 3])) << "padding row written";
                EXPECT_EQ(q.data_as<uint8_t>()[r * I], 0x7f);
                continue;
            }
            Tensor g = Tensor::zeros({1, I}, DType::kF32), u = Tensor::zeros({1, I}, DType::kF32);
            std::memcpy(g.data(), gu.data_as<float>() + r * 2 * I, size_t(I) * 4);
            std::memcpy(u.data(), gu.data_as<float>() + r * 2 * I + I, size_t(I) * 4);
            silu_mul(g, u, g, Stream{});
            Tensor rq = Tensor::zeros({1, I}, DType::kFP8E4M3), rs = Tensor::zeros({1, 3}, DType::kF32);
            act_quant(g, rq, rs, Stream{});
            EXPECT_EQ(std::memcmp(rq.data(), q.data_as<uint8_t>() + r * I, size_t(I)), 0) << "row " << r;
            EXPECT_EQ(std::memcmp(rs.data(), sc.data_as<float>() + r * 3, 12), 0) << "row " << r;
        }
}

}  // namespace
}  // namespace fanout::ops

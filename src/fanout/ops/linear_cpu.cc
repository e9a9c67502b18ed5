#include <algorithm>
#include <vector>

#include "fanout/ops/cpu_util.h"
#include "fanout/ops/fp8_quant.h"
#include "fanout/ops/gemm.h"
#include "fanout/ops/linear.h"

namespace fanout::ops {

void LinearWeight::row_f32(int64_t n, float* out) const {
    const size_t offset = static_cast<size_t>(n) * static_cast<size_t>(in_features);
    if (dtype == DType::kFP8E4M3) {
        weight_dequant_row(static_cast<const uint8_t*>(data), scale_inv, out_features, in_features, n, out);
        return;
    }
    convert_to_f32(static_cast<const char*>(data) + offset * dtype_size(dtype), dtype,
                   static_cast<size_t>(in_features), out);
}

namespace {

// Rows of W are converted once and dotted with every row of x: W streams through once.
void linear_f32(const float* x, const LinearWeight& w, float* y, int64_t M, const Stream& s) {
    const int64_t N = w.out_features, K = w.in_features;
    parallel_for(s, N, 16, [&](int64_t n0, int64_t n1) {
        std::vector<float> row(static_cast<size_t>(K));
        for (int64_t n = n0; n < n1; ++n) {
            w.row_f32(n, row.data());
            int64_t m = 0;
            for (float out[4]; m + 4 <= M; m += 4) {
                cpu::dot4(x + m * K, K, row.data(), K, out);
                for (int r = 0; r < 4; ++r) y[(m + r) * N + n] = out[r];
            }
            for (; m < M; ++m) y[m * N + n] = cpu::dot(x + m * K, row.data(), K);
        }
    });
}

// DeepSeek's w8a8: x quantized per 1×128 block, then the block-scaled FP8 GEMM.
void linear_w8a8(const Tensor& x, const LinearWeight& w, float* y, int64_t M, const Stream& s) {
    const int64_t K = w.in_features, nbk = ceil_div(K, kFp8Block);
    Tensor xq = Tensor::zeros({M, K}, DType::kFP8E4M3);
    Tensor xs = Tensor::zeros({M, nbk}, DType::kF32);
    act_quant(x, xq, xs, s);
    gemm_fp8_cpu(xq.data_as<uint8_t>(), xs.data_as<float>(), static_cast<const uint8_t*>(w.data), w.scale_inv, y, M,
                 w.out_features, K, s);
}

}  // namespace

void linear(const Tensor& x, const LinearWeight& w, Tensor& y, Fp8Mode mode, const Stream& s) {
    check_tensor(x, "linear x", DType::kF32, {-1, w.in_features});
    const int64_t M = x.dim(0);
    check_tensor(y, "linear y", DType::kF32, {M, w.out_features});
    FANOUT_CHECK(w.data != nullptr || w.out_features * w.in_features == 0, "linear: weight has no data");
    FANOUT_CHECK(w.dtype != DType::kFP8E4M3 || w.scale_inv != nullptr, "linear: fp8 weight without scale_inv");
    if (M == 0) return;
    if (w.dtype == DType::kFP8E4M3 && mode == Fp8Mode::kW8A8) linear_w8a8(x, w, y.data_as<float>(), M, s);
    else linear_f32(x.data_as<float>(), w, y.data_as<float>(), M, s);
}

}  // namespace fanout::ops

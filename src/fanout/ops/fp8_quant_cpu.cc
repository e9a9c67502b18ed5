#include <algorithm>
#include <cmath>

#include "fanout/ops/fp8_quant.h"

namespace fanout::ops {

void act_quant(const Tensor& x, Tensor& q, Tensor& scales, const Stream& s) {
    check_tensor(x, "act_quant x", DType::kF32, {-1, -1});
    const int64_t M = x.dim(0), K = x.dim(1), nb = ceil_div(K, kFp8Block);
    check_tensor(q, "act_quant q", DType::kFP8E4M3, {M, K});
    check_tensor(scales, "act_quant scales", DType::kF32, {M, nb});
    const float* xp = x.data_as<float>();
    uint8_t* qp = q.data_as<uint8_t>();
    float* sp = scales.data_as<float>();
    parallel_for(s, M * nb, 64, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            const int64_t m = i / nb, b = i % nb;
            const int64_t k0 = b * kFp8Block, k1 = std::min(K, k0 + kFp8Block);
            const float* row = xp + m * K;
            float amax = 0.0f;
            for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(row[k]));
            const float scale = std::max(amax, kActQuantMinAmax) / kFp8E4M3Max;
            sp[m * nb + b] = scale;
            for (int64_t k = k0; k < k1; ++k) qp[m * K + k] = f32_to_fp8e4m3(row[k] / scale);
        }
    });
}

void weight_quant_block(const float* w, int64_t N, int64_t K, uint8_t* q, float* scale_inv) {
    const int64_t nbn = ceil_div(N, kFp8Block), nbk = ceil_div(K, kFp8Block);
    for (int64_t bn = 0; bn < nbn; ++bn) {
        for (int64_t bk = 0; bk < nbk; ++bk) {
            const int64_t n0 = bn * kFp8Block, n1 = std::min(N, n0 + kFp8Block);
            const int64_t k0 = bk * kFp8Block, k1 = std::min(K, k0 + kFp8Block);
            float amax = 0.0f;
            for (int64_t n = n0; n < n1; ++n)
                for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(w[n * K + k]));
            const float scale = amax > 0.0f ? amax / kFp8E4M3Max : 1.0f;
            scale_inv[bn * nbk + bk] = scale;
            for (int64_t n = n0; n < n1; ++n)
                for (int64_t k = k0; k < k1; ++k) q[n * K + k] = f32_to_fp8e4m3(w[n * K + k] / scale);
        }
    }
}

void weight_dequant_row(const uint8_t* q, const float* scale_inv, int64_t N, int64_t K, int64_t n, float* out) {
    const int64_t nbk = ceil_div(K, kFp8Block);
    const float* srow = scale_inv + (n / kFp8Block) * nbk;
    convert_to_f32(q + n * K, DType::kFP8E4M3, static_cast<size_t>(K), out);
    for (int64_t b = 0; b * kFp8Block < K; ++b) {
        const float scale = srow[b];
        for (int64_t k = b * kFp8Block; k < std::min(K, (b + 1) * kFp8Block); ++k) out[k] *= scale;
    }
}

}  // namespace fanout::ops

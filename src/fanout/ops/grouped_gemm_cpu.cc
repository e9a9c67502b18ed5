#include <algorithm>
#include <cmath>
#include <vector>

#include "fanout/ops/cpu_util.h"
#include "fanout/ops/fp8_quant.h"
#include "fanout/ops/grouped_gemm.h"

namespace fanout::ops {

void grouped_linear_contiguous(const Tensor& x, std::span<const LinearWeight> weights,
                               std::span<const int64_t> offsets, Tensor& y, Fp8Mode mode, const Stream& s) {
    const int64_t E = static_cast<int64_t>(weights.size());
    FANOUT_CHECK(static_cast<int64_t>(offsets.size()) == E + 1 && offsets[0] == 0,
                 "grouped_linear_contiguous: {} offsets for {} experts (need E + 1, starting at 0)", offsets.size(), E);
    for (int64_t e = 0; e < E; ++e)
        FANOUT_CHECK(offsets[e] <= offsets[e + 1], "grouped_linear_contiguous: offsets[{}] = {} > offsets[{}] = {}", e,
                     offsets[e], e + 1, offsets[e + 1]);
    check_tensor(x, "grouped x", DType::kF32, {offsets[E], -1});
    for (int64_t e = 0; e < E; ++e) {
        if (offsets[e + 1] == offsets[e]) continue;  // an empty expert costs nothing
        Tensor xe = x.slice_rows(offsets[e], offsets[e + 1]);
        Tensor ye = y.slice_rows(offsets[e], offsets[e + 1]);
        linear(xe, weights[e], ye, mode, s);
    }
}

void grouped_linear_masked(const Tensor& x, std::span<const LinearWeight> weights, std::span<const int32_t> counts,
                           Tensor& y, Fp8Mode mode, const Stream& s) {
    const int64_t E = static_cast<int64_t>(weights.size());
    check_tensor(x, "grouped x", DType::kF32, {E, -1, -1});
    const int64_t max_m = x.dim(1), K = x.dim(2);
    FANOUT_CHECK(static_cast<int64_t>(counts.size()) == E, "grouped_linear_masked: {} counts for {} experts",
                 counts.size(), E);
    const int64_t N = E > 0 ? weights[0].out_features : 0;
    check_tensor(y, "grouped y", DType::kF32, {E, max_m, N});
    for (int64_t e = 0; e < E; ++e) {
        FANOUT_CHECK(counts[e] >= 0 && counts[e] <= max_m, "grouped_linear_masked: counts[{}] = {} outside [0, {}]", e,
                     counts[e], max_m);
        if (counts[e] == 0) continue;
        Tensor xe = x.reshape({E * max_m, K}).slice_rows(e * max_m, e * max_m + counts[e]);
        Tensor ye = y.reshape({E * max_m, N}).slice_rows(e * max_m, e * max_m + counts[e]);
        linear(xe, weights[e], ye, mode, s);
    }
}

void silu_mul_quant_masked(const Tensor& gate_up, std::span<const int32_t> counts, Tensor& q, Tensor& scales,
                           const Stream& s) {
    check_tensor(gate_up, "silu_mul_quant gate_up", DType::kF32, {-1, -1, -1});
    const int64_t E = gate_up.dim(0), max_m = gate_up.dim(1), I = gate_up.dim(2) / 2, nb = ceil_div(I, kFp8Block);
    FANOUT_CHECK(gate_up.dim(2) % 2 == 0, "silu_mul_quant: gate_up width {} must be even (gate, then up)",
                 gate_up.dim(2));
    FANOUT_CHECK(static_cast<int64_t>(counts.size()) == E, "silu_mul_quant: {} counts for {} experts", counts.size(), E);
    check_tensor(q, "silu_mul_quant q", DType::kFP8E4M3, {E, max_m, I});
    check_tensor(scales, "silu_mul_quant scales", DType::kF32, {E, max_m, nb});
    const float* gu = gate_up.data_as<float>();
    uint8_t* qp = q.data_as<uint8_t>();
    float* sp = scales.data_as<float>();
    for (int64_t e = 0; e < E; ++e)
        FANOUT_CHECK(counts[e] >= 0 && counts[e] <= max_m, "silu_mul_quant: counts[{}] = {} outside [0, {}]", e,
                     counts[e], max_m);
    parallel_for(s, E * max_m, 8, [&](int64_t r0, int64_t r1) {
        std::vector<float> h(static_cast<size_t>(I));
        for (int64_t r = r0; r < r1; ++r) {
            if (r % max_m >= counts[r / max_m]) continue;
            const float* row = gu + r * 2 * I;
            for (int64_t i = 0; i < I; ++i) h[i] = cpu::silu(row[i]) * row[I + i];
            for (int64_t b = 0; b < nb; ++b) {
                const int64_t k0 = b * kFp8Block, k1 = std::min(I, k0 + kFp8Block);
                float amax = 0.0f;
                for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(h[k]));
                const float scale = std::max(amax, kActQuantMinAmax) / kFp8E4M3Max;
                sp[r * nb + b] = scale;
                for (int64_t k = k0; k < k1; ++k) qp[r * I + k] = f32_to_fp8e4m3(h[k] / scale);
            }
        }
    });
}

}  // namespace fanout::ops

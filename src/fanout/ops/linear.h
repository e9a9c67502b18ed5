// linear: y = x · Wᵀ for the model's projections, over bf16 / f16 / f32 or fp8 block-quantized W.
//
// fp8 weights run two ways. kDequant: W is dequantized (fp8 × its 128×128 block scale) and the
// product is computed in f32 — the exact reference. kW8A8: x is quantized on the fly per 1×128
// block (act_quant) and each 128-wide block of the dot product is scaled by the activation and
// weight scales, as DeepSeek's fp8_gemm does; this is what the GPU GEMMs compute.
#pragma once

#include <cstdint>

#include "fanout/core/tensor.h"
#include "fanout/core/thread_pool.h"

namespace fanout::ops {

enum class Fp8Mode { kDequant, kW8A8 };

// W: [out_features, in_features], row-major, in the checkpoint's dtype.
struct LinearWeight {
    DType dtype = DType::kBF16;
    const void* data = nullptr;
    int64_t out_features = 0;
    int64_t in_features = 0;
    const float* scale_inv = nullptr;  // fp8 only: [ceil(out/128), ceil(in/128)]

    // Row n as f32 (dequantized for fp8) into out[in_features].
    void row_f32(int64_t n, float* out) const;
};

// x: [M, in] f32 -> y: [M, out] f32.
void linear(const Tensor& x, const LinearWeight& w, Tensor& y, Fp8Mode mode, const Stream& s);

}  // namespace fanout::ops

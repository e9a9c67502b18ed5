// FP8 e4m3 block quantization, as in DeepSeek-V3.
//
// Activations: per 1×128 block of a row, scale = max(amax, 1e-4) / 448 and q = fp8(x / scale)
// (DeepSeek's act_quant; the last block of a row may be partial). Weights: per 128×128 block,
// `weight_scale_inv` = amax / 448 and w ≈ fp8 * scale_inv (partial blocks at the right and bottom
// edges exist: kv_a_proj has 576 rows).
#pragma once

#include <cstdint>

#include "fanout/core/tensor.h"
#include "fanout/core/thread_pool.h"
#include "fanout/ops/fp8_constants.h"

namespace fanout::ops {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// x: [M, K] f32 -> q: [M, K] fp8 e4m3, scales: [M, ceil(K/128)] f32.
void act_quant(const Tensor& x, Tensor& q, Tensor& scales, const Stream& s);

// w: [N, K] f32 -> q: [N, K] fp8, scale_inv: [ceil(N/128), ceil(K/128)] f32 (an all-zero block gets 1).
void weight_quant_block(const float* w, int64_t N, int64_t K, uint8_t* q, float* scale_inv);

// Row n of a block-quantized weight, dequantized: out[k] = fp8(q[n, k]) * scale_inv[n/128, k/128].
void weight_dequant_row(const uint8_t* q, const float* scale_inv, int64_t N, int64_t K, int64_t n, float* out);

#ifdef FANOUT_WITH_CUDA
// The same as act_quant on the device. x: [M, K] f32; q: [M, K] fp8; scales: [M, ceil(K/128)] f32.
void launch_act_quant(const float* x, uint8_t* q, float* scales, int M, int K, void* cuda_stream);
// The same from bf16 activations (uint16_t storage), the scales in either order (fp8_constants.h:
// [M, ceil(K/128)] or M-major [ceil(K/128), M]): the quantization in front of an FP8 GEMM.
void launch_act_quant_bf16(const uint16_t* x, uint8_t* q, float* scales, ScaleOrder order, int M, int K,
                           void* cuda_stream);
// Activation scales [M, nb] (act_quant's layout) into the M-major [nb, M] that cuBLASLt's
// VEC128 scales take (gemm_fp8_cublaslt.cc); with M and nb swapped, M-major scales back to
// row-major, for the tile kernel.
void launch_transpose_scales(const float* scales, float* out, int M, int nb, void* cuda_stream);
#endif

}  // namespace fanout::ops

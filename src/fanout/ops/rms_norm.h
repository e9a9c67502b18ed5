// rms_norm: out[m] = x[m] / sqrt(mean(x[m]²) + eps) * w.
#pragma once

#include "fanout/core/tensor.h"
#include "fanout/core/thread_pool.h"
#include "fanout/ops/fp8_constants.h"

namespace fanout::ops {

// x: [M, D] f32; w: [D] f32; out: [M, D] f32 (may alias x).
void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out, const Stream& s);

#ifdef FANOUT_WITH_CUDA
// x, out: [M, D] f32 (may alias); w: [D] f32.
void launch_rms_norm(const float* x, const float* w, float eps, float* out, int M, int D, void* cuda_stream);

// The layer's pre-norm on bf16 activations (uint16_t storage), fused with the residual add: with
// `residual`, z = x + residual (f32) is stored back to residual as bf16 and y = z / rms(z) · w;
// without, y = x / rms(x) · w. x, residual, y: [M, D]; w: [D] f32; y may alias x (same strides);
// residual aliases neither.
void launch_rms_norm_bf16(const uint16_t* x, uint16_t* residual, const float* w, float eps, uint16_t* y, int M, int D,
                          void* cuda_stream);
// The same over rows `x_stride` / `y_stride` elements apart (a slice of a wider GEMM output); the
// residual, when given, is [M, D] contiguous.
void launch_rms_norm_bf16_strided(const uint16_t* x, int64_t x_stride, uint16_t* residual, const float* w, float eps,
                                  uint16_t* y, int64_t y_stride, int M, int D, void* cuda_stream);
// The same, and y also quantized for an FP8 GEMM as act_quant would (q [M, D] e4m3, scales
// [M, ceil(D/128)] or M-major [ceil(D/128), M] by `order`, fp8_constants.h): the norm in front of
// a projection in one kernel. y may be null when only the quantized rows are wanted (the same q
// and scales, no bf16 rows written). `row_scales`, when given, receives the scales once more,
// row-major: the post norm of an MoE layer feeds both the shared experts' dense GEMM (in its
// order) and the routed experts (whose tokens carry row-major scales).
void launch_rms_norm_quant_bf16(const uint16_t* x, int64_t x_stride, uint16_t* residual, const float* w, float eps,
                                uint16_t* y, int64_t y_stride, uint8_t* q, float* scales, ScaleOrder order, int M,
                                int D, void* cuda_stream, float* row_scales = nullptr);
#endif

}  // namespace fanout::ops

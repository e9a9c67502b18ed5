// Grouped GEMM for MoE experts: many small `linear`s, one per expert, in the two layouts
// DeepGEMM defines (and the GPU kernels of issue 5 will implement; these are their references).
//
// * contiguous (prefill): x holds the rows of all experts back to back, expert e owning rows
//   [offsets[e], offsets[e+1]); y = x · W[e]ᵀ row by row.
// * masked (decode, CUDA-graph friendly): x is [E, max_m, K] and only the first counts[e] rows of
//   expert e are real; rows past the count are left untouched in y.
// Numerics are linear()'s: bf16/f32 weights in f32, fp8 weights dequantized or w8a8.
// The FP8 GPU kernels of both layouts are declared in grouped_gemm_cuda.h.
#pragma once

#include <cstdint>
#include <span>

#include "fanout/core/tensor.h"
#include "fanout/core/thread_pool.h"
#include "fanout/ops/linear.h"

namespace fanout::ops {

// x: [offsets[E], K] f32; y: [offsets[E], N] f32; weights[e]: [N, K]; offsets: [E + 1], ascending.
void grouped_linear_contiguous(const Tensor& x, std::span<const LinearWeight> weights, std::span<const int64_t> offsets,
                               Tensor& y, Fp8Mode mode, const Stream& s);

// x: [E, max_m, K] f32; y: [E, max_m, N] f32; counts: [E], each in [0, max_m].
void grouped_linear_masked(const Tensor& x, std::span<const LinearWeight> weights, std::span<const int32_t> counts,
                           Tensor& y, Fp8Mode mode, const Stream& s);

// The experts' activation, fused with the next GEMM's input quantization (masked layout):
// h = silu(gate) * up, then per 1×128 block scale = max(amax, 1e-4)/448 and q = fp8(h / scale).
// gate_up: [E, max_m, 2I] f32 (gate in the first I columns, up in the next I); q: [E, max_m, I] fp8;
// scales: [E, max_m, ceil(I/128)] f32. Rows past counts[e] are left untouched.
void silu_mul_quant_masked(const Tensor& gate_up, std::span<const int32_t> counts, Tensor& q, Tensor& scales,
                           const Stream& s);

}  // namespace fanout::ops

// Grouped GEMM for MoE experts on the GPU: the FP8 kernels of the contiguous and masked layouts
// (grouped_gemm.h has the layouts' CPU references) and the fused expert activation. fmt-free,
// so CUDA translation units can include it.
#pragma once

#include <cstdint>

#include "fanout/ops/fp8_constants.h"
#include "fanout/ops/gemm.h"

namespace fanout::ops {

#ifdef FANOUT_WITH_CUDA
// The FP8 kernels of the two layouts on the device (gemm_fp8's numerics, bf16 out), the
// weights of all experts stacked: w [E, N, K] e4m3, sw [E, ceil(N/128), ceil(K/128)].
//
// Contiguous: x [rows, K] with rows a multiple of 128 and block_expert[rows / 128] on the device
// naming the expert of each 128-row block (-1: padding, skipped). y [rows, N]. The default tile is
// 128 × 256 in cluster pairs.
void launch_grouped_gemm_fp8_contiguous(const uint8_t* x, const float* sx, int rows, const int32_t* block_expert,
                                        const uint8_t* w, const float* sw, int num_experts, int N, int K, uint16_t* y,
                                        void* cuda_stream, GemmConfig cfg = {});

// Masked: x [E, max_m, K], counts[E] on the device (clamped to [0, max_m]); rows past a count are
// neither read into the result nor written. The grid does not depend on the counts, so the call
// can be captured once in a CUDA graph and replayed for any routing. `expected_m`, the tokens per
// expert the caller expects (batch · top-k / experts in the EP group), only picks the tile.
// With `workspace` (gemm.h; not shared with a GEMM running at the same time) the tiles of a last,
// partial wave may be split in K, up to cfg.splits ways (gemm_fp8_sm90.cu's split-K, unpaired or
// in cluster pairs); without one the default runs unsplit and a cfg with splits > 1 is an error.
void launch_grouped_gemm_fp8_masked(const uint8_t* x, const float* sx, const int32_t* counts, int num_experts,
                                    int max_m, const uint8_t* w, const float* sw, int N, int K, uint16_t* y,
                                    int expected_m, void* cuda_stream, GemmWorkspace* workspace = nullptr,
                                    GemmConfig cfg = {});

// silu_mul_quant_masked on the device, reading bf16 gate_up [E, max_m, 2I] (the grouped GEMM's
// output) and the counts on the device: q [E, max_m, I] e4m3, scales [E, max_m, ceil(I/128)] —
// or, for one group (E = 1: the shared experts' MLP, whose down projection is a dense GEMM), in
// `order` kMMajor [ceil(I/128), max_m] (fp8_constants.h). `max_rows` > 0: a bound on the rows the
// counts name (Σ min(count, max_m)), known to the caller (an EP receive: every rank's choices); if it
// is below E · max_m, the grid has that many rows instead of one per slot, each block finding its
// expert from a prefix over the counts — an EP receive's max_m is world · max tokens, and a grid of
// every slot cost 83 µs at world 1 and 256 experts (PERF.md, 2026-12-03). Rows past the bound
// are not done.
void launch_silu_mul_quant_masked(const uint16_t* gate_up, const int32_t* counts, int num_experts, int max_m, int I,
                                  uint8_t* q, float* scales, ScaleOrder order, void* cuda_stream, int64_t max_rows = 0);

// The same over the contiguous layout: gate_up [rows, 2I] bf16 with rows a multiple of 128 and
// block_expert[rows / 128] on the device; q [rows, I] e4m3, scales [rows, ceil(I/128)]. Rows of a
// -1 block are skipped (left as they were); every row of another block is done (padding rows
// too: they only ever reach padding rows downstream).
void launch_silu_mul_quant_contiguous(const uint16_t* gate_up, const int32_t* block_expert, int rows, int I, uint8_t* q,
                                      float* scales, void* cuda_stream);
#endif

}  // namespace fanout::ops

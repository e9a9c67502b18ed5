// The experts' activation on the device: silu(gate) · up, then 1×128 FP8 quantization, with the
// rows to do read on the device (so it runs under a CUDA graph): over the masked layout, the
// per-expert counts; over the contiguous layout, the 128-row blocks' experts (-1: skipped).
// A block per 2,048 columns of a row slot of the masked layout, of 4 rows of the contiguous one
// (a row of 18,432 columns, a dense layer's, spreads over 9 blocks); rows with nothing to do
// return at once. Each thread takes 8 adjacent columns (16-byte loads of gate and up when I
// allows), 16 threads make one 128-column scale block and reduce its amax by shuffles among them
// (a group is wholly in or out of a pass, so the shuffles name only its own 16 lanes). The kernel is
// issue-bound (Nsight Compute), so silu takes the fast exponential and division and the values are
// multiplied by the scale's reciprocal: a few ulp from the CPU's exact rule before the e4m3
// rounding, which can move a value by one e4m3 step (what the tests allow).
// Only fmt-free headers here.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <string>

#include "fanout/core/block_scan.cuh"
#include "fanout/core/cuda_check.h"
#include "fanout/core/search.cuh"
#include "fanout/ops/fp8_constants.h"
#include "fanout/ops/gemm.h"
#include "fanout/ops/grouped_gemm_cuda.h"
#include "fanout/ops/pdl.cuh"

namespace fanout::ops {
namespace {

constexpr int kThreads = 256, kPerThread = 8, kThreadsPerBlock128 = 128 / kPerThread;  // one pass over I = 2048
constexpr int kContiguousBlock = 128;                                                  // rows per block_expert entry
// Contiguous layout: rows per thread block, so an unused 128-row block costs 32 early exits, not
// 128 (measured on H200: a decode step's all-unused spill region 7 µs → 3 µs, prefill unchanged).
constexpr int kContiguousRows = 4;

// silu with the fast exponential and division (a few ulp; the value is rounded to e4m3 next).
__device__ __forceinline__ float silu(float x) { return __fdividef(x, 1.0f + __expf(-x)); }

// Row r of gate_up [rows, 2I] into q [rows, I] and its scales (strides `ss`: [rows, ceil(I/128)]
// or M-major): the columns of pass blockIdx.y (kThreads · 8 of them), by the whole block.
__device__ void silu_mul_quant_row(const __nv_bfloat16* __restrict__ gate_up, size_t r, int I, uint8_t* __restrict__ q,
                                   float* __restrict__ scales, ScaleStrides ss) {
    const __nv_bfloat16* g = gate_up + r * 2 * I;
    const int nb = (I + static_cast<int>(kFp8Block) - 1) / static_cast<int>(kFp8Block);
    const int c0 = (static_cast<int>(blockIdx.y) * kThreads + static_cast<int>(threadIdx.x)) * kPerThread;
    if (c0 >= nb * static_cast<int>(kFp8Block)) return;  // whole 128-column groups
    // The lanes of this thread's 128-column group.
    const unsigned group = 0xffffu << (threadIdx.x % 32 / kThreadsPerBlock128 * kThreadsPerBlock128);
    const bool vec = I % kPerThread == 0;
    float h[kPerThread];
    if (vec && c0 < I) {
        const uint4 gv = *reinterpret_cast<const uint4*>(g + c0), uv = *reinterpret_cast<const uint4*>(g + I + c0);
        const __nv_bfloat16* gp = reinterpret_cast<const __nv_bfloat16*>(&gv);
        const __nv_bfloat16* up = reinterpret_cast<const __nv_bfloat16*>(&uv);
#pragma unroll
        for (int i = 0; i < kPerThread; ++i) {
            const float x = __bfloat162float(gp[i]);
            h[i] = silu(x) * __bfloat162float(up[i]);
        }
    } else {
#pragma unroll
        for (int i = 0; i < kPerThread; ++i) {
            const int c = c0 + i;
            const float x = c < I ? __bfloat162float(g[c]) : 0.0f;
            h[i] = c < I ? silu(x) * __bfloat162float(g[I + c]) : 0.0f;
        }
    }
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) amax = fmaxf(amax, fabsf(h[i]));
#pragma unroll
    for (int o = kThreadsPerBlock128 / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(group, amax, o));
    const float clamped = fmaxf(amax, kActQuantMinAmax), scale = clamped / kFp8E4M3Max, inv = kFp8E4M3Max / clamped;
    if (threadIdx.x % kThreadsPerBlock128 == 0)
        scales[r * ss.row + c0 / static_cast<int>(kFp8Block) * ss.block] = scale;
    alignas(8) uint8_t out[kPerThread];
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) out[i] = __nv_cvt_float_to_fp8(h[i] * inv, __NV_SATFINITE, __NV_E4M3);
    uint8_t* dst = q + r * I + c0;
    if (vec && c0 < I) {
        *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(out);
    } else {
        for (int i = 0; i < kPerThread && c0 + i < I; ++i) dst[i] = out[i];
    }
}

constexpr int kMaxWalkExperts = 1024;

// A block per row slot (grid.x = E · max_m), or, with `walk` (grid.x = a bound on the rows the
// counts name), a block per stored row: the block finds its expert in a prefix over the counts.
__global__ void __launch_bounds__(kThreads)
    silu_mul_quant_masked_kernel(const __nv_bfloat16* __restrict__ gate_up, const int32_t* __restrict__ counts,
                                 int num_experts, int max_m, bool walk, int I, uint8_t* __restrict__ q,
                                 float* __restrict__ scales, ScaleStrides ss) {
    pdl_enter();
    if (!walk) {
        const int e = blockIdx.x / max_m, row = blockIdx.x % max_m;
        if (row >= min(max(counts[e], 0), max_m)) return;
        silu_mul_quant_row(gate_up, blockIdx.x, I, q, scales, ss);
        return;
    }
    __shared__ int first[kMaxWalkExperts + 1];  // first[e]: stored rows of the experts before e
    block_count_prefix<kThreads>(counts, num_experts, max_m, first);
    const int j = static_cast<int>(blockIdx.x);
    if (j >= first[num_experts]) return;
    const int e = segment_of(first, num_experts, j);
    silu_mul_quant_row(gate_up, static_cast<size_t>(e) * max_m + (j - first[e]), I, q, scales, ss);
}

__global__ void __launch_bounds__(kThreads)
    silu_mul_quant_contiguous_kernel(const __nv_bfloat16* __restrict__ gate_up,
                                     const int32_t* __restrict__ block_expert, int I, uint8_t* __restrict__ q,
                                     float* __restrict__ scales) {
    pdl_enter();
    const size_t r0 = static_cast<size_t>(blockIdx.x) * kContiguousRows;
    if (block_expert[r0 / kContiguousBlock] < 0) return;
    const ScaleStrides ss{(I + kFp8Block - 1) / kFp8Block, 1};
    for (int i = 0; i < kContiguousRows; ++i) silu_mul_quant_row(gate_up, r0 + i, I, q, scales, ss);
}

// Column passes of a row: kThreads · 8 columns each, a grid row apiece.
unsigned passes(int I) { return static_cast<unsigned>((I + kThreads * kPerThread - 1) / (kThreads * kPerThread)); }

}  // namespace

void launch_silu_mul_quant_masked(const uint16_t* gate_up, const int32_t* counts, int num_experts, int max_m, int I,
                                  uint8_t* q, float* scales, ScaleOrder order, void* cuda_stream, int64_t max_rows) {
    if (num_experts <= 0 || max_m <= 0 || I <= 0) return;
    FANOUT_DEVICE_REQUIRE(
        order == ScaleOrder::kRowMajor || num_experts == 1,
        "silu_mul_quant_masked: M-major scales for one group only, got " + std::to_string(num_experts));
    const int64_t slots = static_cast<int64_t>(num_experts) * max_m;
    const bool walk = max_rows > 0 && max_rows < slots;
    FANOUT_DEVICE_REQUIRE(!walk || num_experts <= kMaxWalkExperts, "silu_mul_quant_masked: a row bound with at most " +
                                                                       std::to_string(kMaxWalkExperts) +
                                                                       " experts, got " + std::to_string(num_experts));
    const int64_t blocks = walk ? max_rows : slots;
    FANOUT_DEVICE_REQUIRE(blocks < (int64_t{1} << 31), "silu_mul_quant_masked: experts × max_m exceeds the grid");
    const dim3 grid(static_cast<unsigned>(blocks), passes(I));
    launch_pdl(silu_mul_quant_masked_kernel, grid, kThreads, 0, static_cast<cudaStream_t>(cuda_stream),
               reinterpret_cast<const __nv_bfloat16*>(gate_up), counts, num_experts, max_m, walk, I, q, scales,
               scale_strides(order, max_m, (I + kFp8Block - 1) / kFp8Block));
}

void launch_silu_mul_quant_contiguous(const uint16_t* gate_up, const int32_t* block_expert, int rows, int I, uint8_t* q,
                                      float* scales, void* cuda_stream) {
    if (rows <= 0 || I <= 0) return;
    FANOUT_DEVICE_REQUIRE(rows % kContiguousBlock == 0,
                          "silu_mul_quant_contiguous: rows must be a multiple of 128, got " + std::to_string(rows));
    launch_pdl(silu_mul_quant_contiguous_kernel, dim3(rows / kContiguousRows, passes(I)), kThreads, 0,
               static_cast<cudaStream_t>(cuda_stream), reinterpret_cast<const __nv_bfloat16*>(gate_up), block_expert, I,
               q, scales);
}

}  // namespace fanout::ops

// The experts' activation on the device: silu(gate) · up, then 1×128 FP8 quantization, over the
// masked layout with the per-expert counts read on the device (so it runs under a CUDA graph).
// One block per (expert, row) slot; slots past the expert's count return at once. Each thread
// takes 8 adjacent columns (16-byte loads of gate and up when I allows), 16 threads make one
// 128-column scale block and reduce its amax by shuffles.
// Only fmt-free headers here.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "fanout/core/cuda_check.h"
#include "fanout/ops/fp8_constants.h"
#include "fanout/ops/gemm.h"
#include "fanout/ops/grouped_gemm_cuda.h"

namespace fanout::ops {
namespace {

constexpr int kThreads = 256, kPerThread = 8, kThreadsPerBlock128 = 128 / kPerThread;  // one pass over I = 2048

__global__ void __launch_bounds__(kThreads)
    silu_mul_quant_masked_kernel(const __nv_bfloat16* __restrict__ gate_up, const int32_t* __restrict__ counts,
                                 int max_m, int I, uint8_t* __restrict__ q, float* __restrict__ scales) {
    const int e = blockIdx.x / max_m, row = blockIdx.x % max_m;
    if (row >= min(max(counts[e], 0), max_m)) return;
    const size_t r = blockIdx.x;
    const __nv_bfloat16* g = gate_up + r * 2 * I;
    const int nb = (I + static_cast<int>(kFp8Block) - 1) / static_cast<int>(kFp8Block);
    const bool vec = I % kPerThread == 0;
    for (int c0 = threadIdx.x * kPerThread; c0 < nb * static_cast<int>(kFp8Block); c0 += kThreads * kPerThread) {
        float h[kPerThread];
        if (vec && c0 < I) {
            const uint4 gv = *reinterpret_cast<const uint4*>(g + c0), uv = *reinterpret_cast<const uint4*>(g + I + c0);
            const __nv_bfloat16* gp = reinterpret_cast<const __nv_bfloat16*>(&gv);
            const __nv_bfloat16* up = reinterpret_cast<const __nv_bfloat16*>(&uv);
#pragma unroll
            for (int i = 0; i < kPerThread; ++i) {
                const float x = __bfloat162float(gp[i]);
                h[i] = x / (1.0f + expf(-x)) * __bfloat162float(up[i]);
            }
        } else {
#pragma unroll
            for (int i = 0; i < kPerThread; ++i) {
                const int c = c0 + i;
                const float x = c < I ? __bfloat162float(g[c]) : 0.0f;
                h[i] = c < I ? x / (1.0f + expf(-x)) * __bfloat162float(g[I + c]) : 0.0f;
            }
        }
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < kPerThread; ++i) amax = fmaxf(amax, fabsf(h[i]));
#pragma unroll
        for (int o = kThreadsPerBlock128 / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const float scale = fmaxf(amax, kActQuantMinAmax) / kFp8E4M3Max;
        if (threadIdx.x % kThreadsPerBlock128 == 0) scales[r * nb + c0 / static_cast<int>(kFp8Block)] = scale;
        uint8_t out[kPerThread];
#pragma unroll
        for (int i = 0; i < kPerThread; ++i) out[i] = __nv_cvt_float_to_fp8(h[i] / scale, __NV_SATFINITE, __NV_E4M3);
        uint8_t* dst = q + r * I + c0;
        if (vec && c0 < I) {
            *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(out);
        } else {
            for (int i = 0; i < kPerThread && c0 + i < I; ++i) dst[i] = out[i];
        }
    }
}

}  // namespace

void launch_silu_mul_quant_masked(const uint16_t* gate_up, const int32_t* counts, int num_experts, int max_m, int I,
                                  uint8_t* q, float* scales, void* cuda_stream) {
    if (num_experts <= 0 || max_m <= 0 || I <= 0) return;
    FANOUT_DEVICE_REQUIRE(static_cast<int64_t>(num_experts) * max_m < (int64_t{1} << 31),
                          "silu_mul_quant_masked: experts × max_m exceeds the grid");
    silu_mul_quant_masked_kernel<<<num_experts * max_m, kThreads, 0, static_cast<cudaStream_t>(cuda_stream)>>>(
        reinterpret_cast<const __nv_bfloat16*>(gate_up), counts, max_m, I, q, scales);
    FANOUT_CUDA_CHECK_LAUNCH("silu_mul_quant_masked_kernel");
}

}  // namespace fanout::ops

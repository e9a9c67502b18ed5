// The experts' activation on the device: silu(gate) · up, then 1×128 FP8 quantization, over the
// masked layout with the per-expert counts read on the device (so it runs under a CUDA graph).
// Persistent: every warp walks the real (row, 128-column block) items of each expert in turn,
// so the work spreads evenly whatever the routing and rows past a count cost nothing.
// Only fmt-free headers here.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "fanout/core/cuda_check.h"
#include "fanout/ops/fp8_constants.h"
#include "fanout/ops/gemm.h"
#include "fanout/ops/grouped_gemm_cuda.h"

namespace fanout::ops {
namespace {

constexpr int kWarps = 8;

__global__ void __launch_bounds__(kWarps * 32)
    silu_mul_quant_masked_kernel(const __nv_bfloat16* __restrict__ gate_up, const int32_t* __restrict__ counts, int E,
                                 int max_m, int I, uint8_t* __restrict__ q, float* __restrict__ scales) {
    const int lane = threadIdx.x % 32;
    const int warp = blockIdx.x * kWarps + threadIdx.x / 32, num_warps = gridDim.x * kWarps;
    const int nb = (I + static_cast<int>(kFp8Block) - 1) / static_cast<int>(kFp8Block);
    for (int e = 0; e < E; ++e) {
        const int count = min(max(counts[e], 0), max_m);
        for (int item = warp; item < count * nb; item += num_warps) {
            const int row = item / nb, b = item % nb;
            const size_t r = static_cast<size_t>(e) * max_m + row;
            const __nv_bfloat16* g = gate_up + r * 2 * I;
            float h[4];
            float amax = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int k = b * static_cast<int>(kFp8Block) + lane + 32 * i;
                h[i] = 0.0f;
                if (k < I) {
                    const float gv = __bfloat162float(g[k]), uv = __bfloat162float(g[I + k]);
                    h[i] = gv / (1.0f + expf(-gv)) * uv;
                }
                amax = fmaxf(amax, fabsf(h[i]));
            }
            for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            const float scale = fmaxf(amax, kActQuantMinAmax) / kFp8E4M3Max;
            if (lane == 0) scales[r * nb + b] = scale;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int k = b * static_cast<int>(kFp8Block) + lane + 32 * i;
                if (k < I) q[r * I + k] = __nv_cvt_float_to_fp8(h[i] / scale, __NV_SATFINITE, __NV_E4M3);
            }
        }
    }
}

}  // namespace

void launch_silu_mul_quant_masked(const uint16_t* gate_up, const int32_t* counts, int num_experts, int max_m, int I,
                                  uint8_t* q, float* scales, void* cuda_stream) {
    if (num_experts <= 0 || max_m <= 0 || I <= 0) return;
    silu_mul_quant_masked_kernel<<<device_sm_count() * 4, kWarps * 32, 0, static_cast<cudaStream_t>(cuda_stream)>>>(
        reinterpret_cast<const __nv_bfloat16*>(gate_up), counts, num_experts, max_m, I, q, scales);
    FANOUT_CUDA_CHECK_LAUNCH("silu_mul_quant_masked_kernel");
}

}  // namespace fanout::ops

// y[M, N] f32 = x[M, K] · W[N, K]ᵀ for a handful of rows (decode steps of the MoE router's
// gate: M ≤ 8 tokens, N = 256 experts, K = 7168): a CTA per output column, its threads splitting
// K — each reads its slices of the column's weights once, 8 bf16 per 16-byte load, and dots them
// with every row of x (which stays in L1/L2); f32 accumulation, then the CTA's sum (warp
// shuffles, then shared memory). cuBLASLt's split-K plan for these shapes takes two kernels.
// Only fmt-free headers here.
#include <cuda_bf16.h>

#include <cstdint>
#include <string>

#include "fanout/core/cuda_check.h"
#include "fanout/ops/gemm.h"
#include "fanout/ops/pdl.cuh"

namespace fanout::ops {
namespace {

constexpr int kWarps = 8;

__device__ __forceinline__ void unpack8(const uint4& raw, float* f) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 v = __bfloat1622float2(h[i]);
        f[2 * i] = v.x;
        f[2 * i + 1] = v.y;
    }
}

template <int kM>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_bf16_f32_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                         float* __restrict__ y, int N, int K) {
    __shared__ float partial[kWarps][kM];
    const int n = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const uint4* wr = reinterpret_cast<const uint4*>(w + static_cast<size_t>(n) * K);
    const int chunks = K / 8;
    float acc[kM];
#pragma unroll
    for (int m = 0; m < kM; ++m) acc[m] = 0.0f;
    // The first slice of weights is requested before the wait: no kernel writes W, so its load
    // overlaps the previous kernel's tail (pdl.cuh).
    uint4 next = threadIdx.x < chunks ? __ldg(wr + threadIdx.x) : uint4{};
    pdl_enter();
    for (int c = threadIdx.x; c < chunks; c += kWarps * 32) {
        float wf[8];
        unpack8(next, wf);
        if (c + kWarps * 32 < chunks) next = __ldg(wr + c + kWarps * 32);
#pragma unroll
        for (int m = 0; m < kM; ++m) {
            float xf[8];
            unpack8(*reinterpret_cast<const uint4*>(x + static_cast<size_t>(m) * K + 8 * c), xf);
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[m] = fmaf(xf[i], wf[i], acc[m]);
        }
    }
#pragma unroll
    for (int m = 0; m < kM; ++m) {
        float v = acc[m];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) partial[warp][m] = v;
    }
    __syncthreads();
    if (threadIdx.x < kM) {
        float v = 0.0f;
        for (int i = 0; i < kWarps; ++i) v += partial[i][threadIdx.x];
        y[static_cast<size_t>(threadIdx.x) * N + n] = v;
    }
}

template <int kM>
void launch_m(const uint16_t* x, const uint16_t* w, float* y, int N, int K, cudaStream_t s) {
    launch_pdl(gemv_bf16_f32_kernel<kM>, N, kWarps * 32, 0, s, reinterpret_cast<const __nv_bfloat16*>(x),
               reinterpret_cast<const __nv_bfloat16*>(w), y, N, K);
}

}  // namespace

bool gemv_bf16_f32_fits(const uint16_t* x, const uint16_t* w, int M, int N, int K) {
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    return M >= 1 && M <= kGemvMaxRows && N >= 1 && N <= kGemvMaxColumns && K % 8 == 0 && K > 0 && aligned(x) &&
           aligned(w);
}

void launch_gemv_bf16_f32(const uint16_t* x, const uint16_t* w, float* y, int M, int N, int K, void* cuda_stream) {
    FANOUT_DEVICE_REQUIRE(gemv_bf16_f32_fits(x, w, M, N, K),
                          "gemv_bf16_f32: unsupported M=" + std::to_string(M) + " N=" + std::to_string(N) +
                              " K=" + std::to_string(K) + " (M <= 8, N <= 4096, K a multiple of 8, 16-byte rows)");
    const auto s = static_cast<cudaStream_t>(cuda_stream);
    switch (M) {
        case 1:
            launch_m<1>(x, w, y, N, K, s);
            break;
        case 2:
            launch_m<2>(x, w, y, N, K, s);
            break;
        case 3:
            launch_m<3>(x, w, y, N, K, s);
            break;
        case 4:
            launch_m<4>(x, w, y, N, K, s);
            break;
        case 5:
            launch_m<5>(x, w, y, N, K, s);
            break;
        case 6:
            launch_m<6>(x, w, y, N, K, s);
            break;
        case 7:
            launch_m<7>(x, w, y, N, K, s);
            break;
        default:
            launch_m<8>(x, w, y, N, K, s);
            break;
    }
    FANOUT_CUDA_CHECK_LAUNCH("gemv_bf16_f32_kernel");
}

}  // namespace fanout::ops

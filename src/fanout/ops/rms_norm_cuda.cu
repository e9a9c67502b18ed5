// rms_norm on the GPU: one block per row; the sum of squares is reduced with warp shuffles.
// Only fmt-free headers here: fmt does not compile under nvcc.
#include <cuda_bf16.h>

#include <cstdint>
#include <string>

#include "fanout/core/cuda_check.h"
#include "fanout/ops/block_reduce.cuh"

namespace fanout::ops {
namespace {

constexpr int kThreads = 256;


__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ w, float eps,
                                float* __restrict__ out, int D) {
    const float* row = x + static_cast<size_t>(blockIdx.x) * D;
    float ss = 0.0f;
    for (int d = threadIdx.x; d < D; d += kThreads) ss += row[d] * row[d];
    const float inv = rsqrtf(block_sum<kThreads>(ss) / D + eps);
    // out may alias x only element-wise (each element is read, then written, by the same thread).
    float* orow = out + static_cast<size_t>(blockIdx.x) * D;
    for (int d = threadIdx.x; d < D; d += kThreads) orow[d] = row[d] * inv * w[d];
}

// bf16 rows with the residual add: z = x (+ residual) kept in shared memory as f32 between the
// two passes (D <= kMaxD).
constexpr int kMaxD = 16384;

__global__ void rms_norm_bf16_kernel(const __nv_bfloat16* x, int64_t x_stride, __nv_bfloat16* __restrict__ residual,
                                     const float* __restrict__ w, float eps, __nv_bfloat16* y, int64_t y_stride,
                                     int D) {
    extern __shared__ float z[];
    const size_t base = static_cast<size_t>(blockIdx.x) * D;
    const size_t xbase = static_cast<size_t>(blockIdx.x) * x_stride, ybase = static_cast<size_t>(blockIdx.x) * y_stride;
    float ss = 0.0f;
    for (int d = threadIdx.x; d < D; d += kThreads) {
        float v = __bfloat162float(x[xbase + d]);
        if (residual != nullptr) {
            v += __bfloat162float(residual[base + d]);
            residual[base + d] = __float2bfloat16(v);
        }
        z[d] = v;
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum<kThreads>(ss) / D + eps);
    // Each element of z was written by the thread that reads it here; y may alias x likewise.
    for (int d = threadIdx.x; d < D; d += kThreads) y[ybase + d] = __float2bfloat16(z[d] * inv * w[d]);
}

}  // namespace

void launch_rms_norm_bf16_strided(const uint16_t* x, int64_t x_stride, uint16_t* residual, const float* w, float eps,
                                  uint16_t* y, int64_t y_stride, int M, int D, void* cuda_stream);

void launch_rms_norm_bf16(const uint16_t* x, uint16_t* residual, const float* w, float eps, uint16_t* y, int M, int D,
                          void* cuda_stream) {
    launch_rms_norm_bf16_strided(x, D, residual, w, eps, y, D, M, D, cuda_stream);
}

void launch_rms_norm_bf16_strided(const uint16_t* x, int64_t x_stride, uint16_t* residual, const float* w, float eps,
                                  uint16_t* y, int64_t y_stride, int M, int D, void* cuda_stream) {
    FANOUT_DEVICE_REQUIRE(D > 0 && D <= kMaxD,
                          "rms_norm_bf16: width " + std::to_string(D) + " outside 1.." + std::to_string(kMaxD));
    if (M <= 0) return;
    const size_t smem = static_cast<size_t>(D) * sizeof(float);
    static const bool attr = [] {
        FANOUT_CUDA_CHECK(cudaFuncSetAttribute(rms_norm_bf16_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               kMaxD * static_cast<int>(sizeof(float))));
        return true;
    }();
    (void)attr;
    rms_norm_bf16_kernel<<<M, kThreads, smem, static_cast<cudaStream_t>(cuda_stream)>>>(
        reinterpret_cast<const __nv_bfloat16*>(x), x_stride, reinterpret_cast<__nv_bfloat16*>(residual), w, eps,
        reinterpret_cast<__nv_bfloat16*>(y), y_stride, D);
    FANOUT_CUDA_CHECK_LAUNCH("rms_norm_bf16_kernel");
}

void launch_rms_norm(const float* x, const float* w, float eps, float* out, int M, int D, void* cuda_stream) {
    if (M == 0) return;
    rms_norm_kernel<<<M, kThreads, 0, static_cast<cudaStream_t>(cuda_stream)>>>(x, w, eps, out, D);
    FANOUT_CUDA_CHECK_LAUNCH("rms_norm_kernel");
}

}  // namespace fanout::ops

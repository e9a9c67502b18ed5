// rms_norm on the GPU: one block per row; the sum of squares is reduced with warp shuffles. bf16
// rows move 8 values per 16-byte access where the width, strides and pointers allow.
// Only fmt-free headers here: fmt does not compile under nvcc.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <string>

#include "fanout/core/cuda_check.h"
#include "fanout/ops/block_reduce.cuh"
#include "fanout/ops/fp8_constants.h"

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

// With q: the bf16 output also quantized per 1×128 block (act_quant's rule, on the bf16 values, so
// the result is the one act_quant would give on y) into q [M, D] and scales [M, ceil(D/128)].
// gridDim.y > 1 (few rows: decode steps) splits each row's output into column chunks of whole
// 128-blocks, a CTA each; every CTA still reduces the whole row for the norm (x is re-read, which is
// cheap beside the quantization it spreads). Only without a residual and with y not aliasing x.
// kVec: 8 values per 16-byte access (D, the strides and the pointers allow it), else one at a time.
template <bool kVec>
__global__ void rms_norm_bf16_kernel(const __nv_bfloat16* x, int64_t x_stride, __nv_bfloat16* __restrict__ residual,
                                     const float* __restrict__ w, float eps, __nv_bfloat16* y, int64_t y_stride, int D,
                                     uint8_t* __restrict__ q, float* __restrict__ scales) {
    extern __shared__ float z[];
    const size_t base = static_cast<size_t>(blockIdx.x) * D;
    const size_t xbase = static_cast<size_t>(blockIdx.x) * x_stride, ybase = static_cast<size_t>(blockIdx.x) * y_stride;
    const int nb = (D + static_cast<int>(kFp8Block) - 1) / static_cast<int>(kFp8Block);
    const int blocks_per_chunk = (nb + static_cast<int>(gridDim.y) - 1) / static_cast<int>(gridDim.y);
    const int b0 = blockIdx.y * blocks_per_chunk, b1 = min(nb, b0 + blocks_per_chunk);
    const int c0 = b0 * static_cast<int>(kFp8Block), c1 = min(D, b1 * static_cast<int>(kFp8Block));
    float ss = 0.0f;
    if constexpr (kVec) {
        for (int d = 8 * static_cast<int>(threadIdx.x); d < D; d += 8 * kThreads) {
            uint4 raw = *reinterpret_cast<const uint4*>(x + xbase + d);
            const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
            float v[8];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float2 f = __bfloat1622float2(h[i]);
                v[2 * i] = f.x;
                v[2 * i + 1] = f.y;
            }
            if (residual != nullptr) {
                uint4 rraw = *reinterpret_cast<const uint4*>(residual + base + d);
                __nv_bfloat162* r = reinterpret_cast<__nv_bfloat162*>(&rraw);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const float2 f = __bfloat1622float2(r[i]);
                    v[2 * i] += f.x;
                    v[2 * i + 1] += f.y;
                    r[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
                }
                *reinterpret_cast<uint4*>(residual + base + d) = rraw;
            }
            reinterpret_cast<float4*>(z + d)[0] = make_float4(v[0], v[1], v[2], v[3]);
            reinterpret_cast<float4*>(z + d)[1] = make_float4(v[4], v[5], v[6], v[7]);
#pragma unroll
            for (int i = 0; i < 8; ++i) ss += v[i] * v[i];
        }
    } else {
        for (int d = threadIdx.x; d < D; d += kThreads) {
            float v = __bfloat162float(x[xbase + d]);
            if (residual != nullptr) {
                v += __bfloat162float(residual[base + d]);
                residual[base + d] = __float2bfloat16(v);
            }
            z[d] = v;
            ss += v * v;
        }
    }
    const float inv = rsqrtf(block_sum<kThreads>(ss) / D + eps);
    if constexpr (kVec) {
        // z was written by other threads in split mode (c0 > 0): block_sum's barrier orders it. Without
        // the split each slice is read by the thread that wrote it, so y may alias x.
        for (int d = c0 + 8 * static_cast<int>(threadIdx.x); d < c1; d += 8 * kThreads) {
            const float4 z0 = reinterpret_cast<const float4*>(z + d)[0], z1 = reinterpret_cast<const float4*>(z + d)[1];
            const float4 w0 = *reinterpret_cast<const float4*>(w + d), w1 = *reinterpret_cast<const float4*>(w + d + 4);
            const float zv[8] = {z0.x, z0.y, z0.z, z0.w, z1.x, z1.y, z1.z, z1.w};
            const float wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
            uint4 out;
            __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&out);
            float back[8];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                o[i] = __floats2bfloat162_rn(zv[2 * i] * inv * wv[2 * i], zv[2 * i + 1] * inv * wv[2 * i + 1]);
                const float2 f = __bfloat1622float2(o[i]);
                back[2 * i] = f.x;
                back[2 * i + 1] = f.y;
            }
            *reinterpret_cast<uint4*>(y + ybase + d) = out;
            reinterpret_cast<float4*>(z + d)[0] = make_float4(back[0], back[1], back[2], back[3]);
            reinterpret_cast<float4*>(z + d)[1] = make_float4(back[4], back[5], back[6], back[7]);
        }
    } else {
        // Each element of z was written by the thread that reads it here; y may alias x likewise.
        for (int d = c0 + static_cast<int>(threadIdx.x); d < c1; d += kThreads) {
            const __nv_bfloat16 v = __float2bfloat16(z[d] * inv * w[d]);
            y[ybase + d] = v;
            z[d] = __bfloat162float(v);
        }
    }
    if (q == nullptr) return;
    __syncthreads();
    // A warp per 128-value block: amax, scale, e4m3 with round-to-nearest-even and saturation.
    const int lane = threadIdx.x % 32;
    for (int b = b0 + static_cast<int>(threadIdx.x) / 32; b < b1; b += kThreads / 32) {
        float v[4], amax = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int d = b * static_cast<int>(kFp8Block) + lane + 32 * i;
            v[i] = d < D ? z[d] : 0.0f;
            amax = fmaxf(amax, fabsf(v[i]));
        }
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const float scale = fmaxf(amax, kActQuantMinAmax) / kFp8E4M3Max;
        if (lane == 0) scales[static_cast<size_t>(blockIdx.x) * nb + b] = scale;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int d = b * static_cast<int>(kFp8Block) + lane + 32 * i;
            if (d < D) q[base + d] = __nv_cvt_float_to_fp8(v[i] / scale, __NV_SATFINITE, __NV_E4M3);
        }
    }
}

}  // namespace

void launch_rms_norm_bf16_strided(const uint16_t* x, int64_t x_stride, uint16_t* residual, const float* w, float eps,
                                  uint16_t* y, int64_t y_stride, int M, int D, void* cuda_stream);
void launch_rms_norm_quant_bf16(const uint16_t* x, int64_t x_stride, uint16_t* residual, const float* w, float eps,
                                uint16_t* y, int64_t y_stride, uint8_t* q, float* scales, int M, int D,
                                void* cuda_stream);

void launch_rms_norm_bf16(const uint16_t* x, uint16_t* residual, const float* w, float eps, uint16_t* y, int M, int D,
                          void* cuda_stream) {
    launch_rms_norm_bf16_strided(x, D, residual, w, eps, y, D, M, D, cuda_stream);
}

void launch_rms_norm_bf16_strided(const uint16_t* x, int64_t x_stride, uint16_t* residual, const float* w, float eps,
                                  uint16_t* y, int64_t y_stride, int M, int D, void* cuda_stream) {
    launch_rms_norm_quant_bf16(x, x_stride, residual, w, eps, y, y_stride, nullptr, nullptr, M, D, cuda_stream);
}

void launch_rms_norm_quant_bf16(const uint16_t* x, int64_t x_stride, uint16_t* residual, const float* w, float eps,
                                uint16_t* y, int64_t y_stride, uint8_t* q, float* scales, int M, int D,
                                void* cuda_stream) {
    FANOUT_DEVICE_REQUIRE(D > 0 && D <= kMaxD,
                          "rms_norm_bf16: width " + std::to_string(D) + " outside 1.." + std::to_string(kMaxD));
    if (M <= 0) return;
    const size_t smem = static_cast<size_t>(D) * sizeof(float);
    static const bool attr = [] {
        FANOUT_CUDA_CHECK(cudaFuncSetAttribute(rms_norm_bf16_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               kMaxD * static_cast<int>(sizeof(float))));
        FANOUT_CUDA_CHECK(cudaFuncSetAttribute(rms_norm_bf16_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               kMaxD * static_cast<int>(sizeof(float))));
        return true;
    }();
    (void)attr;
    // Few rows with a quantized output: spread each row over column chunks of 8 blocks (1024 values).
    const bool split = q != nullptr && residual == nullptr && y != x && M < 32;
    const dim3 grid(M, split ? (D + 1023) / 1024 : 1);
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const bool vec = D % 8 == 0 && x_stride % 8 == 0 && y_stride % 8 == 0 && aligned(x) && aligned(y) &&
                     aligned(residual) && aligned(w);
    auto* kernel = vec ? rms_norm_bf16_kernel<true> : rms_norm_bf16_kernel<false>;
    kernel<<<grid, kThreads, smem, static_cast<cudaStream_t>(cuda_stream)>>>(
        reinterpret_cast<const __nv_bfloat16*>(x), x_stride, reinterpret_cast<__nv_bfloat16*>(residual), w, eps,
        reinterpret_cast<__nv_bfloat16*>(y), y_stride, D, q, scales);
    FANOUT_CUDA_CHECK_LAUNCH("rms_norm_bf16_kernel");
}

void launch_rms_norm(const float* x, const float* w, float eps, float* out, int M, int D, void* cuda_stream) {
    if (M == 0) return;
    rms_norm_kernel<<<M, kThreads, 0, static_cast<cudaStream_t>(cuda_stream)>>>(x, w, eps, out, D);
    FANOUT_CUDA_CHECK_LAUNCH("rms_norm_kernel");
}

}  // namespace fanout::ops

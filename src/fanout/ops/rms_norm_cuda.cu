// rms_norm on the GPU: one block per row; the sum of squares is reduced with warp shuffles. bf16
// rows stay in registers between their one load and their stores, 8 values per thread and 16-byte
// access where the width, strides and pointers allow.
// Only fmt-free headers here: fmt does not compile under nvcc.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <string>

#include "fanout/core/cuda_check.h"
#include "fanout/ops/block_reduce.cuh"
#include "fanout/ops/fp8_constants.h"
#include "fanout/ops/pdl.cuh"

namespace fanout::ops {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxD = 16384;  // bf16 rows: two slots of 8 columns for each of 1,024 threads

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

// bf16 rows, a block per row, the row in registers from its load to its stores: each thread holds
// 8 consecutive columns per slot (kSlots slots, slot s of thread t at column 8·(t + s·blockDim)),
// so the row is read once, with every load in flight together, and nothing goes through shared
// memory but the sum of squares. With `residual`, z = x + residual is stored back to it as bf16.
// With q, the bf16 output is also quantized per 1×128 block (act_quant's rule, on the bf16 values,
// so the bytes are the ones act_quant would give on y) into q [M, D] and the scales (strides `scale_at`;
// with row_scales, a second, row-major copy of them):
// a 128-column block is 16 consecutive threads of one slot, which reduce its amax by shuffles.
// kVec: 16-byte accesses (D, the strides and the pointers allow them), else one value at a time.
// Each thread reads its columns before it writes them, so y may alias x; y may be null when only q
// is wanted.
template <bool kVec, int kSlots>
__global__ void __launch_bounds__(1024)
    rms_norm_bf16_kernel(const __nv_bfloat16* x, int64_t x_stride, __nv_bfloat16* __restrict__ residual,
                         const float* __restrict__ w, float eps, __nv_bfloat16* y, int64_t y_stride, int D,
                         uint8_t* __restrict__ q, float* __restrict__ scales, ScaleStrides scale_at,
                         float* __restrict__ row_scales) {
    pdl_enter();
    const size_t base = static_cast<size_t>(blockIdx.x) * D;
    const size_t xbase = static_cast<size_t>(blockIdx.x) * x_stride, ybase = static_cast<size_t>(blockIdx.x) * y_stride;
    float v[kSlots][8];
    float ss = 0.0f;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
        const int d = 8 * static_cast<int>(threadIdx.x + s * blockDim.x);
        if constexpr (kVec) {
            uint4 raw = d < D ? *reinterpret_cast<const uint4*>(x + xbase + d) : uint4{0, 0, 0, 0};
            const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float2 f = __bfloat1622float2(h[i]);
                v[s][2 * i] = f.x;
                v[s][2 * i + 1] = f.y;
            }
            if (residual != nullptr && d < D) {
                uint4 rraw = *reinterpret_cast<const uint4*>(residual + base + d);
                __nv_bfloat162* r = reinterpret_cast<__nv_bfloat162*>(&rraw);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const float2 f = __bfloat1622float2(r[i]);
                    v[s][2 * i] += f.x;
                    v[s][2 * i + 1] += f.y;
                    r[i] = __floats2bfloat162_rn(v[s][2 * i], v[s][2 * i + 1]);
                }
                *reinterpret_cast<uint4*>(residual + base + d) = rraw;
            }
        } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int c = d + i;
                float z = c < D ? __bfloat162float(x[xbase + c]) : 0.0f;
                if (residual != nullptr && c < D) {
                    z += __bfloat162float(residual[base + c]);
                    residual[base + c] = __float2bfloat16(z);
                }
                v[s][i] = z;
            }
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) ss += v[s][i] * v[s][i];
    }
    const float inv = rsqrtf(block_sum_any(ss) / D + eps);
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
        const int d = 8 * static_cast<int>(threadIdx.x + s * blockDim.x);
        float back[8];  // y as stored (bf16), what the quantization reads
        if constexpr (kVec) {
            float wv[8] = {};
            if (d < D) {
                const float4 w0 = *reinterpret_cast<const float4*>(w + d),
                             w1 = *reinterpret_cast<const float4*>(w + d + 4);
                wv[0] = w0.x, wv[1] = w0.y, wv[2] = w0.z, wv[3] = w0.w, wv[4] = w1.x, wv[5] = w1.y, wv[6] = w1.z,
                wv[7] = w1.w;
            }
            uint4 out;
            __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                o[i] = __floats2bfloat162_rn(v[s][2 * i] * inv * wv[2 * i], v[s][2 * i + 1] * inv * wv[2 * i + 1]);
                const float2 f = __bfloat1622float2(o[i]);
                back[2 * i] = f.x;
                back[2 * i + 1] = f.y;
            }
            if (y != nullptr && d < D) *reinterpret_cast<uint4*>(y + ybase + d) = out;
        } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int c = d + i;
                const __nv_bfloat16 b = __float2bfloat16(c < D ? v[s][i] * inv * w[c] : 0.0f);
                if (y != nullptr && c < D) y[ybase + c] = b;
                back[i] = __bfloat162float(b);
            }
        }
        if (q == nullptr) continue;  // the same for every thread
        // amax, scale, e4m3 with round-to-nearest-even and saturation (columns past D hold 0).
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(back[i]));
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        if (d >= D) continue;
        const float scale = fmaxf(amax, kActQuantMinAmax) / kFp8E4M3Max;
        if (threadIdx.x % 16 == 0) {
            const int b = d / static_cast<int>(kFp8Block);
            scales[blockIdx.x * scale_at.row + b * scale_at.block] = scale;
            const int nb = (D + static_cast<int>(kFp8Block) - 1) / static_cast<int>(kFp8Block);
            if (row_scales != nullptr) row_scales[static_cast<size_t>(blockIdx.x) * nb + b] = scale;
        }
        alignas(8) uint8_t e[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) e[i] = __nv_cvt_float_to_fp8(back[i] / scale, __NV_SATFINITE, __NV_E4M3);
        if (kVec) {
            *reinterpret_cast<uint2*>(q + base + d) = *reinterpret_cast<const uint2*>(e);
        } else {
            for (int i = 0; i < 8 && d + i < D; ++i) q[base + d + i] = e[i];
        }
    }
}

}  // namespace

void launch_rms_norm_bf16_strided(const uint16_t* x, int64_t x_stride, uint16_t* residual, const float* w, float eps,
                                  uint16_t* y, int64_t y_stride, int M, int D, void* cuda_stream);
void launch_rms_norm_quant_bf16(const uint16_t* x, int64_t x_stride, uint16_t* residual, const float* w, float eps,
                                uint16_t* y, int64_t y_stride, uint8_t* q, float* scales, ScaleOrder order, int M,
                                int D, void* cuda_stream, float* row_scales);

void launch_rms_norm_bf16(const uint16_t* x, uint16_t* residual, const float* w, float eps, uint16_t* y, int M, int D,
                          void* cuda_stream) {
    launch_rms_norm_bf16_strided(x, D, residual, w, eps, y, D, M, D, cuda_stream);
}

void launch_rms_norm_bf16_strided(const uint16_t* x, int64_t x_stride, uint16_t* residual, const float* w, float eps,
                                  uint16_t* y, int64_t y_stride, int M, int D, void* cuda_stream) {
    launch_rms_norm_quant_bf16(x, x_stride, residual, w, eps, y, y_stride, nullptr, nullptr, ScaleOrder::kRowMajor, M,
                               D, cuda_stream, nullptr);
}

void launch_rms_norm_quant_bf16(const uint16_t* x, int64_t x_stride, uint16_t* residual, const float* w, float eps,
                                uint16_t* y, int64_t y_stride, uint8_t* q, float* scales, ScaleOrder order, int M,
                                int D, void* cuda_stream, float* row_scales) {
    FANOUT_DEVICE_REQUIRE(D > 0 && D <= kMaxD,
                          "rms_norm_bf16: width " + std::to_string(D) + " outside 1.." + std::to_string(kMaxD));
    FANOUT_DEVICE_REQUIRE(y != nullptr || q != nullptr, "rms_norm_bf16: neither a bf16 nor a quantized output");
    if (M <= 0) return;
    // 8 columns per thread and slot: one slot while a row fits 1024 threads, else two.
    const int vectors = (D + 7) / 8, slots = vectors <= 1024 ? 1 : 2;
    const int threads = ((vectors + slots - 1) / slots + 31) / 32 * 32;
    const auto aligned = [](const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
    const bool vec = D % 8 == 0 && x_stride % 8 == 0 && (y == nullptr || y_stride % 8 == 0) && aligned(x, 16) &&
                     aligned(y, 16) && aligned(residual, 16) && aligned(w, 16) && aligned(q, 8);
    auto* kernel = vec ? (slots == 1 ? rms_norm_bf16_kernel<true, 1> : rms_norm_bf16_kernel<true, 2>)
                       : (slots == 1 ? rms_norm_bf16_kernel<false, 1> : rms_norm_bf16_kernel<false, 2>);
    launch_pdl(kernel, M, threads, 0, static_cast<cudaStream_t>(cuda_stream), reinterpret_cast<const __nv_bfloat16*>(x),
               x_stride, reinterpret_cast<__nv_bfloat16*>(residual), w, eps, reinterpret_cast<__nv_bfloat16*>(y),
               y_stride, D, q, scales, scale_strides(order, M, (D + kFp8Block - 1) / kFp8Block),
               q != nullptr ? row_scales : nullptr);
}

void launch_rms_norm(const float* x, const float* w, float eps, float* out, int M, int D, void* cuda_stream) {
    if (M == 0) return;
    rms_norm_kernel<<<M, kThreads, 0, static_cast<cudaStream_t>(cuda_stream)>>>(x, w, eps, out, D);
    FANOUT_CUDA_CHECK_LAUNCH("rms_norm_kernel");
}

}  // namespace fanout::ops

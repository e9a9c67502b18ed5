// gemm_fp8: DeepSeek-V3's FP8 block-scaled GEMM, y[M, N] = x[M, K] · W[N, K]ᵀ.
//
// x is e4m3 with one f32 scale per 1×128 block of a row (act_quant); W is e4m3 with one f32 scale
// per 128×128 block (weight_scale_inv; partial blocks at the edges). Each 128-wide slice of K is
// accumulated in f32 and then promoted: y += partial · sx[m, kb] · sw[n / 128, kb]. The output is
// bf16 (the GPU kernel) or f32 (the CPU reference).
//
// The CUDA kernel here is the first, plain one (SIMT tiles through shared memory): correct on any
// shape, and the baseline that issue 5's wgmma / TMA kernels replace and are tested like.
#pragma once

#include <cstdint>

#include "fanout/core/thread_pool.h"

namespace fanout::ops {

// x: [M, K] fp8; sx: [M, ceil(K/128)]; w: [N, K] fp8; sw: [ceil(N/128), ceil(K/128)]; y: [M, N] f32.
void gemm_fp8_cpu(const uint8_t* x, const float* sx, const uint8_t* w, const float* sw, float* y, int64_t M,
                  int64_t N, int64_t K, const Stream& s);

#ifdef FANOUT_WITH_CUDA
// The same on the device, y in bf16 (uint16_t storage).
void launch_gemm_fp8(const uint8_t* x, const float* sx, const uint8_t* w, const float* sw, uint16_t* y, int M, int N,
                     int K, void* cuda_stream);
#endif

}  // namespace fanout::ops

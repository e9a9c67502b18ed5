// The plain FP8 block-scaled GEMM: a 64×64 output tile per block of 256 threads, each thread
// 4×4 outputs; x and W tiles of one 128-wide K block staged in shared memory as bytes, widened to
// f32 at use, accumulated per K block and promoted with the two scales. Partial tiles and partial
// K blocks are zero-padded. Correct on any shape; fast it is not (no tensor cores): the fallback
// for K that TMA cannot describe and the baseline of gemm_fp8_sm90.cu. Only fmt-free headers here.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "fanout/core/cuda_check.h"
#include "fanout/ops/fp8_constants.h"
#include "fanout/ops/gemm.h"

namespace fanout::ops {
namespace {

constexpr int kTile = 64, kKBlock = 128, kThreads = 256;

__device__ __forceinline__ float fp8_to_f32(uint8_t v) {
    __nv_fp8_e4m3 f;
    f.__x = v;
    return static_cast<float>(f);
}

__global__ void __launch_bounds__(kThreads)
    gemm_fp8_simt(const uint8_t* __restrict__ x, const float* __restrict__ sx, const uint8_t* __restrict__ w,
                  const float* __restrict__ sw, __nv_bfloat16* __restrict__ y, int M, int N, int K) {
    __shared__ uint8_t xs[kTile][kKBlock + 4];
    __shared__ uint8_t ws[kTile][kKBlock + 4];
    const int m0 = blockIdx.y * kTile, n0 = blockIdx.x * kTile;
    const int tm = threadIdx.x / 16, tn = threadIdx.x % 16;  // rows tm + 16 i, cols tn + 16 j
    const int nbk = (K + kKBlock - 1) / kKBlock;
    float acc[4][4] = {};
    for (int kb = 0; kb < nbk; ++kb) {
        const int k0 = kb * kKBlock;
        for (int i = threadIdx.x; i < kTile * kKBlock; i += kThreads) {
            const int r = i / kKBlock, c = i % kKBlock;
            const bool kin = k0 + c < K;
            xs[r][c] = (m0 + r < M && kin) ? x[static_cast<size_t>(m0 + r) * K + k0 + c] : 0;
            ws[r][c] = (n0 + r < N && kin) ? w[static_cast<size_t>(n0 + r) * K + k0 + c] : 0;
        }
        __syncthreads();
        float part[4][4] = {};
        for (int k = 0; k < kKBlock; ++k) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = fp8_to_f32(xs[tm + 16 * i][k]);
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = fp8_to_f32(ws[tn + 16 * j][k]);
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) part[i][j] = fmaf(a[i], b[j], part[i][j]);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int m = m0 + tm + 16 * i;
            const float sxm = m < M ? sx[static_cast<size_t>(m) * nbk + kb] : 0.0f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int n = n0 + tn + 16 * j;
                const float swn = n < N ? sw[static_cast<size_t>(n / kKBlock) * nbk + kb] : 0.0f;
                acc[i][j] += part[i][j] * (sxm * swn);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int m = m0 + tm + 16 * i, n = n0 + tn + 16 * j;
            if (m < M && n < N) y[static_cast<size_t>(m) * N + n] = __float2bfloat16(acc[i][j]);
        }
}

}  // namespace

void launch_gemm_fp8_simt(const uint8_t* x, const float* sx, const uint8_t* w, const float* sw, uint16_t* y, int M,
                          int N, int K, void* cuda_stream) {
    if (M == 0 || N == 0) return;
    const dim3 grid((N + kTile - 1) / kTile, (M + kTile - 1) / kTile);
    gemm_fp8_simt<<<grid, kThreads, 0, static_cast<cudaStream_t>(cuda_stream)>>>(
        x, sx, w, sw, reinterpret_cast<__nv_bfloat16*>(y), M, N, K);
    FANOUT_CUDA_CHECK_LAUNCH("gemm_fp8_simt");
}

}  // namespace fanout::ops

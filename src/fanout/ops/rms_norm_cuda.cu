// rms_norm on the GPU: one block per row; the sum of squares is reduced with warp shuffles.
// Only fmt-free headers here: fmt does not compile under nvcc.
#include "fanout/core/cuda_check.h"

namespace fanout::ops {
namespace {

constexpr int kThreads = 256;

__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ w, float eps,
                                float* __restrict__ out, int D) {
    const float* row = x + static_cast<size_t>(blockIdx.x) * D;
    float ss = 0.0f;
    for (int d = threadIdx.x; d < D; d += kThreads) ss += row[d] * row[d];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    __shared__ float warp_sums[kThreads / 32];
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = ss;
    __syncthreads();
    float total = 0.0f;
    for (int i = 0; i < kThreads / 32; ++i) total += warp_sums[i];
    const float inv = rsqrtf(total / D + eps);
    // NOTE: every thread read warp_sums before any writes below, and out may alias x only
    // element-wise (each element is read, then written, by the same thread).
    float* orow = out + static_cast<size_t>(blockIdx.x) * D;
    for (int d = threadIdx.x; d < D; d += kThreads) orow[d] = row[d] * inv * w[d];
}

}  // namespace

void launch_rms_norm(const float* x, const float* w, float eps, float* out, int M, int D, void* cuda_stream) {
    if (M == 0) return;
    rms_norm_kernel<<<M, kThreads, 0, static_cast<cudaStream_t>(cuda_stream)>>>(x, w, eps, out, D);
    FANOUT_CUDA_CHECK_LAUNCH("rms_norm_kernel");
}

}  // namespace fanout::ops

// The sum of every thread's `v` over a block of kThreads threads (each thread gets it): warp
// shuffles, then the warps' sums through shared memory. Include only from .cu files.
#pragma once

namespace fanout::ops {

template <int kThreads>
__device__ float block_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __shared__ float warp_sums[kThreads / 32];
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
    __syncthreads();
    float total = 0.0f;
    for (int i = 0; i < kThreads / 32; ++i) total += warp_sums[i];
    return total;
}

// The same over a block of any whole number of warps (blockDim.x a multiple of 32, at most 1,024);
// once per kernel (no barrier after the shared sums are read).
__device__ __forceinline__ float block_sum_any(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __shared__ float warp_sums[32];
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
    __syncthreads();
    float total = 0.0f;
    for (int i = 0; i < static_cast<int>(blockDim.x) / 32; ++i) total += warp_sums[i];
    return total;
}

}  // namespace fanout::ops

// Block-wide prefix sums for kernels of kThreads threads (a multiple of 32). Include only from .cu
// files. Every thread of the block must call them (they synchronize).
#pragma once

#include <cstdint>

namespace fanout {

// The exclusive prefix sum of each thread's v over the block; `total` gets the block's sum.
template <int kThreads>
__device__ int block_exclusive_scan(int v, int& total) {
    __shared__ int warp_sums[kThreads / 32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int inclusive = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, inclusive, o);
        if (lane >= o) inclusive += u;
    }
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    int before = 0;
    total = 0;
    for (int w = 0; w < kThreads / 32; ++w) {
        before += w < warp ? warp_sums[w] : 0;
        total += warp_sums[w];
    }
    __syncthreads();  // the next call rewrites warp_sums
    return before + inclusive - v;
}

// first[i] = Σ_{j < i} min(max(counts[j], 0), max_each) for i in [0, n], into `first` (shared
// memory, n + 1 ints), kThreads counts at a time; ready for every thread when it returns. Kernels
// that walk the rows a masked layout stores, a block per row or a warp per row, find a row's
// group with segment_of (search.cuh).
template <int kThreads>
__device__ void block_count_prefix(const int32_t* counts, int n, int max_each, int* first) {
    int carry = 0;
    for (int base = 0; base < n; base += kThreads) {
        const int i = base + static_cast<int>(threadIdx.x);
        const int v = i < n ? min(max(counts[i], 0), max_each) : 0;
        int total;
        const int before = block_exclusive_scan<kThreads>(v, total);
        if (i < n) first[i + 1] = carry + before + v;
        carry += total;
    }
    if (threadIdx.x == 0) first[0] = 0;
    __syncthreads();
}

}  // namespace fanout

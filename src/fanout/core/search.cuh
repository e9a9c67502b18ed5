// Device-side search in sorted offsets. Include only from .cu files.
#pragma once

namespace fanout {

// The last i in [0, n) with starts[i] <= x (0 when there is none): which segment of a list of
// nondecreasing segment starts holds x — an empty segment shares the next one's start and comes
// before it, so x lands in the non-empty one. n >= 1.
__device__ __forceinline__ int segment_of(const int* starts, int n, int x) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (starts[mid] <= x)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

}  // namespace fanout

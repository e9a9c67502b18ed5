// Timing and device memory for the GPU benchmarks (fmt-free is not needed: .cc files only).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

#include "fanout/core/cuda_check.h"
#include "fanout/core/cuda_graph.h"
#include "fanout/core/error.h"
#include "fanout/ops/device_array.h"

namespace fanout::bench {

// A GPU benchmark on a machine without a visible GPU: a clear error instead of CUDA's.
inline void require_gpu(const char* bench) {
    int n = 0;
    FANOUT_CHECK(cudaGetDeviceCount(&n) == cudaSuccess && n > 0, "{} needs a CUDA GPU; none is visible here", bench);
}

// µs per call of fn: three eager warm-up calls (first-call setup stays outside the graph), then
// `calls` back to back captured as one CUDA graph, the best of 5 replays.
template <typename Fn>
double time_graph_us(cudaStream_t s, int calls, Fn&& fn) {
    for (int i = 0; i < 3; ++i) fn();
    FANOUT_CUDA_CHECK(cudaStreamSynchronize(s));
    const cudaGraphExec_t exec = capture_graph(s, [&] {
        for (int i = 0; i < calls; ++i) fn();
    });
    cudaEvent_t a, b;
    FANOUT_CUDA_CHECK(cudaEventCreate(&a));
    FANOUT_CUDA_CHECK(cudaEventCreate(&b));
    float best = 1e30f;
    for (int r = 0; r < 5; ++r) {
        FANOUT_CUDA_CHECK(cudaEventRecord(a, s));
        FANOUT_CUDA_CHECK(cudaGraphLaunch(exec, s));
        FANOUT_CUDA_CHECK(cudaEventRecord(b, s));
        FANOUT_CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        FANOUT_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        best = std::min(best, ms);
    }
    cudaGraphExecDestroy(exec);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return best * 1000.0 / calls;
}

// A benchmark's device buffer: an ops::DeviceArray, its pointer as `p`.
template <typename T>
struct DevicePtr : ops::DeviceArray<T> {
    T* p = nullptr;
    explicit DevicePtr(size_t n) : ops::DeviceArray<T>(n), p(this->get()) {}
    DevicePtr(const DevicePtr&) = delete;
    DevicePtr& operator=(const DevicePtr&) = delete;
};

}  // namespace fanout::bench

// capture_graph: the work `fn` enqueues on `stream`, captured once (thread-local capture mode) as
// an executable CUDA graph — how the runner, the benchmarks and the graph tests all capture. If fn
// throws, the capture is ended and discarded before the exception goes on, so the stream stays
// usable. The caller owns the result (cudaGraphExecDestroy). Include only where CUDA is linked.
#pragma once

#include <cuda_runtime.h>

#include "fanout/core/cuda_check.h"

namespace fanout {

template <typename Fn>
cudaGraphExec_t capture_graph(cudaStream_t stream, Fn&& fn) {
    cudaGraph_t graph = nullptr;
    FANOUT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
        fn();
    } catch (...) {
        cudaStreamEndCapture(stream, &graph);  // fails when fn's failure invalidated the capture
        if (graph != nullptr) cudaGraphDestroy(graph);
        (void)cudaGetLastError();  // fn's error is the one to report, not the capture's end
        throw;
    }
    FANOUT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    FANOUT_CUDA_CHECK(instantiated);
    return exec;
}

}  // namespace fanout

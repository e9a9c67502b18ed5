// Programmatic dependent launch (PDL) for the small kernels between a layer's GEMMs.
//
// launch_pdl starts a kernel with a programmatic dependency on the previous kernel in the stream:
// its CTAs may be scheduled once every CTA of that kernel has let dependents launch (pdl_enter(),
// the FP8 GEMM's grid_launch_dependents()) or exited, instead of after that kernel has drained,
// so the launch latency between two kernels overlaps the first one's tail. The price is a rule:
// every kernel launched this way calls pdl_enter() before it reads or writes global memory — only
// weights, which no kernel writes, may be read before it. pdl_enter() waits until the grids it
// depends on have completed and their writes are visible, then lets the next kernel launch in
// turn. In a kernel launched without the attribute the wait returns at once. Every kernel of the
// chain waits, so a kernel's wait also covers the kernels before its predecessor.
// tests/ops/pdl_cuda_test.cc checks that the kernels wait.
//
// Include only from .cu files compiled for sm_90a.
#pragma once

#include <cuda_runtime.h>

#include "fanout/core/cuda_check.h"
#include "fanout/ops/sm90.cuh"

namespace fanout::ops {

__device__ __forceinline__ void pdl_enter() {
    sm90::grid_dependency_wait();
    sm90::grid_launch_dependents();
}

// kernel<<<grid, block, smem, stream>>>(args...) with the programmatic dependency; the kernel must
// begin with pdl_enter().
template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args... args) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    FANOUT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...));
}

}  // namespace fanout::ops

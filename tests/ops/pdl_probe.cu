// Kernels for pdl_cuda_test.cc (pdl_probe.h), kept out of the .cc so that it builds with the host
// compiler.
#include <cstdint>

#include "fanout/ops/pdl.cuh"
#include "pdl_probe.h"

namespace fanout::testing {
namespace {

__device__ uint64_t now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void late_copy_kernel(const uint8_t* src, uint8_t* dst, size_t bytes, uint64_t spin_ns) {
    ops::pdl_enter();
    const uint64_t start = now_ns();
    while (now_ns() - start < spin_ns) {
    }
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < bytes; i += size_t(gridDim.x) * blockDim.x)
        dst[i] = src[i];
}

// No pdl_enter(): the race the rule forbids, on purpose.
__global__ void racy_copy_kernel(const uint8_t* src, uint8_t* dst, size_t bytes) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < bytes; i += size_t(gridDim.x) * blockDim.x)
        dst[i] = src[i];
}

}  // namespace

void launch_late_copy(const void* src, void* dst, size_t bytes, int spin_us, cudaStream_t stream) {
    // One CTA: the dependents find the rest of the GPU free while it spins.
    ops::launch_pdl(late_copy_kernel, 1, 256, 0, stream, static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst),
                    bytes, uint64_t(spin_us) * 1000);
}

void launch_racy_copy(const void* src, void* dst, size_t bytes, cudaStream_t stream) {
    ops::launch_pdl(racy_copy_kernel, 1, 256, 0, stream, static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst),
                    bytes);
}

void warm_up_probe() {
    launch_late_copy(nullptr, nullptr, 0, 0, nullptr);
    launch_racy_copy(nullptr, nullptr, 0, nullptr);
    FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace fanout::testing

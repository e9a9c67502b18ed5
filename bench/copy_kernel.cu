// A device-to-device copy with 16-byte accesses and a grid-stride loop: the memory-bandwidth
// ceiling of the kernel benchmarks (cudaMemcpy's device-to-device path reaches ~2.8 of the
// H200's ~4.3 TB/s, so it would understate the ceiling). fmt-free: built by nvcc.
#include <cuda_runtime.h>

#include <cstddef>

namespace {

__global__ void copy16(const int4* __restrict__ src, int4* __restrict__ dst, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        dst[i] = src[i];
}

__global__ void empty_kernel() {}

}  // namespace

// One block that does nothing: launched between two calls without a programmatic dependency, it
// makes the second wait for the first to finish (`bench kernels --serial`).
void launch_empty(cudaStream_t stream) { empty_kernel<<<1, 32, 0, stream>>>(); }

// Copies `bytes` (a multiple of 16) from src to dst on `stream`.
void launch_copy16(const void* src, void* dst, size_t bytes, cudaStream_t stream) {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    copy16<<<sms * 8, 512, 0, stream>>>(static_cast<const int4*>(src), static_cast<int4*>(dst), bytes / 16);
}

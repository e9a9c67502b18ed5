// Device stand-ins for the GPU EP tests (ep_gpu_test.cc), kept out of the .cc so that it builds
// with the host compiler: the routed experts of ep_check.h (so a captured step can run its experts
// without the host) and a memory-bound kernel playing the shared expert.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace {

// out[e, i, c] = bf16((first payload byte of received row (e, i) + (expert_begin + e) + c) / 64)
// for i < min(counts[e], max_m): testing::expert_value, computed on the device.
__global__ void stand_in_experts(const int32_t* counts, const uint8_t* tokens, int payload_bytes, int max_m, int hidden,
                                 int expert_begin, uint16_t* out) {
    const int e = blockIdx.y;
    const int rows = min(max(counts[e], 0), max_m);
    for (int i = blockIdx.x; i < rows; i += gridDim.x) {
        const size_t row = size_t(e) * max_m + i;
        const float first = float(tokens[row * payload_bytes]);
        for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
            const __nv_bfloat16 v = __float2bfloat16_rn((first + float(expert_begin + e) + float(c)) / 64.0f);
            out[row * hidden + c] = *reinterpret_cast<const uint16_t*>(&v);
        }
    }
}

__global__ void busy_copy(const int4* __restrict__ src, int4* __restrict__ dst, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        dst[i] = src[i];
}

}  // namespace

namespace fanout::comm::testing {

void launch_stand_in_experts(const int32_t* counts, const void* tokens, int payload_bytes, int local_experts, int max_m,
                             int hidden, int expert_begin, uint16_t* out, cudaStream_t stream) {
    stand_in_experts<<<dim3(64, local_experts), 256, 0, stream>>>(counts, static_cast<const uint8_t*>(tokens),
                                                                  payload_bytes, max_m, hidden, expert_begin, out);
}

void launch_busy_copy(const void* src, void* dst, size_t bytes, cudaStream_t stream) {
    int device = 0, sms = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    // Half an SM's threads per SM: enough to stream at close to full bandwidth, and room left for
    // the communication kernels running beside it (as a real shared-expert GEMM leaves).
    busy_copy<<<sms * 2, 512, 0, stream>>>(static_cast<const int4*>(src), static_cast<int4*>(dst), bytes / 16);
}

}  // namespace fanout::comm::testing

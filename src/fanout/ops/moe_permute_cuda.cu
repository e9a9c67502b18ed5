// MoE permute / unpermute on the device (moe_permute.h). Permute: a block per (local expert, row
// chunk) scans the T·K choices with a block-wide ballot prefix sum — so each expert's rows come out
// in (t, k) order, exactly the CPU reference's, with no atomics — keeps the expert's token list in
// shared memory and copies its share of the rows (16-byte vectors) and scales. Unpermute: a block
// per (token, 1024-value chunk) sums its weighted expert rows in f32. Only fmt-free headers here.
#include <cuda_bf16.h>

#include <string>

#include "fanout/core/cuda_check.h"
#include "fanout/ops/fp8_constants.h"
#include "fanout/ops/moe_permute.h"

namespace fanout::ops {
namespace {

constexpr int kThreads = 256, kMaxRows = 4096, kRowChunks = 8, kMaxK = 32;
// Un-permute: a block per (token, chunk of the row), so a decode step of a few tokens still
// spreads over the GPU.
constexpr int kUnpermuteChunk = 1024;

__global__ void __launch_bounds__(kThreads)
    moe_permute_kernel(const uint8_t* __restrict__ x, const float* __restrict__ sx, const int32_t* __restrict__ idx,
                       int T, int K, int D, int expert_begin, int num_local, int max_m, uint8_t* __restrict__ out_x,
                       float* __restrict__ out_s, int32_t* __restrict__ counts, int32_t* __restrict__ slot) {
    __shared__ int token_of_row[kMaxRows];
    __shared__ int warp_totals[kThreads / 32];
    __shared__ int running;
    const int e = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const bool writer = blockIdx.y == 0;  // one block per expert writes its slots and count
    if (threadIdx.x == 0) running = 0;
    __syncthreads();
    for (int i0 = 0; i0 < T * K; i0 += kThreads) {
        const int i = i0 + static_cast<int>(threadIdx.x);
        const int local = i < T * K ? idx[i] - expert_begin : -1;
        const bool match = local == e;
        const unsigned ballot = __ballot_sync(0xffffffffu, match);
        if (lane == 0) warp_totals[warp] = __popc(ballot);
        __syncthreads();
        int before = running;
        for (int w = 0; w < warp; ++w) before += warp_totals[w];
        const int r = before + __popc(ballot & ((1u << lane) - 1u));
        if (match) {
            if (r < max_m) token_of_row[r] = i / K;
            if (writer) slot[i] = r < max_m ? e * max_m + r : -1;
        } else if (writer && e == 0 && i < T * K && (local < 0 || local >= num_local)) {
            slot[i] = -1;  // not a local expert: the first expert's writer marks it
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int total = 0;
            for (int w = 0; w < kThreads / 32; ++w) total += warp_totals[w];
            running += total;
        }
        __syncthreads();
    }
    if (writer && threadIdx.x == 0) counts[e] = running;
    const int rows = min(running, max_m);
    const int nb = (D + static_cast<int>(kFp8Block) - 1) / static_cast<int>(kFp8Block);
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        const size_t src = static_cast<size_t>(token_of_row[r]), dst = static_cast<size_t>(e) * max_m + r;
        if (D % 16 == 0) {
            const uint4* s4 = reinterpret_cast<const uint4*>(x + src * D);
            uint4* d4 = reinterpret_cast<uint4*>(out_x + dst * D);
            for (int c = threadIdx.x; c < D / 16; c += kThreads) d4[c] = s4[c];
        } else {
            for (int c = threadIdx.x; c < D; c += kThreads) out_x[dst * D + c] = x[src * D + c];
        }
        if (sx != nullptr)
            for (int b = threadIdx.x; b < nb; b += kThreads) out_s[dst * nb + b] = sx[src * nb + b];
    }
}

__global__ void __launch_bounds__(kThreads)
    moe_unpermute_kernel(const __nv_bfloat16* __restrict__ y, const int32_t* __restrict__ slot,
                         const float* __restrict__ weight, int K, int D, const __nv_bfloat16* base,
                         __nv_bfloat16* out) {
    __shared__ int rows[kMaxK];
    __shared__ float w[kMaxK];
    const size_t t = blockIdx.x;
    if (threadIdx.x < K) {
        rows[threadIdx.x] = slot[t * K + threadIdx.x];
        w[threadIdx.x] = weight[t * K + threadIdx.x];
    }
    __syncthreads();
    const int end = min(D, static_cast<int>(blockIdx.y + 1) * kUnpermuteChunk);
    for (int d = blockIdx.y * kUnpermuteChunk + threadIdx.x; d < end; d += kThreads) {
        float acc = base != nullptr ? __bfloat162float(base[t * D + d]) : 0.0f;
        for (int k = 0; k < K; ++k)
            if (rows[k] >= 0) acc += w[k] * __bfloat162float(y[static_cast<size_t>(rows[k]) * D + d]);
        out[t * D + d] = __float2bfloat16(acc);  // out may alias base: same thread, same element
    }
}

}  // namespace

void launch_moe_permute_masked(const uint8_t* x, const float* sx, const int32_t* topk_idx, int T, int K, int D,
                               int expert_begin, int num_local, int max_m, uint8_t* out_x, float* out_s,
                               int32_t* counts, int32_t* slot, void* cuda_stream) {
    FANOUT_DEVICE_REQUIRE(num_local > 0 && max_m > 0 && max_m <= kMaxRows && K > 0 && D > 0,
                          "moe_permute: num_local " + std::to_string(num_local) + ", max_m " + std::to_string(max_m) +
                              " (at most " + std::to_string(kMaxRows) + "), K " + std::to_string(K) + ", D " +
                              std::to_string(D));
    const dim3 grid(num_local, kRowChunks);
    moe_permute_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(cuda_stream)>>>(
        x, sx, topk_idx, T, K, D, expert_begin, num_local, max_m, out_x, out_s, counts, slot);
    FANOUT_CUDA_CHECK_LAUNCH("moe_permute_kernel");
}

void launch_moe_permute_masked_bf16(const uint16_t* x, const int32_t* topk_idx, int T, int K, int D, int expert_begin,
                                    int num_local, int max_m, uint16_t* out_x, int32_t* counts, int32_t* slot,
                                    void* cuda_stream) {
    // The kernel moves bytes: a bf16 row is 2·D of them, and there are no scales.
    launch_moe_permute_masked(reinterpret_cast<const uint8_t*>(x), nullptr, topk_idx, T, K, 2 * D, expert_begin,
                              num_local, max_m, reinterpret_cast<uint8_t*>(out_x), nullptr, counts, slot, cuda_stream);
}

void launch_moe_unpermute(const uint16_t* y, const int32_t* slot, const float* weight, int T, int K, int D,
                          const uint16_t* base, uint16_t* out, void* cuda_stream) {
    FANOUT_DEVICE_REQUIRE(K > 0 && K <= kMaxK && D > 0,
                          "moe_unpermute: K " + std::to_string(K) + " (at most 32), D " + std::to_string(D));
    if (T <= 0) return;
    const dim3 grid(T, (D + kUnpermuteChunk - 1) / kUnpermuteChunk);
    moe_unpermute_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(cuda_stream)>>>(
        reinterpret_cast<const __nv_bfloat16*>(y), slot, weight, K, D, reinterpret_cast<const __nv_bfloat16*>(base),
        reinterpret_cast<__nv_bfloat16*>(out));
    FANOUT_CUDA_CHECK_LAUNCH("moe_unpermute_kernel");
}

}  // namespace fanout::ops

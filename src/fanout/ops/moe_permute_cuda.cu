// MoE permute / unpermute on the device (moe_permute.h).
//
// Permute, two kernels, no atomics, so every row lands where the CPU reference puts it:
//  1. rank: a block per local expert walks the T·K choices in passes of kThreads·kRankPerThread
//     (each thread a run of adjacent choices) with a block-wide prefix sum, so its choices get
//     their ranks in (t, k) order; it writes each rank into slot (scratch until step 2) and the
//     expert's count. No per-expert row limit: nothing is kept in shared memory.
//  2. place: a block per kPlacePerBlock choices first rebuilds the spill segments' offsets from
//     the counts (a block-wide scan over the local experts, in shared memory — cheaper than a
//     third launch and a scratch buffer), fills its grid-strided share of spill_block_expert,
//     turns each of its choices' rank into the row (masked part, or its expert's spill segment),
//     writes slot, and copies the rows (16-byte vectors when the widths allow) and scales.
// The grids depend on T, K and num_local only, so a captured graph replays for any routing.
// Unpermute: a block per (token, 1024-value chunk) sums its weighted expert rows in f32.
// Only fmt-free headers here.
#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "fanout/core/block_scan.cuh"
#include "fanout/core/cuda_check.h"
#include "fanout/core/search.cuh"
#include "fanout/ops/fp8_constants.h"
#include "fanout/ops/moe_permute.h"
#include "fanout/ops/pdl.cuh"

namespace fanout::ops {
namespace {

constexpr int kThreads = 256;
constexpr int kRankPerThread = 8;  // adjacent choices per thread in one pass of the rank kernel
constexpr int kPlacePerBlock = 8;  // choices per block of the place kernel
constexpr int kMaxLocal = 8192;    // the place kernel keeps num_local + 1 offsets in shared memory
constexpr int kMaxK = 32;
// Un-permute: a block per (token, chunk of the row), so a decode step of a few tokens still
// spreads over the GPU.
constexpr int kUnpermuteChunk = 1024;

// After this kernel: counts[e] = local expert e's choices, and slot[i] = the rank of choice i
// among its expert's choices in (t, k) order, for every choice routed to a local expert (the
// others' slots are untouched).
__global__ void __launch_bounds__(kThreads)
    moe_rank_kernel(const int32_t* __restrict__ idx, int num_choices, int expert_begin, int32_t* __restrict__ counts,
                    int32_t* __restrict__ rank) {
    pdl_enter();
    const int expert = expert_begin + static_cast<int>(blockIdx.x);
    int running = 0;  // the expert's choices in earlier passes
    for (int i0 = 0; i0 < num_choices; i0 += kThreads * kRankPerThread) {
        const int first = i0 + static_cast<int>(threadIdx.x) * kRankPerThread;
        unsigned match = 0;  // bit j: choice first + j is this expert's
#pragma unroll
        for (int j = 0; j < kRankPerThread; ++j)
            if (first + j < num_choices && __ldg(idx + first + j) == expert) match |= 1u << j;
        int total;
        int r = running + block_exclusive_scan<kThreads>(__popc(match), total);
#pragma unroll
        for (int j = 0; j < kRankPerThread; ++j)
            if (match >> j & 1u) rank[first + j] = r++;
        running += total;
    }
    if (threadIdx.x == 0) counts[blockIdx.x] = running;
}

// begin[e] = the first row of local expert e's spill segment within the spill region (the
// padded spills of the experts before it), begin[num_local] = the rows all segments use.
__device__ void spill_segments(const int32_t* __restrict__ counts, int num_local, int cap, int* begin) {
    int carry = 0;
    for (int e0 = 0; e0 < num_local; e0 += kThreads) {  // uniform: every thread takes part in the scan
        const int e = e0 + static_cast<int>(threadIdx.x);
        const int extra = e < num_local ? max(counts[e] - cap, 0) : 0;
        int total;
        const int before =
            block_exclusive_scan<kThreads>((extra + kMoeSpillBlock - 1) / kMoeSpillBlock * kMoeSpillBlock, total);
        if (e < num_local) begin[e] = carry + before;
        carry += total;
    }
    if (threadIdx.x == 0) begin[num_local] = carry;
    __syncthreads();
}

__global__ void __launch_bounds__(kThreads)
    moe_place_kernel(const uint8_t* __restrict__ x, const float* __restrict__ sx, const int32_t* __restrict__ idx,
                     int num_choices, int K, int row_bytes, int nb, int expert_begin, int num_local, int cap,
                     int spill_rows, uint8_t* __restrict__ out_x, float* __restrict__ out_s,
                     const int32_t* __restrict__ counts, int32_t* __restrict__ spill_block_expert,
                     int32_t* __restrict__ slot) {
    pdl_enter();
    extern __shared__ int spill_begin[];  // [num_local + 1]
    __shared__ int src_token[kPlacePerBlock], dst_row[kPlacePerBlock];
    spill_segments(counts, num_local, cap, spill_begin);
    const int used = spill_begin[num_local];
    const int64_t num_blocks = spill_rows / kMoeSpillBlock;
    for (int64_t j = int64_t{blockIdx.x} * kThreads + threadIdx.x; j < num_blocks; j += int64_t{gridDim.x} * kThreads) {
        const int row =
            static_cast<int>(j) * kMoeSpillBlock;  // a segment's blocks all hold choices: padding < 128 rows
        spill_block_expert[j] = row < used ? segment_of(spill_begin, num_local, row) : -1;
    }
    if (threadIdx.x < kPlacePerBlock) {
        const int i = static_cast<int>(blockIdx.x) * kPlacePerBlock + static_cast<int>(threadIdx.x);
        int dst = -1;
        if (i < num_choices) {
            const int e = idx[i] - expert_begin;
            if (e >= 0 && e < num_local) {
                const int r = slot[i];  // the rank kernel's
                const int spilled = spill_begin[e] + (r - cap);
                // spilled < spill_rows whenever the tokens' experts are distinct (moe_spill_rows);
                // the test only keeps a broken routing from writing out of bounds.
                dst = r < cap ? e * cap + r : spilled < spill_rows ? num_local * cap + spilled : -1;
            }
            slot[i] = dst;
        }
        src_token[threadIdx.x] = i / K;
        dst_row[threadIdx.x] = dst;
    }
    __syncthreads();
    const bool vec =
        row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(out_x) % 16 == 0;
    for (int c = 0; c < kPlacePerBlock; ++c) {
        if (dst_row[c] < 0) continue;
        const size_t src = static_cast<size_t>(src_token[c]), dst = static_cast<size_t>(dst_row[c]);
        if (vec) {
            const uint4* s4 = reinterpret_cast<const uint4*>(x + src * row_bytes);
            uint4* d4 = reinterpret_cast<uint4*>(out_x + dst * row_bytes);
            for (int v = threadIdx.x; v < row_bytes / 16; v += kThreads) d4[v] = s4[v];
        } else {
            for (int b = threadIdx.x; b < row_bytes; b += kThreads) out_x[dst * row_bytes + b] = x[src * row_bytes + b];
        }
        if (sx != nullptr)
            for (int b = threadIdx.x; b < nb; b += kThreads) out_s[dst * nb + b] = sx[src * nb + b];
    }
}

__global__ void __launch_bounds__(kThreads)
    moe_unpermute_kernel(const __nv_bfloat16* __restrict__ y, const int32_t* __restrict__ slot,
                         const float* __restrict__ weight, int K, int D, const __nv_bfloat16* base,
                         __nv_bfloat16* out) {
    pdl_enter();
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

// Both permutes: rows of `row_bytes` bytes, 1×128 scales of `D` values when sx is given.
void permute_rows(const uint8_t* x, const float* sx, const int32_t* topk_idx, int T, int K, int row_bytes, int nb,
                  int expert_begin, int num_local, int cap, int spill_rows, uint8_t* out_x, float* out_s,
                  int32_t* counts, int32_t* spill_block_expert, int32_t* slot, void* cuda_stream) {
    const int64_t need = moe_spill_rows(T, K, num_local, cap);
    FANOUT_DEVICE_REQUIRE(T >= 0 && K > 0 && row_bytes > 0 && num_local > 0 && num_local <= kMaxLocal && cap >= 0 &&
                              spill_rows % kMoeSpillBlock == 0 && spill_rows >= need &&
                              static_cast<int64_t>(num_local) * cap + spill_rows < (int64_t{1} << 31) &&
                              static_cast<int64_t>(T) * K < (int64_t{1} << 31),
                          "moe_permute: T " + std::to_string(T) + ", K " + std::to_string(K) + ", row bytes " +
                              std::to_string(row_bytes) + ", num_local " + std::to_string(num_local) + " (at most " +
                              std::to_string(kMaxLocal) + "), cap " + std::to_string(cap) + ", spill_rows " +
                              std::to_string(spill_rows) + " (a multiple of 128, at least " + std::to_string(need) +
                              ")");
    const cudaStream_t stream = static_cast<cudaStream_t>(cuda_stream);
    const int choices = T * K;
    launch_pdl(moe_rank_kernel, num_local, kThreads, 0, stream, topk_idx, choices, expert_begin, counts, slot);
    // At least one block, so spill_block_expert is written even for an empty step.
    const int blocks = std::max(1, (choices + kPlacePerBlock - 1) / kPlacePerBlock);
    const size_t smem = (static_cast<size_t>(num_local) + 1) * sizeof(int);
    launch_pdl(moe_place_kernel, blocks, kThreads, smem, stream, x, sx, topk_idx, choices, K, row_bytes, nb,
               expert_begin, num_local, cap, spill_rows, out_x, out_s, counts, spill_block_expert, slot);
}

}  // namespace

void launch_moe_permute(const uint8_t* x, const float* sx, const int32_t* topk_idx, int T, int K, int D,
                        int expert_begin, int num_local, int cap, int spill_rows, uint8_t* out_x, float* out_s,
                        int32_t* counts, int32_t* spill_block_expert, int32_t* slot, void* cuda_stream) {
    const int nb = static_cast<int>((D + kFp8Block - 1) / kFp8Block);
    permute_rows(x, sx, topk_idx, T, K, D, nb, expert_begin, num_local, cap, spill_rows, out_x, out_s, counts,
                 spill_block_expert, slot, cuda_stream);
}

void launch_moe_permute_bf16(const uint16_t* x, const int32_t* topk_idx, int T, int K, int D, int expert_begin,
                             int num_local, int cap, int spill_rows, uint16_t* out_x, int32_t* counts,
                             int32_t* spill_block_expert, int32_t* slot, void* cuda_stream) {
    // The kernels move bytes: a bf16 row is 2·D of them, and there are no scales.
    permute_rows(reinterpret_cast<const uint8_t*>(x), nullptr, topk_idx, T, K, 2 * D, 0, expert_begin, num_local, cap,
                 spill_rows, reinterpret_cast<uint8_t*>(out_x), nullptr, counts, spill_block_expert, slot, cuda_stream);
}

void launch_moe_unpermute(const uint16_t* y, const int32_t* slot, const float* weight, int T, int K, int D,
                          const uint16_t* base, uint16_t* out, void* cuda_stream) {
    FANOUT_DEVICE_REQUIRE(K > 0 && K <= kMaxK && D > 0,
                          "moe_unpermute: K " + std::to_string(K) + " (at most 32), D " + std::to_string(D));
    if (T <= 0) return;
    const dim3 grid(T, (D + kUnpermuteChunk - 1) / kUnpermuteChunk);
    launch_pdl(moe_unpermute_kernel, grid, kThreads, 0, static_cast<cudaStream_t>(cuda_stream),
               reinterpret_cast<const __nv_bfloat16*>(y), slot, weight, K, D,
               reinterpret_cast<const __nv_bfloat16*>(base), reinterpret_cast<__nv_bfloat16*>(out));
}

}  // namespace fanout::ops

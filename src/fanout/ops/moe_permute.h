// MoE token permutation into the experts' rows of one step, and the weighted un-permute (combine).
//
// The layout (one buffer of num_local·cap + spill_rows rows, rows of D values):
//   rows [0, num_local·cap)             the masked layout: local expert e's first `cap` choices, in
//                                       (t, k) order, at rows e·cap + r — the masked grouped GEMM's
//                                       input [num_local, cap, D] (decode; CUDA-graph friendly);
//   rows [num_local·cap, + spill_rows)  the contiguous layout of every choice past its expert's cap:
//                                       each spilling expert a segment padded to a multiple of 128
//                                       rows, segments in expert order, choices in (t, k) order
//                                       inside — DeepGEMM's contiguous grouped GEMM input, with
//                                       spill_block_expert[j] the local expert of rows
//                                       [128·j, 128·j + 128) of the region, -1 past the last segment.
// cap = 0 is the pure contiguous layout (prefill); cap >= T the pure masked one (no expert can
// spill). Nothing is dropped: every choice routed to a local expert (expert_begin <= id <
// expert_begin + num_local) gets a row. counts[e] is the expert's full count (it may exceed cap:
// the masked kernels clamp it to cap). slot[t·K + k] is the choice's row, -1 for another rank's
// expert. Rows no choice names (past a count in the masked part, a segment's padding) are left
// as they were. Same order on the CPU and the GPU, so results do not depend on thread timing.
//
// Precondition: each token names K distinct experts (the router's top-k), so an expert gets at
// most T choices; moe_spill_rows() relies on it.
//
// unpermute: out[t] = base[t] + Σ_k weight[t, k] · y[slot[t, k]] over the valid slots, in f32,
// written as bf16 (base may be null, out may alias base).
// fmt-free, so CUDA translation units can include it.
#pragma once

#include <algorithm>
#include <cstdint>

namespace fanout::ops {

// Rows of a spill segment round up to the contiguous grouped GEMM's 128-row blocks.
constexpr int kMoeSpillBlock = 128;

// The rows the spill region needs at most for a step of T tokens (a multiple of 128), known on
// the host before the routing. An expert spills only with more than `cap` choices, so at most
// n ≤ min(num_local, T·K / (cap + 1)) experts spill; together they spill at most T·K − n·cap
// choices and pad at most 127 rows each: rows ≤ T·K + n·(127 − cap), largest at the largest n when
// cap ≤ 127 and at n = 1 otherwise. None spill when cap ≥ T (an expert gets at most T choices).
constexpr int64_t moe_spill_rows(int64_t T, int64_t K, int64_t num_local, int64_t cap) {
    if (T <= 0 || K <= 0 || num_local <= 0 || cap >= T) return 0;
    const int64_t choices = T * K;
    const int64_t most = std::min(num_local, choices / (cap + 1));
    if (most == 0) return 0;
    const int64_t n = cap <= kMoeSpillBlock - 1 ? most : 1;
    const int64_t rows = choices + n * (kMoeSpillBlock - 1 - cap);
    return (rows + kMoeSpillBlock - 1) / kMoeSpillBlock * kMoeSpillBlock;
}

// The per-expert rows of the masked part for a step of T tokens routed to K of E experts: four
// times the mean under uniform routing (T·K / E), at least 16, a multiple of 16, and never more
// than T (an expert gets at most T choices). An expert past it spills into the contiguous part.
constexpr int64_t moe_masked_cap(int64_t T, int64_t K, int64_t E) {
    if (T <= 0) return 0;
    const int64_t mean = (T * K + std::max<int64_t>(E, 1) - 1) / std::max<int64_t>(E, 1);
    const int64_t headroom = (4 * mean + 15) / 16 * 16;
    return std::min(T, std::max<int64_t>(16, headroom));
}

// x: [T, D] e4m3 (or any rows of D bytes); sx: [T, ceil(D/128)] f32, or null (no scales);
// topk_idx: [T, K]; out_x: [num_local·cap + spill_rows, D]; out_s: [num_local·cap + spill_rows,
// ceil(D/128)] (unused without sx); counts: [num_local]; spill_block_expert: [spill_rows / 128];
// slot: [T, K]. spill_rows: a multiple of 128, at least moe_spill_rows(T, K, num_local, cap).
void moe_permute_cpu(const uint8_t* x, const float* sx, const int32_t* topk_idx, int T, int K, int D, int expert_begin,
                     int num_local, int cap, int spill_rows, uint8_t* out_x, float* out_s, int32_t* counts,
                     int32_t* spill_block_expert, int32_t* slot);

// y: [rows, D] bf16 (rows: every slot's row); slot, weight: [T, K]; base, out: [T, D] bf16 (uint16_t storage).
void moe_unpermute_cpu(const uint16_t* y, const int32_t* slot, const float* weight, int T, int K, int D,
                       const uint16_t* base, uint16_t* out);

#ifdef FANOUT_WITH_CUDA
// The same on the device, in the CPU reference's order: FP8 rows and their 1×128 scales. Graph-safe:
// no host sync, no scratch, the grid depends on T, K and num_local only; counts, slots and
// spill_block_expert stay on the device. Two kernels: a block per local expert ranks its choices
// (counts; the ranks go to slot), then a copy kernel over the choices places the rows, rewrites
// slot and fills spill_block_expert. num_local ≤ 8192.
void launch_moe_permute(const uint8_t* x, const float* sx, const int32_t* topk_idx, int T, int K, int D,
                        int expert_begin, int num_local, int cap, int spill_rows, uint8_t* out_x, float* out_s,
                        int32_t* counts, int32_t* spill_block_expert, int32_t* slot, void* cuda_stream);
// bf16 rows (bf16 checkpoints' experts): the same order, counts, slots and blocks, without scales.
void launch_moe_permute_bf16(const uint16_t* x, const int32_t* topk_idx, int T, int K, int D, int expert_begin,
                             int num_local, int cap, int spill_rows, uint16_t* out_x, int32_t* counts,
                             int32_t* spill_block_expert, int32_t* slot, void* cuda_stream);
void launch_moe_unpermute(const uint16_t* y, const int32_t* slot, const float* weight, int T, int K, int D,
                          const uint16_t* base, uint16_t* out, void* cuda_stream);
#endif

}  // namespace fanout::ops

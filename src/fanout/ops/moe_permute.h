// MoE token permutation for the masked grouped GEMM, and the weighted un-permute (combine).
//
// permute: each (token t, choice k) routed to a local expert e (expert_begin <= id < expert_begin +
// num_local) copies token t's FP8 row and its 1×128 scales to row r of expert e in the masked
// layout [num_local, max_m, D], where r counts that expert's earlier choices in (t, k) order — the
// CPU model's stable order, so results do not depend on thread timing. counts[e] is the expert's
// true number of rows (it may exceed max_m: those rows are dropped and their slot is -1, and the
// grouped GEMM clamps to max_m); slot[t·K + k] = e·max_m + r, or -1 when the expert is not local
// or the row was dropped.
// unpermute: out[t] = base[t] + Σ_k weight[t, k] · y[slot[t, k]] over the valid slots, in f32,
// written as bf16 (base may be null, out may alias base).
// fmt-free, so CUDA translation units can include it.
#pragma once

#include <cstdint>

namespace fanout::ops {

// x: [T, D] e4m3; sx: [T, ceil(D/128)]; topk_idx: [T, K]; out_x: [num_local, max_m, D];
// out_s: [num_local, max_m, ceil(D/128)]; counts: [num_local]; slot: [T, K].
void moe_permute_masked_cpu(const uint8_t* x, const float* sx, const int32_t* topk_idx, int T, int K, int D,
                            int expert_begin, int num_local, int max_m, uint8_t* out_x, float* out_s, int32_t* counts,
                            int32_t* slot);

// y: [num_local · max_m, D] bf16; slot, weight: [T, K]; base, out: [T, D] bf16 (uint16_t storage).
void moe_unpermute_cpu(const uint16_t* y, const int32_t* slot, const float* weight, int T, int K, int D,
                       const uint16_t* base, uint16_t* out);

#ifdef FANOUT_WITH_CUDA
// The same on the device; graph-safe (no host sync, counts and slots stay on the device).
void launch_moe_permute_masked(const uint8_t* x, const float* sx, const int32_t* topk_idx, int T, int K, int D,
                               int expert_begin, int num_local, int max_m, uint8_t* out_x, float* out_s,
                               int32_t* counts, int32_t* slot, void* cuda_stream);
// bf16 rows (bf16 checkpoints' experts): the same order, counts and slots, without scales.
void launch_moe_permute_masked_bf16(const uint16_t* x, const int32_t* topk_idx, int T, int K, int D, int expert_begin,
                                    int num_local, int max_m, uint16_t* out_x, int32_t* counts, int32_t* slot,
                                    void* cuda_stream);
void launch_moe_unpermute(const uint16_t* y, const int32_t* slot, const float* weight, int T, int K, int D,
                          const uint16_t* base, uint16_t* out, void* cuda_stream);
#endif

}  // namespace fanout::ops

// Multi-head latent attention (MLA) over the paged latent KV cache, two mathematically equal forms.
//
// The cache holds, per token and layer, entry = [c_kv (kv_lora_rank, after kv_a_layernorm) |
// k_pe (qk_rope_head_dim, roped)]. kv_b_proj W: [H * (nope + v), kv_lora]; for head h its rows
// h*(nope+v) + [0, nope) are W_UK[h] and the next v rows are W_UV[h].
//
// * MHA form (prefill): k_nope, v = split(c_kv · Wᵀ) per head; scores = q_nope·k_nope + q_pe·k_pe.
// * Absorbed form (decode): q_lat = W_UK[h]ᵀ q_nope; scores = q_lat·c_kv + q_pe·k_pe;
//   o_lat = Σ p c_kv; out = W_UV[h] o_lat. No per-token expansion of the cache.
// A query at position p sees the keys at positions 0..p of its own request.
#pragma once

#include <cstdint>

#include "fanout/core/tensor.h"
#include "fanout/core/thread_pool.h"
#include "fanout/ops/linear.h"

namespace fanout::ops {

// One layer of the paged latent cache: [num_blocks, block_size, entry_dim] in f32 or bf16.
struct LatentCache {
    void* data = nullptr;
    DType dtype = DType::kF32;
    int64_t num_blocks = 0;
    int64_t block_size = 64;
    int64_t entry_dim = 0;
};

// Where a step's query tokens belong. T = query_start[num_requests].
struct AttentionMetadata {
    int64_t num_requests = 0;
    const int32_t* query_start = nullptr;  // [R + 1]
    const int32_t* kv_len = nullptr;       // [R] tokens in the cache, this step's included
    const int32_t* block_table = nullptr;  // [R, max_blocks]
    int64_t max_blocks = 0;
    const int32_t* positions = nullptr;  // [T]
};

// Slot of a token: block_table[r][pos / block_size] * block_size + pos % block_size.
// entries: [T, entry_dim] f32; slots: [T].
void kv_append(LatentCache& cache, const Tensor& entries, const int32_t* slots, const Stream& s);

// Reads cache entry `slot` into out[entry_dim] as f32.
void kv_read(const LatentCache& cache, int64_t slot, float* out);

// q: [T, H, nope + rope] f32 (rope part roped); out: [T, H, v] f32.
void mla_attention_mha(const Tensor& q, const LinearWeight& kv_b, Fp8Mode mode, const LatentCache& cache,
                       const AttentionMetadata& meta, int64_t kv_lora, int64_t nope, int64_t v_dim, float scale,
                       Tensor& out, const Stream& s);

void mla_attention_absorbed(const Tensor& q, const LinearWeight& kv_b, const LatentCache& cache,
                            const AttentionMetadata& meta, int64_t kv_lora, int64_t nope, int64_t v_dim, float scale,
                            Tensor& out, const Stream& s);

}  // namespace fanout::ops

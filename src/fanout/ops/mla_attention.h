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
#include "fanout/ops/fp8_constants.h"
#include "fanout/ops/linear.h"

namespace fanout::ops {

// One layer of the paged latent cache: [num_blocks, block_size] entries of entry_dim = kv_lora +
// rope values, in f32, bf16, or (kFP8E4M3) the FP8 entry of fp8_constants.h's MlaFp8Layout.
struct LatentCache {
    void* data = nullptr;
    DType dtype = DType::kF32;
    int64_t num_blocks = 0;
    int64_t block_size = 64;
    int64_t entry_dim = 0;
    int64_t kv_lora = 0;  // the latent's width within entry_dim (read by the FP8 entry)
    // Bytes of one entry; throws for a dtype the cache does not store or FP8 widths it cannot.
    int64_t entry_bytes() const;
    // The FP8 entry's layout (entry_bytes() checks that its widths are ones the format takes).
    MlaFp8Layout fp8_layout() const { return {kv_lora, entry_dim - kv_lora}; }
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

// The FP8 form of a cache entry (fp8_constants.h's MlaFp8Layout; the GPU decode kernel reads it at
// V3's widths: mla_attention_cuda.h): the kv_lora values in e4m3 with one f32 scale per 128 of
// them (value = e4m3 · scale; fp8_cache_scale: the group's largest magnitude / 448 rounded up to a
// bf16 value), then the rope values in bf16 (rotary angles keep their precision).
// entry: [kv_lora + rope] f32 -> out: [layout.entry_bytes()] bytes.
void quantize_latent_entry_fp8(const float* entry, const MlaFp8Layout& layout, uint8_t* out);
// in: [layout.entry_bytes()] bytes -> entry: [kv_lora + rope] f32 (e4m3 · scale exactly; the GPU
// kernels round the product to bf16 for the tensor cores).
void dequantize_latent_entry_fp8(const uint8_t* in, const MlaFp8Layout& layout, float* entry);

// Slot of a token: block_table[r][pos / block_size] * block_size + pos % block_size.
// entries: [T, entry_dim] f32 (rounded or quantized to the cache's dtype); slots: [T].
void kv_append(LatentCache& cache, const Tensor& entries, const int32_t* slots, const Stream& s);

// Reads cache entry `slot` into out[entry_dim] as f32 (an FP8 entry dequantized).
void kv_read(const LatentCache& cache, int64_t slot, float* out);

// q: [T, H, nope + rope] f32 (rope part roped); out: [T, H, v] f32.
void mla_attention_mha(const Tensor& q, const LinearWeight& kv_b, Fp8Mode mode, const LatentCache& cache,
                       const AttentionMetadata& meta, int64_t kv_lora, int64_t nope, int64_t v_dim, float scale,
                       Tensor& out, const Stream& s);

// q: [T, H, nope + rope] f32 as for the MHA form; out: [T, H, v] f32. Computes q_lat = W_UK[h]ᵀ q_nope, runs
// mla_latent_attention_cpu, and applies W_UV[h].
void mla_attention_absorbed(const Tensor& q, const LinearWeight& kv_b, const LatentCache& cache,
                            const AttentionMetadata& meta, int64_t kv_lora, int64_t nope, int64_t v_dim, float scale,
                            Tensor& out, const Stream& s);

// The latent core of the absorbed form (and the reference of the CUDA kernels in
// mla_attention_cuda.h): for query token t of request r and head h,
//   score(j) = scale · (q_lat[t, h] · c_kv[j] + q_pe[t, h] · k_pe[j])  for cached positions j ≤ positions[t],
//   out[t, h, :] = Σ_j softmax(score)(j) · c_kv[j]                      (kv_lora values),
// in f32 (a bf16 or FP8 cache is widened as it is read: kv_read). q_lat[t, h, :] lies at
// q_lat + t * q_lat_stride_t + h * q_lat_stride_h (kv_lora contiguous values), q_pe likewise
// (rope = cache.entry_dim - kv_lora values); out: [T, H, kv_lora] f32, contiguous.
void mla_latent_attention_cpu(const float* q_lat, int64_t q_lat_stride_t, int64_t q_lat_stride_h, const float* q_pe,
                              int64_t q_pe_stride_t, int64_t q_pe_stride_h, const LatentCache& cache,
                              const AttentionMetadata& meta, int64_t num_tokens, int64_t num_heads, int64_t kv_lora,
                              float scale, float* out, const Stream& s);

// The MHA form of one request's prefill chunk over K/V already expanded from the cache (the
// reference of mha_prefill_cuda.h): for query token i ∈ [0, num_tokens) at position
// ctx_len − num_tokens + i and head h,
//   score(j) = scale · (q[i, h, :nope] · k_nope[j, h] + q[i, h, nope:] · k_pe[j])  (keys j ≤ ctx_len − num_tokens + i),
//   out[i, h, :] = Σ_j softmax(score)(j) · v[j, h]                                 (v_dim values),
// in f32. q[i, h] (nope + rope contiguous values) lies at q + i * q_stride_t + h * q_stride_h;
// k_nope[j, h] at k_nope + j * k_stride_t + h * k_stride_h; k_pe[j] (shared by the heads) at
// k_pe + j * k_pe_stride_t; v[j, h] at v + j * v_stride_t + h * v_stride_h; out: [num_tokens,
// num_heads, v_dim] f32, contiguous.
void mha_prefill_cpu(const float* q, int64_t q_stride_t, int64_t q_stride_h, const float* k_nope, int64_t k_stride_t,
                     int64_t k_stride_h, const float* k_pe, int64_t k_pe_stride_t, const float* v, int64_t v_stride_t,
                     int64_t v_stride_h, int64_t num_tokens, int64_t ctx_len, int64_t num_heads, int64_t nope,
                     int64_t rope, int64_t v_dim, float scale, float* out, const Stream& s);

}  // namespace fanout::ops

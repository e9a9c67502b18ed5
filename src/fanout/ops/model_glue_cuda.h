// The small kernels the GPU model runner strings between its GEMMs: the embedding lookup, MLA's
// input side (q split into the k_b GEMM's head-major input and the roped q_pe; the kv latent's
// norm, RoPE and cache append in one kernel), the head-major ↔ token-major transposes, silu·mul on
// bf16, and the plain batched bf16 GEMM that bf16 checkpoints use for per-head and per-expert
// products. Every kernel has its CPU counterpart in the model's CPU path (rms_norm, rope_apply,
// kv_append, silu_mul, linear); tests/ops/glue_cuda_test.cc compares them.
//
// bf16 values are passed as uint16_t storage; fmt-free, so CUDA translation units can include it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fanout::ops {

#ifdef FANOUT_WITH_CUDA

// out[t] = table[tokens[t]] (bf16 rows of width D). Token ids are checked on the host before upload.
void launch_embed_bf16(const uint16_t* table, const int32_t* tokens, int T, int D, uint16_t* out, void* cuda_stream);

// RoPE's frequencies on the device (ops::RopeTable): inv_freq [rope / 2] f32 and YaRN's attention factor.
struct RopeDevice {
    const float* inv_freq = nullptr;
    int dim = 0;
    float attention_factor = 1.0f;
};

// q: [T, H, nope + rope] bf16 (q_b's output) -> q_pe: [T, H, rope], each head's rope part rotated
// by positions[t] (interleaved pairs, as rope_apply) for the absorbed attention; the nope parts
// stay where they are (the k_b GEMM reads them in place).
void launch_mla_q_rope(const uint16_t* q, int T, int H, int nope, const int32_t* positions, RopeDevice rope,
                       uint16_t* q_pe, void* cuda_stream);

// One layer of the device latent cache, one entry per slot: bf16 [slots, kv_lora + rope] values, or
// FP8 entries (fp8_constants.h's MlaFp8Layout: the latent in e4m3 with an f32 scale per 128 values,
// the rope part in bf16; kv_lora a multiple of 4, at most 2,048, and an even rope width) — exactly
// one of the two set.
struct DeviceLatentCache {
    uint16_t* bf16 = nullptr;
    uint8_t* fp8 = nullptr;
    bool is_fp8() const { return fp8 != nullptr; }
    void* entries() const { return is_fp8() ? static_cast<void*>(fp8) : static_cast<void*>(bf16); }
};

// kv_a's rows (stride `row_stride` elements): [latent (kv_lora) | k_pe (rope)] -> the cache entry
// [rms_norm(latent) · norm_w | rope(k_pe)] written at slot slots[t] — as bf16 values, or quantized
// as mla_attention.h's quantize_latent_entry_fp8 does (each group's scale from its largest
// normalized value; v / scale rounded to e4m3).
void launch_mla_kv_append(const uint16_t* kv_a, int64_t row_stride, int T, int kv_lora, const float* norm_w, float eps,
                          const int32_t* positions, RopeDevice rope, const int32_t* slots, DeviceLatentCache cache,
                          void* cuda_stream);

// launch_mla_q_rope and launch_mla_kv_append in one launch (a grid row of blocks per token, the
// last block of each row appending its cache entry): the same results, one launch fewer.
void launch_mla_q_rope_kv_append(const uint16_t* q, int T, int H, int nope, uint16_t* q_pe, const uint16_t* kv_a,
                                 int64_t row_stride, int kv_lora, const float* norm_w, float eps,
                                 const int32_t* positions, RopeDevice rope, const int32_t* slots,
                                 DeviceLatentCache cache, void* cuda_stream);

// q: [T, H, nope + rope] rotated in place (the rope part of each head), as rope_apply.
void launch_rope_q_inplace(uint16_t* q, int T, int H, int nope, const int32_t* positions, RopeDevice rope,
                           void* cuda_stream);

// Several requests' cached entries back to back, out of the paged cache (blocks of `block_size`,
// entries of kv_lora + rope values): rows [kv_start[r], kv_start[r + 1]) of latent ([rows,
// kv_lora] bf16) and k_pe ([rows, rope] bf16) are request r's positions 0, 1, … through row r of
// block_table (max_blocks entries per request) — bf16 entries copied, FP8 entries' latent as
// bf16(e4m3 · scale) (the values the decode kernel computes with). kv_start: device, num_requests +
// 1 offsets, null for one request; total_rows = kv_start[num_requests], a host value (the grid).
void launch_gather_latent(DeviceLatentCache cache, const int32_t* block_table, int max_blocks, int block_size,
                          const int32_t* kv_start, int num_requests, int total_rows, int kv_lora, int rope,
                          uint16_t* latent, uint16_t* k_pe, void* cuda_stream);

// gate_up: [R, 2I] bf16 (gate | up) -> out: [R, I] = silu(gate) · up, bf16.
void launch_silu_mul_bf16(const uint16_t* gate_up, int R, int I, uint16_t* out, void* cuda_stream);

// The batched GEMM of bf16 checkpoints (plain SIMT, f32 accumulation; correctness, not speed):
// y[b, m, :] = x[b, m, :] · w[b]ᵀ for b < batch, m < counts[b] (every m < M when counts is null; rows
// past a count are not written). x: rows of K at x + b·x_batch_stride + m·x_row_stride; w: [batch, N, K];
// y: [batch, M, N] bf16, or f32 when y_f32 is given instead of y.
// With block_expert (on the device, [batch]) batch b multiplies by w[block_expert[b]] instead, and
// a -1 entry skips the batch (nothing written): the contiguous layout's 128-row blocks as batches
// of M = 128 (x_batch_stride = 128·K), w then [experts, N, K] with every entry < experts.
struct BatchedGemmBf16 {
    const uint16_t* x = nullptr;
    int64_t x_batch_stride = 0, x_row_stride = 0;
    const uint16_t* w = nullptr;
    const int32_t* counts = nullptr;
    const int32_t* block_expert = nullptr;
    int batch = 1, M = 0, N = 0, K = 0;
    uint16_t* y = nullptr;
    float* y_f32 = nullptr;
};
void launch_batched_gemm_bf16(const BatchedGemmBf16& g, void* cuda_stream);

// p[0..n) = value.
void launch_fill_i32(int32_t* p, int n, int32_t value, void* cuda_stream);

// Deterministic pseudo-random fills for benchmark weights, a hash of (seed, index): e4m3 values
// of magnitude 2⁻⁴…2³ with random signs (never NaN); f32 uniform in [lo, hi); bf16 uniform in ±scale.
void launch_random_fp8(uint8_t* p, size_t n, uint64_t seed, void* cuda_stream);
void launch_random_f32(float* p, size_t n, float lo, float hi, uint64_t seed, void* cuda_stream);
void launch_random_bf16(uint16_t* p, size_t n, float scale, uint64_t seed, void* cuda_stream);

#endif

}  // namespace fanout::ops

// MLA attention in its absorbed form on the GPU: the latent core of mla_attention.h
// (`mla_latent_attention_cpu` is the reference) over one layer of the paged bf16 latent cache.
//
// For query token t of request r and head h:
//   score(j) = scale · (q_lat[t, h] · c_kv[j] + q_pe[t, h] · k_pe[j])   for cached positions j ≤ positions[t],
//   out[t, h, :] = Σ_j softmax(score)(j) · c_kv[j]                       (kv_lora values, bf16).
// A cache entry is [c_kv (kv_lora) | k_pe (rope)]; position j of request r lives in slot
// block_table[r][j / block_size] * block_size + j % block_size.
//
// Two kernels (mla_attention_cuda.cu), picked by launch_mla_attention:
//  * sm_90a tensor cores (wgmma) for DeepSeek-V3's widths — kv_lora 512, rope 64, block_size 64,
//    16-byte-aligned q and out rows — any head count and query length: 64 (token, head) rows of one request
//    per CTA, kv tiles of 64 (one cache block), online softmax in f32, the kv range split
//    across CTAs when the batch alone would not fill the GPU, and a combine kernel. It also reads
//    the FP8 cache (`cache_fp8`, mla_attention.h's quantize_latent_entry_fp8: e4m3 c_kv with a scale
//    per 128 values, bf16 rope), turning each tile into bf16 in shared memory before its scores;
//  * a plain f32 kernel for everything else (kv_lora ≤ 1024, rope ≤ 128, any block size), over
//    either cache (an FP8 entry's values as bf16(e4m3 · scale), the tensor-core kernel's rounding).
//
// Graph-safe: the grid and the split count depend only on the host values of the params (token,
// request and head counts, max_query_len, the SM count); kv lengths, positions and block tables
// are read on the device, so one captured graph replays with new ones. No host synchronization.
//
// Fmt-free on purpose: included from .cu files.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fanout::ops {

struct MlaAttentionParams {
    int num_tokens = 0;    // T = query_start[num_requests]
    int num_requests = 0;  // R
    int num_heads = 0;     // H
    int kv_lora = 0;       // c_kv width (≤ 1024)
    int rope_dim = 0;      // k_pe width (≤ 128); entry_dim = kv_lora + rope_dim
    int block_size = 64;   // cache positions per block
    int max_blocks = 0;    // columns of block_table
    // Host-side upper bound on the query tokens of any one request in this launch (1–4 for
    // decode/MTP, the chunk length for prefill). Precondition: no request has more (rows past it
    // are not computed).
    int max_query_len = 1;
    float scale = 1.0f;  // softmax scale (YaRN mscale included)

    // Device pointers.
    const int32_t* query_start = nullptr;  // [R + 1]
    const int32_t* kv_len = nullptr;       // [R] cached positions, this step's included
    const int32_t* positions = nullptr;    // [T], positions[t] < kv_len[request of t]
    const int32_t* block_table = nullptr;  // [R, max_blocks]
    const uint16_t* cache = nullptr;       // one layer: [num_blocks, block_size, kv_lora + rope_dim] bf16
    // Instead of `cache` (exactly one is set): the FP8 cache of mla_attention.h
    // (quantize_latent_entry_fp8; fp8_constants.h's MlaFp8Layout — 656 bytes per entry at V3's
    // widths), [num_blocks, block_size, entry bytes].
    const uint8_t* cache_fp8 = nullptr;

    // bf16 rows addressed by element strides; the innermost dimension is contiguous, so [T][H][C]
    // (stride_t = H·C, stride_h = C) and [H][T][C] (stride_t = C, stride_h = T·C) both work.
    const uint16_t* q_lat = nullptr;  // [.., kv_lora]
    int64_t q_lat_stride_t = 0, q_lat_stride_h = 0;
    const uint16_t* q_pe = nullptr;  // [.., rope_dim], roped
    int64_t q_pe_stride_t = 0, q_pe_stride_h = 0;
    uint16_t* out = nullptr;  // [.., kv_lora]
    int64_t out_stride_t = 0, out_stride_h = 0;
};

// Device scratch for the split-KV partial results (f32 rows of kv_lora values plus one
// log-sum-exp each). Allocate once; the launcher lowers the split count to what fits, so any size
// is correct (0 bytes: never split). The default fits the fast kernel's largest split
// (≈ SM count × 64 rows × 512 values). One workspace per stream: launches on one stream may share it.
class MlaWorkspace {
  public:
    static constexpr size_t kDefaultBytes = size_t{40} << 20;
    explicit MlaWorkspace(size_t partial_bytes = kDefaultBytes);
    ~MlaWorkspace();
    MlaWorkspace(const MlaWorkspace&) = delete;
    MlaWorkspace& operator=(const MlaWorkspace&) = delete;

    float* partials = nullptr;
    size_t partial_floats = 0;
};

// bf16 cache entries [n, 576] (kv_lora 512 + rope 64) → their FP8 form [n, 656] bytes, as
// quantize_latent_entry_fp8 (mla_attention.h) computes it, byte for byte. 16-byte-aligned pointers.
void launch_quantize_latent_fp8(const uint16_t* entries, int64_t n, uint8_t* out, void* cuda_stream);

// Which kernel launch_mla_attention runs for these params (tests and benchmarks report it).
enum class MlaKernel { kTensorCore, kGeneric };
MlaKernel mla_attention_kernel_for(const MlaAttentionParams& p);

// Runs the attention on `cuda_stream` (a cudaStream_t). `workspace` may be null (no split-KV).
// `force_splits` > 0 overrides the split count (tests; still capped by the workspace and 64).
// Throws fanout::Error on a broken precondition (dims out of range, null pointers).
void launch_mla_attention(const MlaAttentionParams& p, MlaWorkspace* workspace, void* cuda_stream,
                          int force_splits = 0);

// The generic kernel whatever the dims (tests compare both paths on the fast path's shapes).
void launch_mla_attention_generic(const MlaAttentionParams& p, MlaWorkspace* workspace, void* cuda_stream,
                                  int force_splits = 0);

}  // namespace fanout::ops

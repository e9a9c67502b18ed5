// The GPU model runner's small kernels (model_glue_cuda.h). Only fmt-free headers here.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <string>

#include "fanout/core/cuda_check.h"
#include "fanout/core/search.cuh"
#include "fanout/ops/block_reduce.cuh"
#include "fanout/ops/fp8_constants.h"
#include "fanout/ops/model_glue_cuda.h"
#include "fanout/ops/pdl.cuh"

namespace fanout::ops {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

__global__ void embed_kernel(const bf16* __restrict__ table, const int32_t* __restrict__ tokens, int D,
                             bf16* __restrict__ out) {
    pdl_enter();
    const size_t t = blockIdx.x;
    const bf16* src = table + static_cast<size_t>(tokens[t]) * D;
    for (int d = threadIdx.x; d < D; d += kThreads) out[t * D + d] = src[d];
}

// Pair index i's cosine and sine at pos (pos · inv_freq[i]), times the attention factor.
__device__ inline float2 rope_angle(float pos, int i, const RopeDevice& r) {
    float s, c;
    sincosf(pos * r.inv_freq[i], &s, &c);
    return make_float2(c * r.attention_factor, s * r.attention_factor);
}

// Rotates the interleaved pair (a, b) by the angle (cos, sin) = cs, as rope_apply does.
__device__ inline void rope_rotate(float& a, float& b, float2 cs) {
    const float x = a * cs.x - b * cs.y, y = b * cs.x + a * cs.y;
    a = x;
    b = y;
}

__device__ inline void rope_pair(float& a, float& b, float pos, int i, const RopeDevice& r) {
    rope_rotate(a, b, rope_angle(pos, i, r));
}

// A block per (token, kHeadsPerBlock heads) — decode steps have few tokens, so the heads supply
// the parallelism. The token's angles are the same for every head: the block computes each once
// (a thread per pair, into shared memory) and rotates its heads' pairs with them.
constexpr int kHeadsPerBlock = 32;
constexpr int kMaxRopeDim = 2 * kThreads;  // a thread per pair for the angles

// The token's rope angles into sc[0 .. rope.dim / 2), visible to the whole block after the barrier.
__device__ inline void token_angles(float pos, const RopeDevice& rope, float2* sc) {
    if (static_cast<int>(threadIdx.x) < rope.dim / 2) sc[threadIdx.x] = rope_angle(pos, threadIdx.x, rope);
    __syncthreads();
}

// Token t's heads [h0, h0 + kHeadsPerBlock): each head's rope part of q rotated into q_pe.
__device__ inline void q_rope_block(const bf16* __restrict__ q, int H, int nope, float pos, RopeDevice rope,
                                    bf16* __restrict__ q_pe, int t, int h0) {
    __shared__ float2 sc[kMaxRopeDim / 2];
    token_angles(pos, rope, sc);
    const int width = nope + rope.dim, half = rope.dim / 2, nh = min(kHeadsPerBlock, H - h0);
    const bf16* row = q + static_cast<size_t>(t) * H * width;
    for (int i = threadIdx.x; i < nh * half; i += kThreads) {
        const int h = h0 + i / half, p = i % half;
        const bf16* src = row + h * width + nope + 2 * p;
        float a = __bfloat162float(src[0]), b = __bfloat162float(src[1]);
        rope_rotate(a, b, sc[p]);
        bf16* dst = q_pe + (static_cast<size_t>(t) * H + h) * rope.dim + 2 * p;
        dst[0] = __float2bfloat16(a);
        dst[1] = __float2bfloat16(b);
    }
}

__global__ void mla_q_rope_kernel(const bf16* __restrict__ q, int H, int nope, const int32_t* __restrict__ positions,
                                  RopeDevice rope, bf16* __restrict__ q_pe) {
    pdl_enter();
    q_rope_block(q, H, nope, static_cast<float>(positions[blockIdx.x]), rope, q_pe, blockIdx.x,
                 blockIdx.y * kHeadsPerBlock);
}

// A block per (token, kHeadsPerBlock heads): the rope part of each head rotated in place.
__global__ void rope_q_inplace_kernel(bf16* __restrict__ q, int H, int nope, const int32_t* __restrict__ positions,
                                      RopeDevice rope) {
    pdl_enter();
    __shared__ float2 sc[kMaxRopeDim / 2];
    const int t = blockIdx.x, width = nope + rope.dim, half = rope.dim / 2;
    const int h0 = blockIdx.y * kHeadsPerBlock, nh = min(kHeadsPerBlock, H - h0);
    token_angles(static_cast<float>(positions[t]), rope, sc);
    for (int i = threadIdx.x; i < nh * half; i += kThreads) {
        bf16* x = q + (static_cast<size_t>(t) * H + h0 + i / half) * width + nope + 2 * (i % half);
        float a = __bfloat162float(x[0]), b = __bfloat162float(x[1]);
        rope_rotate(a, b, sc[i % half]);
        x[0] = __float2bfloat16(a);
        x[1] = __float2bfloat16(b);
    }
}

// A warp per position (kThreads / 32 positions per block): its cache entry split into the latent
// row and the k_pe row. bf16 entries in 16-byte pieces when every row boundary allows (kv_lora and
// rope multiples of 8, 16-byte-aligned bases), else value by value; FP8 entries (kFp8) four latent
// values per lane and step, each e4m3 · its group's scale rounded once to bf16 (what the decode
// kernel's conversion computes), the rope part copied.
template <bool kFp8>
__global__ void __launch_bounds__(kThreads)
    gather_latent_kernel(const void* __restrict__ cache, const int32_t* __restrict__ block_table, int max_blocks,
                         int block_size, const int32_t* __restrict__ kv_start, int num_requests, int total_rows,
                         int kv_lora, int rope, bf16* __restrict__ latent, bf16* __restrict__ k_pe, bool vec16) {
    pdl_enter();
    const int j = blockIdx.x * (kThreads / 32) + static_cast<int>(threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (j >= total_rows) return;
    const int entry = kv_lora + rope;
    int r = 0, pos = j;  // row j is position pos of request r
    if (kv_start != nullptr) {
        r = segment_of(kv_start, num_requests, j);
        pos = j - kv_start[r];
    }
    const int32_t block = block_table[static_cast<size_t>(r) * max_blocks + pos / block_size];
    const size_t slot = static_cast<size_t>(block) * block_size + pos % block_size;
    bf16* lat = latent + static_cast<size_t>(j) * kv_lora;
    bf16* pe = k_pe + static_cast<size_t>(j) * rope;
    if constexpr (kFp8) {
        const MlaFp8Layout L{kv_lora, rope};
        const uint8_t* src = static_cast<const uint8_t*>(cache) + slot * L.entry_bytes();
        const float* scales = reinterpret_cast<const float*>(src + L.scale_offset());
        for (int c = lane; c < kv_lora / 4; c += 32) {
            const uint32_t q = reinterpret_cast<const uint32_t*>(src)[c];
            const float scale = scales[4 * c / kFp8Block];
#pragma unroll
            for (int i = 0; i < 4; ++i)
                lat[4 * c + i] = __float2bfloat16(fp8_cache_value(uint8_t(q >> (8 * i)), scale));
        }
        const bf16* src_pe = reinterpret_cast<const bf16*>(src + L.rope_offset());
        for (int d = lane; d < rope; d += 32) pe[d] = src_pe[d];
        return;
    }
    const bf16* src = static_cast<const bf16*>(cache) + slot * entry;
    if (vec16) {
        for (int c = lane; c < entry / 8; c += 32) {
            const uint4 v = reinterpret_cast<const uint4*>(src)[c];
            if (c < kv_lora / 8)
                reinterpret_cast<uint4*>(lat)[c] = v;
            else
                reinterpret_cast<uint4*>(pe)[c - kv_lora / 8] = v;
        }
        return;
    }
    for (int d = lane; d < entry; d += 32) {
        if (d < kv_lora)
            lat[d] = src[d];
        else
            pe[d - kv_lora] = src[d];
    }
}

// FP8 entries' latent groups (of 128 values) an append handles: kv_lora up to 2,048.
constexpr int kMaxFp8Groups = 16;

// Token t's cache entry (a whole block): the latent's sum of squares, then the normalized latent
// and the roped k_pe written straight into the token's cache slot — bf16 values, or (kFp8) the FP8
// entry (fp8_constants.h's MlaFp8Layout): each 128-value group's largest magnitude first (shared
// atomics on the bits of non-negative floats, which order as integers; NaNs skipped, as the CPU's
// std::max skips them), then the e4m3 values of v / scale and the group's scale, then rope in bf16.
template <bool kFp8>
__device__ inline void kv_append_block(const bf16* __restrict__ kv_a, int64_t row_stride, int kv_lora,
                                       const float* __restrict__ norm_w, float eps, float pos, RopeDevice rope,
                                       int32_t slot, void* __restrict__ cache, int t) {
    const bf16* row = kv_a + static_cast<size_t>(t) * row_stride;
    float ss = 0.0f;
    for (int d = threadIdx.x; d < kv_lora; d += kThreads) {
        const float v = __bfloat162float(row[d]);
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum<kThreads>(ss) / kv_lora + eps);
    const auto normed = [&](int d) { return __bfloat162float(row[d]) * inv * norm_w[d]; };
    bf16* pe_out;
    if constexpr (kFp8) {
        const MlaFp8Layout L{kv_lora, rope.dim};
        uint8_t* entry = static_cast<uint8_t*>(cache) + static_cast<size_t>(slot) * L.entry_bytes();
        __shared__ unsigned amax_bits[kMaxFp8Groups];
        if (static_cast<int>(threadIdx.x) < L.num_scales()) amax_bits[threadIdx.x] = 0;
        __syncthreads();
        for (int d = threadIdx.x; d < kv_lora; d += kThreads) {
            const float v = normed(d);
            if (!isnan(v)) atomicMax(&amax_bits[d / kFp8Block], __float_as_uint(fabsf(v)));
        }
        __syncthreads();
        for (int d = threadIdx.x; d < kv_lora; d += kThreads) {
            const float scale = fp8_cache_scale(__uint_as_float(amax_bits[d / kFp8Block]));
            entry[d] = __nv_cvt_float_to_fp8(normed(d) / scale, __NV_SATFINITE, __NV_E4M3);
        }
        if (static_cast<int>(threadIdx.x) < L.num_scales())
            reinterpret_cast<float*>(entry + L.scale_offset())[threadIdx.x] =
                fp8_cache_scale(__uint_as_float(amax_bits[threadIdx.x]));
        pe_out = reinterpret_cast<bf16*>(entry + L.rope_offset());
    } else {
        bf16* entry = static_cast<bf16*>(cache) + static_cast<size_t>(slot) * (kv_lora + rope.dim);
        for (int d = threadIdx.x; d < kv_lora; d += kThreads) entry[d] = __float2bfloat16(normed(d));
        pe_out = entry + kv_lora;
    }
    for (int p = threadIdx.x; p < rope.dim / 2; p += kThreads) {
        float a = __bfloat162float(row[kv_lora + 2 * p]), b = __bfloat162float(row[kv_lora + 2 * p + 1]);
        rope_pair(a, b, pos, p, rope);
        pe_out[2 * p] = __float2bfloat16(a);
        pe_out[2 * p + 1] = __float2bfloat16(b);
    }
}

template <bool kFp8>
__global__ void mla_kv_append_kernel(const bf16* __restrict__ kv_a, int64_t row_stride, int kv_lora,
                                     const float* __restrict__ norm_w, float eps, const int32_t* __restrict__ positions,
                                     RopeDevice rope, const int32_t* __restrict__ slots, void* __restrict__ cache) {
    pdl_enter();
    const int t = blockIdx.x;
    kv_append_block<kFp8>(kv_a, row_stride, kv_lora, norm_w, eps, static_cast<float>(positions[t]), rope, slots[t],
                          cache, t);
}

// Both in one launch (the absorbed form's attention input): blocks (t, y < gridDim.y − 1) rotate
// token t's heads, block (t, gridDim.y − 1) appends its cache entry — one launch fewer per layer.
template <bool kFp8>
__global__ void mla_q_rope_kv_append_kernel(const bf16* __restrict__ q, int H, int nope, bf16* __restrict__ q_pe,
                                            const bf16* __restrict__ kv_a, int64_t row_stride, int kv_lora,
                                            const float* __restrict__ norm_w, float eps,
                                            const int32_t* __restrict__ positions, RopeDevice rope,
                                            const int32_t* __restrict__ slots, void* __restrict__ cache) {
    pdl_enter();
    const int t = blockIdx.x;
    const float pos = static_cast<float>(positions[t]);
    if (blockIdx.y + 1 < gridDim.y) {
        q_rope_block(q, H, nope, pos, rope, q_pe, t, blockIdx.y * kHeadsPerBlock);
    } else {  // the whole block takes this branch: kv_append_block's barriers see every thread
        kv_append_block<kFp8>(kv_a, row_stride, kv_lora, norm_w, eps, pos, rope, slots[t], cache, t);
    }
}

__global__ void silu_mul_kernel(const bf16* __restrict__ gate_up, int I, bf16* __restrict__ out) {
    pdl_enter();
    const size_t r = blockIdx.x;
    for (int i = threadIdx.x; i < I; i += kThreads) {
        const float g = __bfloat162float(gate_up[r * 2 * I + i]), u = __bfloat162float(gate_up[r * 2 * I + I + i]);
        out[r * I + i] = __float2bfloat16(g / (1.0f + __expf(-g)) * u);
    }
}

// 16×16 output tile per block, K in shared-memory slices of 16.
constexpr int kTile = 16;

__global__ void batched_gemm_bf16_kernel(BatchedGemmBf16 g) {
    __shared__ float xs[kTile][kTile + 1], ws[kTile][kTile + 1];
    const int b = blockIdx.z, m = blockIdx.y * kTile + threadIdx.y, n = blockIdx.x * kTile + threadIdx.x;
    const int rows = g.counts != nullptr ? min(max(g.counts[b], 0), g.M) : g.M;
    if (blockIdx.y * kTile >= rows) return;  // the whole block is past the count
    const int wb = g.block_expert != nullptr ? g.block_expert[b] : b;
    if (wb < 0) return;  // a contiguous layout's unused block
    const bf16* x = reinterpret_cast<const bf16*>(g.x) + b * g.x_batch_stride;
    const bf16* w = reinterpret_cast<const bf16*>(g.w) + static_cast<size_t>(wb) * g.N * g.K;
    const int wn = blockIdx.x * kTile + threadIdx.y;  // the W row this thread loads
    float acc = 0.0f;
    for (int k0 = 0; k0 < g.K; k0 += kTile) {
        const int k = k0 + threadIdx.x;
        xs[threadIdx.y][threadIdx.x] = m < rows && k < g.K ? __bfloat162float(x[m * g.x_row_stride + k]) : 0.0f;
        ws[threadIdx.y][threadIdx.x] =
            wn < g.N && k < g.K ? __bfloat162float(w[static_cast<size_t>(wn) * g.K + k]) : 0.0f;
        __syncthreads();
        for (int i = 0; i < kTile; ++i) acc += xs[threadIdx.y][i] * ws[threadIdx.x][i];
        __syncthreads();
    }
    if (m >= rows || n >= g.N) return;
    const size_t o = (static_cast<size_t>(b) * g.M + m) * g.N + n;
    if (g.y_f32 != nullptr) {
        g.y_f32[o] = acc;
    } else {
        reinterpret_cast<bf16*>(g.y)[o] = __float2bfloat16(acc);
    }
}

__global__ void fill_kernel(int32_t* p, int n, int32_t v) {
    pdl_enter();
    const int i = blockIdx.x * kThreads + threadIdx.x;
    if (i < n) p[i] = v;
}

__device__ inline uint64_t mix(uint64_t x) {  // splitmix64's finalizer
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

__device__ inline float unit(uint64_t h) { return static_cast<float>(h >> 40) * 0x1.0p-24f; }

enum class Fill { kFp8, kF32, kBf16 };

__global__ void random_kernel(void* p, size_t n, Fill kind, float a, float b, uint64_t seed) {
    for (size_t i = blockIdx.x * size_t(kThreads) + threadIdx.x; i < n; i += size_t(gridDim.x) * kThreads) {
        const uint64_t h = mix(seed * 0x100000001b3ull ^ i);
        if (kind == Fill::kFp8) {
            const uint32_t sign = (h & 1) << 7, exponent = 3 + (h >> 1) % 8, mantissa = (h >> 4) & 7;
            static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(sign | exponent << 3 | mantissa);
        } else if (kind == Fill::kF32) {
            static_cast<float*>(p)[i] = a + (b - a) * unit(h);
        } else {
            static_cast<bf16*>(p)[i] = __float2bfloat16(a * (2.0f * unit(h) - 1.0f));
        }
    }
}

// Exactly one of the cache's pointers; FP8 entries at widths their layout and the kernels take.
void check_latent_cache(const char* what, const DeviceLatentCache& cache, int kv_lora, int rope) {
    FANOUT_DEVICE_REQUIRE((cache.bf16 == nullptr) != (cache.fp8 == nullptr),
                          std::string(what) + ": exactly one of the cache's bf16 and fp8 pointers must be set");
    FANOUT_DEVICE_REQUIRE(cache.fp8 == nullptr || (mla_fp8_widths_ok(kv_lora, rope) &&
                                                   (kv_lora + kFp8Block - 1) / kFp8Block <= kMaxFp8Groups),
                          std::string(what) + ": the FP8 cache needs kv_lora a multiple of 4 (at most " +
                              std::to_string(kMaxFp8Groups * kFp8Block) + ") and an even rope width; got " +
                              std::to_string(kv_lora) + " + " + std::to_string(rope));
}

// The cache append's rows: [latent (kv_lora) | k_pe (rope, an even width)] within row_stride.
void check_kv_append(const char* what, int64_t row_stride, int kv_lora, const RopeDevice& rope,
                     const DeviceLatentCache& cache) {
    FANOUT_DEVICE_REQUIRE(rope.dim % 2 == 0 && rope.dim <= kMaxRopeDim && row_stride >= kv_lora + rope.dim,
                          std::string(what) + ": rope width " + std::to_string(rope.dim) + " (even, at most " +
                              std::to_string(kMaxRopeDim) + "), row stride " + std::to_string(row_stride) + " for a " +
                              std::to_string(kv_lora) + "-wide latent");
    check_latent_cache(what, cache, kv_lora, rope.dim);
}

void random_fill(void* p, size_t n, Fill kind, float a, float b, uint64_t seed, void* s) {
    if (n == 0) return;
    const size_t blocks = std::min<size_t>((n + kThreads - 1) / kThreads, 4096);
    random_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, as_stream(s)>>>(p, n, kind, a, b, seed);
    FANOUT_CUDA_CHECK_LAUNCH("random_kernel");
}

}  // namespace

void launch_random_fp8(uint8_t* p, size_t n, uint64_t seed, void* s) { random_fill(p, n, Fill::kFp8, 0, 0, seed, s); }
void launch_random_f32(float* p, size_t n, float lo, float hi, uint64_t seed, void* s) {
    random_fill(p, n, Fill::kF32, lo, hi, seed, s);
}
void launch_random_bf16(uint16_t* p, size_t n, float scale, uint64_t seed, void* s) {
    random_fill(p, n, Fill::kBf16, scale, 0, seed, s);
}

void launch_embed_bf16(const uint16_t* table, const int32_t* tokens, int T, int D, uint16_t* out, void* cuda_stream) {
    if (T <= 0) return;
    launch_pdl(embed_kernel, T, kThreads, 0, as_stream(cuda_stream), reinterpret_cast<const bf16*>(table), tokens, D,
               reinterpret_cast<bf16*>(out));
}

void launch_mla_q_rope(const uint16_t* q, int T, int H, int nope, const int32_t* positions, RopeDevice rope,
                       uint16_t* q_pe, void* cuda_stream) {
    FANOUT_DEVICE_REQUIRE(rope.dim % 2 == 0 && rope.dim <= kMaxRopeDim,
                          "mla_q_rope: the rope width must be even and at most " + std::to_string(kMaxRopeDim) +
                              ", got " + std::to_string(rope.dim));
    if (T <= 0) return;
    const dim3 grid(T, (H + kHeadsPerBlock - 1) / kHeadsPerBlock);
    launch_pdl(mla_q_rope_kernel, grid, kThreads, 0, as_stream(cuda_stream), reinterpret_cast<const bf16*>(q), H, nope,
               positions, rope, reinterpret_cast<bf16*>(q_pe));
}

void launch_mla_kv_append(const uint16_t* kv_a, int64_t row_stride, int T, int kv_lora, const float* norm_w, float eps,
                          const int32_t* positions, RopeDevice rope, const int32_t* slots, DeviceLatentCache cache,
                          void* cuda_stream) {
    check_kv_append("mla_kv_append", row_stride, kv_lora, rope, cache);
    if (T <= 0) return;
    const auto kernel = cache.is_fp8() ? mla_kv_append_kernel<true> : mla_kv_append_kernel<false>;
    launch_pdl(kernel, T, kThreads, 0, as_stream(cuda_stream), reinterpret_cast<const bf16*>(kv_a), row_stride, kv_lora,
               norm_w, eps, positions, rope, slots, cache.entries());
}

void launch_mla_q_rope_kv_append(const uint16_t* q, int T, int H, int nope, uint16_t* q_pe, const uint16_t* kv_a,
                                 int64_t row_stride, int kv_lora, const float* norm_w, float eps,
                                 const int32_t* positions, RopeDevice rope, const int32_t* slots,
                                 DeviceLatentCache cache, void* cuda_stream) {
    check_kv_append("mla_q_rope_kv_append", row_stride, kv_lora, rope, cache);
    if (T <= 0) return;
    const dim3 grid(T, (H + kHeadsPerBlock - 1) / kHeadsPerBlock + 1);
    const auto kernel = cache.is_fp8() ? mla_q_rope_kv_append_kernel<true> : mla_q_rope_kv_append_kernel<false>;
    launch_pdl(kernel, grid, kThreads, 0, as_stream(cuda_stream), reinterpret_cast<const bf16*>(q), H, nope,
               reinterpret_cast<bf16*>(q_pe), reinterpret_cast<const bf16*>(kv_a), row_stride, kv_lora, norm_w, eps,
               positions, rope, slots, cache.entries());
}

void launch_rope_q_inplace(uint16_t* q, int T, int H, int nope, const int32_t* positions, RopeDevice rope,
                           void* cuda_stream) {
    FANOUT_DEVICE_REQUIRE(rope.dim % 2 == 0 && rope.dim <= kMaxRopeDim,
                          "rope_q_inplace: the rope width must be even and at most " + std::to_string(kMaxRopeDim) +
                              ", got " + std::to_string(rope.dim));
    if (T <= 0) return;
    const dim3 grid(T, (H + kHeadsPerBlock - 1) / kHeadsPerBlock);
    launch_pdl(rope_q_inplace_kernel, grid, kThreads, 0, as_stream(cuda_stream), reinterpret_cast<bf16*>(q), H, nope,
               positions, rope);
}

void launch_gather_latent(DeviceLatentCache cache, const int32_t* block_table, int max_blocks, int block_size,
                          const int32_t* kv_start, int num_requests, int total_rows, int kv_lora, int rope,
                          uint16_t* latent, uint16_t* k_pe, void* cuda_stream) {
    FANOUT_DEVICE_REQUIRE(
        num_requests >= 1 && (num_requests == 1 || kv_start != nullptr) && block_size >= 1 && max_blocks >= 1,
        "gather_latent: needs num_requests >= 1 (several need kv_start), block_size >= 1, "
        "max_blocks >= 1; got num_requests=" +
            std::to_string(num_requests) + " block_size=" + std::to_string(block_size) +
            " max_blocks=" + std::to_string(max_blocks));
    check_latent_cache("gather_latent", cache, kv_lora, rope);
    if (total_rows <= 0) return;
    const auto a16 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
    const bool vec16 = kv_lora % 8 == 0 && rope % 8 == 0 && a16(cache.bf16) && a16(latent) && a16(k_pe);
    constexpr int kRowsPerBlock = kThreads / 32;
    const unsigned grid = (total_rows + kRowsPerBlock - 1) / kRowsPerBlock;
    const auto kernel = cache.is_fp8() ? gather_latent_kernel<true> : gather_latent_kernel<false>;
    launch_pdl(kernel, grid, kThreads, 0, as_stream(cuda_stream), cache.entries(), block_table, max_blocks, block_size,
               kv_start, num_requests, total_rows, kv_lora, rope, reinterpret_cast<bf16*>(latent),
               reinterpret_cast<bf16*>(k_pe), vec16);
}

void launch_silu_mul_bf16(const uint16_t* gate_up, int R, int I, uint16_t* out, void* cuda_stream) {
    if (R <= 0) return;
    launch_pdl(silu_mul_kernel, R, kThreads, 0, as_stream(cuda_stream), reinterpret_cast<const bf16*>(gate_up), I,
               reinterpret_cast<bf16*>(out));
}

void launch_batched_gemm_bf16(const BatchedGemmBf16& g, void* cuda_stream) {
    FANOUT_DEVICE_REQUIRE(g.batch > 0 && g.M >= 0 && g.N > 0 && g.K > 0 && (g.y != nullptr) != (g.y_f32 != nullptr),
                          "batched_gemm_bf16: batch " + std::to_string(g.batch) + " M " + std::to_string(g.M) + " N " +
                              std::to_string(g.N) + " K " + std::to_string(g.K) + ", exactly one output");
    FANOUT_DEVICE_REQUIRE(g.batch <= 65535 && (g.M + kTile - 1) / kTile <= 65535,
                          "batched_gemm_bf16: batch " + std::to_string(g.batch) + " and M " + std::to_string(g.M) +
                              " exceed the grid (at most 65535 each, M in tiles of 16)");
    if (g.M == 0) return;
    const dim3 grid((g.N + kTile - 1) / kTile, (g.M + kTile - 1) / kTile, g.batch), block(kTile, kTile);
    batched_gemm_bf16_kernel<<<grid, block, 0, as_stream(cuda_stream)>>>(g);
    FANOUT_CUDA_CHECK_LAUNCH("batched_gemm_bf16_kernel");
}

void launch_fill_i32(int32_t* p, int n, int32_t value, void* cuda_stream) {
    if (n <= 0) return;
    launch_pdl(fill_kernel, (n + kThreads - 1) / kThreads, kThreads, 0, as_stream(cuda_stream), p, n, value);
}

}  // namespace fanout::ops

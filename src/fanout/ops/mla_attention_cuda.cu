// MLA attention, absorbed form, on the GPU: see mla_attention_cuda.h for the math and the contract.
//
// * mla_fast_kernel (sm_90a, kv_lora 512 / rope 64 / block 64): a CTA owns 64 rows — (token, head)
//   pairs of one request, row = t_local · H + h — and a contiguous range of kv tiles (64 positions,
//   exactly one cache block, so a tile is 73,728 contiguous bytes). Q stays in shared memory; two kv
//   buffers of one tile each; two warpgroups in FlashMLA's "seesaw" schedule (see the kernel): each
//   warpgroup scores a full 64×64 S tile of alternating kv tiles with wgmma m64n64k16 and owns half of
//   the 512 output columns (m64n256k16, its own P from registers, the other's through shared memory
//   in bf16), so one warpgroup's softmax overlaps the other's tensor-core work. V is the first 512
//   columns of the same tile (no second load): S reads it K-major, P·V reads it N-major through the
//   same 128-byte-swizzled panels. Tiles arrive by TMA, one 8 KB panel per box, in two halves per
//   buffer on their own mbarriers, each reloaded as soon as its last reader is done.
//   With the FP8 cache (mla_fast_kernel<true>) each part's e4m3 bytes land in the upper half of its
//   bf16 panels and the warpgroup that scores the tile writes them out as bf16 (dequant_half).
// * mla_generic_kernel: one CTA per (token, head), f32 throughout; any widths, any block size.
// * mla_combine_kernel: split-KV partials (o/l and log2-sum-exp per split) → bf16 output, launched as
//   a programmatic dependent of the split kernel.
//
// Split-KV: the host picks the split count from host values only (CTAs vs SM count, the
// workspace); each CTA derives its kv range on the device from kv_len/positions, so a captured
// graph stays valid for any lengths. A split that sees no position of a row writes lse = −inf,
// which the combine skips.
#include <cuda.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "fanout/core/cuda_check.h"
#include "fanout/core/per_device.h"
#include "fanout/core/search.cuh"
#include "fanout/ops/bf16_bits.cuh"
#include "fanout/ops/fp8_constants.h"
#include "fanout/ops/gemm.h"
#include "fanout/ops/mla_attention_cuda.h"
#include "fanout/ops/pdl.cuh"
#include "fanout/ops/sm90.cuh"
#include "fanout/ops/tensor_map.h"

namespace fanout::ops {
namespace {

constexpr int kMaxSplits = 64;
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    return uint32_t(float_to_bf16_bits(lo)) | (uint32_t(float_to_bf16_bits(hi)) << 16);
}

// ---- cp.async (16 bytes; src_bytes = 0 writes zeros and reads nothing) ----
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sm90::smem_addr(dst)), "l"(src), "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// ======================================================================================
// Fast kernel
// ======================================================================================
constexpr int kLora = 512, kRope = 64, kDim = kLora + kRope;
constexpr int kRows = 64;                          // query rows per CTA (wgmma M)
constexpr int kTile = 64;                          // kv positions per tile = cache block size
constexpr int kChunks = kDim / 8;                  // 16-byte chunks per entry row: 72
constexpr int kPanelBytes = kRows * 128;           // one 64-column panel of 64 rows: 8 KB
constexpr int kPanels = kChunks / 8;               // 9: eight of c_kv (V, and K), one of k_pe
constexpr int kTileBytes = kPanels * kPanelBytes;  // 72 KB (Q and each kv buffer)
constexpr int kFastThreads = 256;                  // two consumer warpgroups
// The FP8 cache: fp8_constants.h's layout, for these widths.
static_assert(kMlaFp8Lora == kLora && kMlaFp8Rope == kRope, "the FP8 cache's widths");
constexpr int kScaleBytes = kRows * 16;  // one part's box of scales: [64 rows][4 f32]
constexpr int kFastSmemBytes = 3 * kTileBytes + 4 * kScaleBytes + (2 * kRows + 2 * kRows + kRows) * 4 + 4 * 8 + 1024;
static_assert(kFastSmemBytes <= 227 * 1024, "fast MLA kernel's shared memory");
// Cache rows the TMA descriptor spans (the cache's true size is not a launch parameter): block ids
// below 2^24, 1.2 TB of one layer's cache.
constexpr uint64_t kTmapRows = uint64_t{1} << 30;

// Named barriers (0 is __syncthreads): the seesaw hand-offs between the two warpgroups, arrived by
// one warpgroup (bar.arrive) and waited by the other (bar.sync), and one per warpgroup.
constexpr int kBarMaxLeft = 1;   // warpgroup 0's running maxima after its tile are in s_m[0]
constexpr int kBarMaxRight = 2;  // warpgroup 1's after its tile are in s_m[1]
constexpr int kBarPLeft = 3;     // P of warpgroup 0's tile (rescaled) is in its buffer's k_pe panel
constexpr int kBarPRight = 4;    // P of warpgroup 1's tile is in its buffer's k_pe panel
constexpr int kBarOwnWg = 5;     // + warpgroup: its own 128 threads

// Byte offset of 16-byte chunk c of row r in a [panel][row][128 B] tile with the 128-byte swizzle
// (chunk index XOR row % 8) that TMA and wgmma use.
__device__ __forceinline__ uint32_t swizzled(int r, int c) {
    return uint32_t((c >> 3) * kPanelBytes + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// S (+)= Q · Kᵀ over panels [first, first + count) of the 576 dims (4 k-steps of 16 per panel).
__device__ __forceinline__ void wgmma_s_panels(float (&s)[32], const uint8_t* sq, const uint8_t* kv, int first,
                                               int count, bool overwrite) {
#pragma unroll
    for (int i = 0; i < count; ++i)
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) {
            const int off = (first + i) * kPanelBytes + kb * 32;
            sm90::wgmma_s(s, sm90::desc_k_major_sw128(sq + off), sm90::desc_k_major_sw128(kv + off),
                          overwrite && i == 0 && kb == 0 ? 0 : 1);
        }
}

// O[64, 256·half ..) += P[64, 64] · V[64, 256·half ..), P from registers (p[4kk..4kk+3]: k-step kk).
__device__ __forceinline__ void pv_from_regs(float (&o)[128], const uint32_t (&p)[16], const uint8_t* kv, int half) {
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk)
        sm90::wgmma_pv_rs(o, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3],
                          sm90::desc_mn_major_sw128(kv + half * 4 * kPanelBytes + kk * 16 * 128, kPanelBytes));
}

// The same with P from shared memory (the other warpgroup's, in a buffer's k_pe panel).
__device__ __forceinline__ void pv_from_smem(float (&o)[128], const uint8_t* sp, const uint8_t* kv, int half) {
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk)
        sm90::wgmma_pv(o, sm90::desc_k_major_sw128(sp + kk * 32),
                       sm90::desc_mn_major_sw128(kv + half * 4 * kPanelBytes + kk * 16 * 128, kPanelBytes));
}

// Scores of kv tile `tile` with −inf at the columns a row may not see (only a tile reaching past a
// row's horizon is tested); row maxima of the thread's two rows (quad-reduced). Raw score units:
// exp_scores applies the scale, which is positive, so maxima commute with it. Fragment: register
// 4j + i is column 8j + 2·tig + (i & 1), row r0 for i < 2 and r1 otherwise.
__device__ __forceinline__ void mask_scores(float (&s)[32], int tile, int tig, int lim0, int lim1, float& mx0,
                                            float& mx1) {
    if (tile * kTile + kTile > min(lim0, lim1)) {
        const int col0 = tile * kTile + 2 * tig;
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int col = col0 + 8 * j + i;
                if (col >= lim0) s[4 * j + i] = -INFINITY;
                if (col >= lim1) s[4 * j + 2 + i] = -INFINITY;
            }
    }
    mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            mx0 = fmaxf(mx0, s[4 * j + i]);
            mx1 = fmaxf(mx1, s[4 * j + 2 + i]);
        }
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
    }
}

// The exponent base of running maximum m (raw units) in log2 units. A row that has seen nothing
// yet keeps −inf; a base of 0 then keeps exp2 at 0, not NaN.
__device__ __forceinline__ float exp_base(float m, float scale_log2) { return m == -INFINITY ? 0.0f : m * scale_log2; }

// The factor 2^((from − to) · scale) that moves values taken at maximum `from` to maximum `to`
// (from ≤ to): exactly 1 when the maximum did not move — not left to the rounding of
// from · scale − to · scale, which FMA contraction leaves a hair off 0 — so that the warp votes
// below can skip the work.
__device__ __forceinline__ float rescale_factor(float from, float to, float scale_log2) {
    return from == to ? 1.0f : exp2f(from * scale_log2 - exp_base(to, scale_log2));
}

// 2^x, subnormal results flushed to zero (a probability below 2^-126 of the row's maximum adds
// nothing to a bf16 P or an f32 row sum).
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// s ← 2^(s · scale_log2 − base) per row (one FFMA and one MUFU each); returns the thread's partial
// row sums.
__device__ __forceinline__ void exp_scores(float (&s)[32], float scale_log2, float base0, float base1, float& sum0,
                                           float& sum1) {
    float a[8], b[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            s[4 * j + i] = exp2_ftz(fmaf(s[4 * j + i], scale_log2, -base0));
            s[4 * j + 2 + i] = exp2_ftz(fmaf(s[4 * j + 2 + i], scale_log2, -base1));
        }
        a[j] = s[4 * j] + s[4 * j + 1], b[j] = s[4 * j + 2] + s[4 * j + 3];
    }
#pragma unroll
    for (int w = 4; w >= 1; w /= 2)
#pragma unroll
        for (int j = 0; j < w; ++j) a[j] += a[j + w], b[j] += b[j + w];
    sum0 = a[0], sum1 = b[0];
}

// o's rows × (f0, f1), skipped when the whole warp's factors are 1 (its rows' maxima did not move,
// the common case once a few tiles are in).
__device__ __forceinline__ void rescale_rows(float (&o)[128], float f0, float f1) {
    if (!__all_sync(0xffffffffu, f0 == 1.0f && f1 == 1.0f)) sm90::scale_rows(o, f0, f1);
}

// P in bf16 pairs (the register A operand of P·V) goes to a K-major [64 rows][64 kv] swizzled
// panel, the shared-memory A operand, through sm90::store_rows_sw128; this stores P · f per row
// (when f is not 1 for every row of the warp) the same way, from the f32 scores.
__device__ __forceinline__ void store_p_scaled(uint8_t* sp, const float (&s)[32], int r0, int lane, float f0,
                                               float f1) {
    uint32_t pf[16];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        pf[2 * j] = sm90::pack_bf16_rn(s[4 * j] * f0, s[4 * j + 1] * f0);
        pf[2 * j + 1] = sm90::pack_bf16_rn(s[4 * j + 2] * f1, s[4 * j + 3] * f1);
    }
    sm90::store_rows_sw128(sp, pf, r0, lane);
}

// 8 e4m3 values (bytes of x, low first) · scale → 8 bf16 (a 16-byte chunk of a panel row), three
// instructions a pair: e4m3 → f16 (exact); an f16 bit pattern shifted right by 3 (sign kept) is the
// bf16 of the same value times 2^-112 (every e4m3 value is a normal f16; zero stays zero); one bf16x2
// multiply by `scale2` = bf16(scale · 2^112) twice, exact since the format's scales are bf16 values
// (fp8_cache_scale) — so the product is rounded once, as the reference's e4m3 · scale in f32 then bf16.
__device__ __forceinline__ uint4 fp8x8_to_bf16(uint2 x, uint32_t scale2) {
    uint32_t out[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const auto pair = static_cast<__nv_fp8x2_storage_t>(((i < 2 ? x.x : x.y) >> (16 * (i % 2))) & 0xffffu);
        const __half2_raw h2 = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
        const uint32_t h = uint32_t(h2.x) | (uint32_t(h2.y) << 16);
        const uint32_t b = ((h >> 3) & 0x0fff0fffu) | (h & 0x80008000u);
        asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(out[i]) : "r"(b), "r"(scale2));
    }
    return make_uint4(out[0], out[1], out[2], out[3]);
}

// The FP8 cache: bf16 c_kv panels 4·half … 4·half + 3 of a kv buffer from the e4m3 bytes TMA staged
// in the upper half of the same region (panels 4·half + 2 and + 3: two boxes of 128 columns, 128-byte
// swizzle), times their rows' scales (`scales`: [64 rows][4 f32]); rows from `valid` on become
// zeros (past kv_end a block holds anything, and 0 · NaN would poison P·V). Panels 0 and 1 of the
// half do not overlap the staged bytes; panels 2 and 3 overwrite them, after every thread has read
// its bytes (barrier `bar`, this warpgroup's). 128 threads: row t / 2, 32 columns of each panel.
// Ends with the async-proxy fence and the barrier that let this warpgroup's wgmma read the panels.
__device__ __forceinline__ void dequant_half(uint8_t* kv, int half, const uint8_t* scales, int valid, int t128,
                                             int bar) {
    const int r = t128 / 2, sub = t128 % 2;
    uint8_t* const region = kv + half * 4 * kPanelBytes;
    const uint8_t* const staged = region + 2 * kPanelBytes;
    const float* sc = reinterpret_cast<const float*>(scales + r * 16) + 2 * half;
#pragma unroll
    for (int box = 0; box < 2; ++box) {  // panels 2·box and 2·box + 1 of the half, one scale
        uint4 v[4];                      // panel j's 32 bytes: chunks 4j + 2·sub, + 1 of the box's row
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int c = 4 * (i / 2) + 2 * sub + i % 2;
            v[i] = *reinterpret_cast<const uint4*>(staged + box * kPanelBytes + r * 128 + ((c ^ (r & 7)) << 4));
        }
        if (box == 1) sm90::named_barrier(bar, 128);  // every staged byte of the half is read
        const uint32_t scale_bits = __float_as_uint(sc[box] * 0x1p112f) >> 16, scale2 = scale_bits | (scale_bits << 16);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            uint8_t* const panel = region + (2 * box + j) * kPanelBytes + r * 128;
#pragma unroll
            for (int q = 0; q < 4; ++q) {  // output chunk 4·sub + q: 8 values from half of v[2j + q / 2]
                const uint4 w = v[2 * j + q / 2];
                const uint2 x = q % 2 ? make_uint2(w.z, w.w) : make_uint2(w.x, w.y);
                *reinterpret_cast<uint4*>(panel + (((4 * sub + q) ^ (r & 7)) << 4)) =
                    r < valid ? fp8x8_to_bf16(x, scale2) : make_uint4(0, 0, 0, 0);
            }
        }
    }
    sm90::fence_proxy_async();
    sm90::named_barrier(bar, 128);
}

// Zeros rows [valid, 64) of the eight c_kv panels of a kv buffer (the tile past kv_end: a block
// holds whatever was there, NaN included, and 0 · NaN would poison P·V). 128 threads.
__device__ __forceinline__ void zero_tail_rows(uint8_t* kv, int valid, int t128) {
    for (int i = t128; i < (kTile - valid) * 64; i += 128) {
        const int row = valid + i / 64, panel = (i / 8) % 8, c = i % 8;
        *reinterpret_cast<uint4*>(kv + panel * kPanelBytes + row * 128 + c * 16) = make_uint4(0, 0, 0, 0);
    }
}

// grid (row blocks of max_query_len·H, splits, requests); 256 threads = two warpgroups.
//
// Seesaw schedule (FlashMLA's, see the file comment): tiles go in pairs, A = 2k in buffer 0 and
// B = 2k + 1 in buffer 1. Warpgroup 0 ("left") holds O[:, 0:256), warpgroup 1 ("right")
// O[:, 256:512); both track the same running maximum m.
//   left:  S_A = Q·K_Aᵀ; m_a = max(m, rowmax S_A); P_A = 2^(S_A − m_a); O_L = O_L·2^(m − m_a) + P_A·V_A,L
//   right: S_B = Q·K_Bᵀ; m_b = max(m_a, rowmax S_B); P_B = 2^(S_B − m_b);
//          O_R = O_R·2^(m − m_b) + P_B·V_B,R + (P_A·2^(m_a − m_b))·V_A,R
//   left:  O_L = O_L·2^(m_a − m_b) + P_B·V_B,L;  m = m_b
// so one warpgroup's softmax runs while the other's wgmma keep the tensor cores busy. P goes to the
// other warpgroup in bf16 through the k_pe panel of its tile's buffer (dead once S is computed).
//
// Loads: TMA, 64 × 64 boxes (one 8 KB panel each) of the cache seen as [rows, 576] bf16. Each buffer
// has a left and a right part, each on its own mbarrier and issued by one thread of the warpgroup
// that reads it last: left = c_kv panels 0–3 (+ k_pe of buffer 1, which then holds P_B), right =
// panels 4–7 (+ k_pe of buffer 0, which then holds P_A). A part is reloaded with tile + 2 as soon
// as that warpgroup's last wgmma on it completes, and S begins with the part that frees first.
//
// kFp8: the FP8 cache. tmap_cache then maps its e4m3 c_kv (128-byte boxes of 64 rows), tmap_scale
// its scales and tmap_rope its bf16 rope part; each part's bytes land in the upper half of the
// part's bf16 panels, with its scales, and the warpgroup that computes the tile's S turns them into
// bf16 panels (dequant_half) before its S reads them — the other warpgroup reads them only after
// the P hand-off, which follows.
template <bool kFp8>
__global__ void __launch_bounds__(kFastThreads, 1)
    mla_fast_kernel(const __grid_constant__ CUtensorMap tmap_cache, const __grid_constant__ CUtensorMap tmap_rope,
                    const __grid_constant__ CUtensorMap tmap_scale, const MlaAttentionParams p, int num_splits,
                    float scale_log2, float* part_o, float* part_lse) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
    uint8_t* sq = smem;                                                // Q: [64 rows, 576] swizzled
    uint8_t* skv = smem + kTileBytes;                                  // two kv buffers
    uint8_t* s_scale = smem + 3 * kTileBytes;                          // FP8: [buffer][part] scale boxes
    float* s_m = reinterpret_cast<float*>(s_scale + 4 * kScaleBytes);  // [2 warpgroups][64 rows]
    float* s_sum = s_m + 2 * kRows;                                    // [2][64]
    int* s_limit = reinterpret_cast<int*>(s_sum + 2 * kRows);          // [64] visible positions per row
    uint64_t* bars = reinterpret_cast<uint64_t*>(s_limit + kRows);     // [buffer][left, right]

    // wg through a shuffle: warp-uniform in the compiler's eyes, so the wgmma in its branches are
    // not serialized.
    const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid / 128, 0), lane = tid % 32, tig = lane % 4;
    const int split = blockIdx.y, r = blockIdx.z, H = p.num_heads;
    const int q0 = p.query_start[r], num_rows = (p.query_start[r + 1] - q0) * H;
    const int first_row = blockIdx.x * kRows;  // request-local row = t_local * H + h
    if (first_row >= num_rows) return;         // this request has fewer query tokens than max_query_len
    const int total_rows = p.num_tokens * H;   // rows of the split partials

    if (tid == 0) {
        for (int i = 0; i < 4; ++i) sm90::mbar_init(&bars[i], 1);
        sm90::mbar_fence_init();
    }
    if (tid < kRows) {
        const int row = first_row + tid;
        s_limit[tid] = row < num_rows ? min(p.positions[q0 + row / H] + 1, p.kv_len[r]) : 0;
    }
    __syncthreads();
    int kv_end = 0;  // the CTA's causal horizon: no row sees position kv_end or later
    for (int i = 0; i < kRows; ++i) kv_end = max(kv_end, s_limit[i]);
    kv_end = __shfl_sync(0xffffffffu, kv_end, 0);  // warp-uniform for the compiler (as wg)
    const int num_tiles = (kv_end + kTile - 1) / kTile;
    const int per_split = (num_tiles + num_splits - 1) / num_splits;
    const int tile_begin = split * per_split, tile_end = min(num_tiles, tile_begin + per_split);
    // The tile holding kv_end when it ends inside one (its rows from `tail_valid` on get zeroed).
    const int tail_tile = kv_end % kTile ? num_tiles - 1 : -1, tail_valid = kv_end % kTile;

    // Rows this thread holds in the wgmma fragments (both warpgroups hold all 64 rows).
    const int r0 = (tid % 128) / 32 * 16 + lane / 4, r1 = r0 + 8;

    if (tile_begin >= tile_end) {  // only when split: nothing of this range is visible to any row
        if (tid < kRows && first_row + tid < num_rows) {
            const int row = first_row + tid, t = q0 + row / H, h = row % H;
            part_lse[size_t(split) * total_rows + size_t(t) * H + h] = -INFINITY;
        }
        return;
    }
    const int num_local = tile_end - tile_begin;

    const int32_t* blocks = p.block_table + int64_t(r) * p.max_blocks;
    // This warpgroup's part of buffer `buf` ← kv tile `tile` (one thread per warpgroup calls it).
    // `block`: blocks[tile], read well before (a global load here would sit on the warpgroup's path).
    auto load_part = [&](int block, int buf) {
        uint64_t* bar = &bars[2 * buf + wg];
        const bool rope = (wg == 0) == (buf == 1);
        const int row = block * kTile;
        uint8_t* dst = skv + buf * kTileBytes;
        if constexpr (kFp8) {
            sm90::mbar_arrive_expect_tx(bar, (rope ? 3 : 2) * kPanelBytes + kScaleBytes);
#pragma unroll
            for (int i = 0; i < 2; ++i)  // this half's 256 e4m3 columns → the upper half of its bf16 panels
                sm90::tma_load_2d(dst + (4 * wg + 2 + i) * kPanelBytes, &tmap_cache, bar, wg * 256 + i * 128, row);
            sm90::tma_load_2d(s_scale + (2 * buf + wg) * kScaleBytes, &tmap_scale, bar, 0, row);
            if (rope) sm90::tma_load_2d(dst + 8 * kPanelBytes, &tmap_rope, bar, 0, row);
        } else {
            sm90::mbar_arrive_expect_tx(bar, (rope ? 5 : 4) * kPanelBytes);
#pragma unroll
            for (int i = 4 * wg; i < 4 * wg + 4; ++i)
                sm90::tma_load_2d(dst + i * kPanelBytes, &tmap_cache, bar, i * 64, row);
            if (rope) sm90::tma_load_2d(dst + 8 * kPanelBytes, &tmap_cache, bar, 8 * 64, row);
        }
    };
    if (tid % 128 == 0) {
        load_part(blocks[tile_begin], 0);
        if (num_local > 1) load_part(blocks[tile_begin + 1], 1);
    }

    // Q rows (zeros past the request's rows).
    for (int i = tid; i < kRows * kChunks; i += kFastThreads) {
        const int row = i / kChunks, c = i % kChunks, lrow = first_row + row;
        const uint16_t* src = p.q_lat;
        if (lrow < num_rows) {
            const int64_t t = q0 + lrow / H, h = lrow % H;
            src = c < kLora / 8 ? p.q_lat + t * p.q_lat_stride_t + h * p.q_lat_stride_h + c * 8
                                : p.q_pe + t * p.q_pe_stride_t + h * p.q_pe_stride_h + (c - kLora / 8) * 8;
        }
        cp_async_16(sq + swizzled(row, c), src, lrow < num_rows ? 16 : 0);
    }
    cp_async_commit();
    cp_async_wait<0>();
    sm90::fence_proxy_async();
    __syncthreads();

    float o[128], s[32];
    uint32_t pk[16];  // own P in bf16 pairs: the register A operand of P·V
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = 0.0f;
    // Running maxima (raw scores: exp_base scales them) and this thread's partial row sums over its
    // own tiles, for rows r0 and r1.
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    const int lim0 = s_limit[r0], lim1 = s_limit[r1];
    uint8_t* const kva = skv;
    uint8_t* const kvb = skv + kTileBytes;
    const int num_pairs = (num_local + 1) / 2;

    if (wg == 0) {
        for (int k = 0; k < num_pairs; ++k) {
            const int ta = tile_begin + 2 * k;
            const bool has_b = 2 * k + 1 < num_local;
            const uint32_t parity = k & 1;
            // The blocks of the tiles this thread loads this round (B's left part, the next A's left part).
            int block_b = 0, block_next_a = 0;
            if (tid == 0) {
                if (k > 0 && has_b) block_b = blocks[ta + 1];
                if (2 * k + 2 < num_local) block_next_a = blocks[ta + 2];
            }
            // S_A: the left part (freed first) then the right.
            const int valid_a = ta == tail_tile ? tail_valid : kTile;
            sm90::mbar_wait(&bars[0], parity);
            if constexpr (kFp8) dequant_half(kva, 0, s_scale, valid_a, tid, kBarOwnWg + 0);
            sm90::fence_regs(s);
            sm90::wgmma_fence();
            wgmma_s_panels(s, sq, kva, 0, 4, true);
            sm90::wgmma_commit();
            if (k > 0) {  // P_B·V_B,L of the last pair has finished: buffer 1's left part is free
                sm90::wgmma_wait<1>();
                if (has_b && tid == 0) load_part(block_b, 1);
            }
            sm90::mbar_wait(&bars[1], parity);
            if constexpr (kFp8) dequant_half(kva, 1, s_scale + kScaleBytes, valid_a, tid, kBarOwnWg + 0);
            sm90::wgmma_fence();  // (what ptxas would insert after the wait loop anyway)
            wgmma_s_panels(s, sq, kva, 4, 5, false);
            sm90::wgmma_commit();
            sm90::wgmma_wait<0>();
            sm90::fence_regs(s);
            if (!kFp8 && ta == tail_tile) {  // (the FP8 dequantization wrote those rows as zeros)
                zero_tail_rows(kva, tail_valid, tid);
                sm90::fence_proxy_async();
                sm90::named_barrier(kBarOwnWg + 0, 128);
            }

            float mx0, mx1, sum0, sum1;
            mask_scores(s, ta, tig, lim0, lim1, mx0, mx1);
            const float ma0 = fmaxf(m0, mx0), ma1 = fmaxf(m1, mx1);
            const float base0 = exp_base(ma0, scale_log2), base1 = exp_base(ma1, scale_log2);
            const float corr0 = rescale_factor(m0, ma0, scale_log2), corr1 = rescale_factor(m1, ma1, scale_log2);
            if (tig == 0) s_m[r0] = ma0, s_m[r1] = ma1;
            sm90::named_barrier_arrive(kBarMaxLeft, 256);
            exp_scores(s, scale_log2, base0, base1, sum0, sum1);
            l0 = l0 * corr0 + sum0;
            l1 = l1 * corr1 + sum1;
#pragma unroll
            for (int i = 0; i < 16; ++i) pk[i] = sm90::pack_bf16_rn(s[2 * i], s[2 * i + 1]);
            // P_A for the right warpgroup, at m_a: stored before the wgmma that reads pk is issued
            // (its A registers may not be touched until it completes).
            sm90::store_rows_sw128(kva + 8 * kPanelBytes, pk, r0, lane);
            rescale_rows(o, corr0, corr1);
            sm90::fence_regs(o);
            sm90::fence_u32(pk);
            sm90::wgmma_fence();
            pv_from_regs(o, pk, kva, 0);
            sm90::wgmma_commit();

            // The right warpgroup's maxima after B: rescale to them, hand P_A over (rewritten at
            // m_b where a row's maximum moved).
            sm90::named_barrier(kBarMaxRight, 256);
            const float mb0 = s_m[kRows + r0], mb1 = s_m[kRows + r1];
            const float f0 = rescale_factor(ma0, mb0, scale_log2), f1 = rescale_factor(ma1, mb1, scale_log2);
            m0 = mb0, m1 = mb1;
            l0 *= f0;
            l1 *= f1;
            if (!__all_sync(0xffffffffu, f0 == 1.0f && f1 == 1.0f))
                store_p_scaled(kva + 8 * kPanelBytes, s, r0, lane, f0, f1);
            sm90::fence_proxy_async();
            sm90::named_barrier_arrive(kBarPLeft, 256);

            sm90::wgmma_wait<0>();  // P_A·V_A,L done: buffer 0's left part is free
            sm90::fence_regs(o);
            sm90::fence_u32(pk);
            if (2 * k + 2 < num_local && tid == 0) load_part(block_next_a, 0);
            rescale_rows(o, f0, f1);
            if (has_b) {
                sm90::named_barrier(kBarPRight, 256);
                sm90::mbar_wait(&bars[2], parity);
                sm90::fence_regs(o);
                sm90::wgmma_fence();
                pv_from_smem(o, kvb + 8 * kPanelBytes, kvb, 0);
                sm90::wgmma_commit();
            }
        }
    } else {
        for (int k = 0; k < num_pairs; ++k) {
            const int ta = tile_begin + 2 * k, tb = ta + 1;
            const bool has_b = 2 * k + 1 < num_local;
            const uint32_t parity = k & 1;
            float mx0 = -INFINITY, mx1 = -INFINITY;
            // The blocks of the tiles this thread loads this round (the next B's and A's right parts).
            int block_next_b = 0, block_next_a = 0;
            if (tid == 128) {
                if (2 * k + 3 < num_local) block_next_b = blocks[tb + 2];
                if (2 * k + 2 < num_local) block_next_a = blocks[ta + 2];
            }
            if (has_b) {  // S_B: the right part (freed first) then the left
                const int valid_b = tb == tail_tile ? tail_valid : kTile;
                sm90::mbar_wait(&bars[3], parity);
                if constexpr (kFp8) dequant_half(kvb, 1, s_scale + 3 * kScaleBytes, valid_b, tid - 128, kBarOwnWg + 1);
                sm90::fence_regs(s);
                sm90::wgmma_fence();
                wgmma_s_panels(s, sq, kvb, 4, 4, true);
                sm90::mbar_wait(&bars[2], parity);
                if constexpr (kFp8) dequant_half(kvb, 0, s_scale + 2 * kScaleBytes, valid_b, tid - 128, kBarOwnWg + 1);
                sm90::wgmma_fence();
                wgmma_s_panels(s, sq, kvb, 0, 4, false);
                wgmma_s_panels(s, sq, kvb, 8, 1, false);
                sm90::wgmma_commit();
                sm90::wgmma_wait<0>();
                sm90::fence_regs(s);
                if (!kFp8 && tb == tail_tile) {
                    zero_tail_rows(kvb, tail_valid, tid - 128);
                    sm90::fence_proxy_async();
                    sm90::named_barrier(kBarOwnWg + 1, 128);
                }
                mask_scores(s, tb, tig, lim0, lim1, mx0, mx1);
            }
            sm90::named_barrier(kBarMaxLeft, 256);
            const float ma0 = s_m[r0], ma1 = s_m[r1];
            const float mb0 = fmaxf(ma0, mx0), mb1 = fmaxf(ma1, mx1);
            const float base0 = exp_base(mb0, scale_log2), base1 = exp_base(mb1, scale_log2);
            // O_R and l scale from m to m_b (m ≤ m_a ≤ m_b).
            const float corr0 = rescale_factor(m0, mb0, scale_log2), corr1 = rescale_factor(m1, mb1, scale_log2);
            if (tig == 0) s_m[kRows + r0] = mb0, s_m[kRows + r1] = mb1;
            sm90::named_barrier_arrive(kBarMaxRight, 256);
            m0 = mb0, m1 = mb1;
            l0 *= corr0;
            l1 *= corr1;
            rescale_rows(o, corr0, corr1);
            if (has_b) {
                float sum0, sum1;
                exp_scores(s, scale_log2, base0, base1, sum0, sum1);
                l0 += sum0;
                l1 += sum1;
#pragma unroll
                for (int i = 0; i < 16; ++i) pk[i] = sm90::pack_bf16_rn(s[2 * i], s[2 * i + 1]);
                sm90::store_rows_sw128(kvb + 8 * kPanelBytes, pk, r0, lane);  // before the wgmma that reads pk
                sm90::fence_proxy_async();
                sm90::fence_regs(o);
                sm90::fence_u32(pk);
                sm90::wgmma_fence();
                pv_from_regs(o, pk, kvb, 1);
                sm90::wgmma_commit();
                sm90::named_barrier_arrive(kBarPRight, 256);
            }
            sm90::named_barrier(kBarPLeft, 256);
            sm90::mbar_wait(&bars[1], parity);
            sm90::fence_regs(o);
            sm90::wgmma_fence();
            pv_from_smem(o, kva + 8 * kPanelBytes, kva, 1);
            sm90::wgmma_commit();
            if (has_b) {  // P_B·V_B,R done: buffer 1's right part is free
                sm90::wgmma_wait<1>();
                if (2 * k + 3 < num_local && tid == 128) load_part(block_next_b, 1);
            }
            sm90::wgmma_wait<0>();  // (P_A·f)·V_A,R done: buffer 0's right part is free
            sm90::fence_regs(o);
            sm90::fence_u32(pk);
            if (2 * k + 2 < num_local && tid == 128) load_part(block_next_a, 0);
        }
    }
    sm90::wgmma_wait<0>();
    sm90::fence_regs(o);
    sm90::grid_launch_dependents();  // the combine may start launching (it waits for this grid's writes)

    // Row sums: the quad's columns, then the other warpgroup's tiles (both at the final maximum).
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, off);
        l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    }
    if (tig == 0) {
        s_sum[wg * kRows + r0] = l0;
        s_sum[wg * kRows + r1] = l1;
    }
    __syncthreads();
    l0 += s_sum[(wg ^ 1) * kRows + r0];
    l1 += s_sum[(wg ^ 1) * kRows + r1];

    if (num_splits == 1) {
        // O / l in bf16, staged through the first kv buffer (idle since the loop) by stmatrix as P
        // is, then each row's 1 KB written with coalesced 16-byte stores.
        constexpr int kPitch = kLora * 2 + 16;  // bytes per staged row; +16 puts stmatrix's rows on distinct banks
        static_assert(kRows * kPitch <= kTileBytes, "the staged output fits a kv buffer");
        const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
        const int srow = sm90::stmatrix_row(r0, lane);
#pragma unroll
        for (int q = 0; q < 16; ++q) {  // column blocks 2q and 2q + 1 of this warpgroup's 256
            const int j = 2 * q + lane / 16;
            sm90::stmatrix_x4(skv + srow * kPitch + (wg * 256 + 8 * j) * 2,
                              pack_bf16(o[8 * q] * inv0, o[8 * q + 1] * inv0),
                              pack_bf16(o[8 * q + 2] * inv1, o[8 * q + 3] * inv1),
                              pack_bf16(o[8 * q + 4] * inv0, o[8 * q + 5] * inv0),
                              pack_bf16(o[8 * q + 6] * inv1, o[8 * q + 7] * inv1));
        }
        __syncthreads();
        for (int i = tid; i < kRows * (kLora / 8); i += kFastThreads) {
            const int lrow = i / (kLora / 8), c = i % (kLora / 8), row = first_row + lrow;
            if (row >= num_rows) continue;
            const int64_t t = q0 + row / H, h = row % H;
            *reinterpret_cast<uint4*>(p.out + t * p.out_stride_t + h * p.out_stride_h + c * 8) =
                *reinterpret_cast<const uint4*>(skv + lrow * kPitch + c * 16);
        }
        return;
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = first_row + (half ? r1 : r0);
        if (row >= num_rows) continue;
        const int64_t t = q0 + row / H, h = row % H;
        const float l = half ? l1 : l0, m = half ? m1 : m0;
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        const size_t prow = size_t(split) * total_rows + size_t(t) * H + h;
        float* dst = part_o + prow * kLora + wg * 256 + 2 * tig;
#pragma unroll
        for (int j = 0; j < 32; ++j)
            *reinterpret_cast<float2*>(dst + 8 * j) =
                make_float2(o[4 * j + 2 * half] * inv, o[4 * j + 2 * half + 1] * inv);
        if (wg == 0 && tig == 0) part_lse[prow] = l > 0.0f ? m * scale_log2 + log2f(l) : -INFINITY;
    }
}

// ======================================================================================
// Generic kernel
// ======================================================================================
constexpr int kGenThreads = 128;
constexpr int kGenMaxLora = 1024, kGenMaxRope = 128;
constexpr int kGenAcc = kGenMaxLora / kGenThreads;  // output values per thread

template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float u = __shfl_xor_sync(0xffffffffu, v, off);
        v = kMax ? fmaxf(v, u) : v + u;
    }
    __syncthreads();  // scratch may still be read from the previous call
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    v = scratch[0];
#pragma unroll
    for (int w = 1; w < kGenThreads / 32; ++w) v = kMax ? fmaxf(v, scratch[w]) : v + scratch[w];
    return v;
}

// Value d of the entry in `slot`: the bf16 cache's, or the FP8 entry's e4m3 · scale rounded once to
// bf16 (as the tensor-core kernel's conversion and the MHA form's gather compute it) and its bf16
// rope values.
__device__ __forceinline__ float cache_value(const MlaAttentionParams& p, int64_t slot, int d) {
    if (p.cache_fp8 == nullptr) return bf16_bits_to_float(p.cache[slot * (p.kv_lora + p.rope_dim) + d]);
    const MlaFp8Layout L{p.kv_lora, p.rope_dim};
    const uint8_t* e = p.cache_fp8 + slot * L.entry_bytes();
    if (d >= p.kv_lora)
        return bf16_bits_to_float(reinterpret_cast<const uint16_t*>(e + L.rope_offset())[d - p.kv_lora]);
    const float scale = reinterpret_cast<const float*>(e + L.scale_offset())[d / kFp8Block];
    return bf16_bits_to_float(float_to_bf16_bits(fp8_cache_value(e[d], scale)));
}

// grid (T, H, splits); one CTA per (token, head, split), positions [begin, end) of the split in
// chunks of 128: a thread scores one position, then every thread accumulates its output columns.
__global__ void __launch_bounds__(kGenThreads)
    mla_generic_kernel(const MlaAttentionParams p, int num_splits, float scale_log2, float* part_o, float* part_lse) {
    pdl_enter();
    __shared__ float sq[kGenMaxLora + kGenMaxRope];
    __shared__ float sp[kGenThreads];
    __shared__ int64_t s_slot[kGenThreads];
    __shared__ float scratch[kGenThreads / 32];
    const int t = blockIdx.x, h = blockIdx.y, split = blockIdx.z, tid = threadIdx.x;
    const int H = p.num_heads, C = p.kv_lora, D = p.kv_lora + p.rope_dim, bs = p.block_size;
    const int r = segment_of(p.query_start, p.num_requests, t);  // token t's request
    const int visible = min(p.positions[t] + 1, p.kv_len[r]);
    const int per_split = (visible + num_splits - 1) / num_splits;
    const int begin = split * per_split, end = min(visible, begin + per_split);
    const size_t row = size_t(t) * H + h, prow = size_t(split) * p.num_tokens * H + row;
    if (begin >= end) {
        if (tid == 0) part_lse[prow] = -INFINITY;
        return;
    }
    for (int d = tid; d < D; d += kGenThreads)
        sq[d] = bf16_bits_to_float(d < C ? p.q_lat[t * p.q_lat_stride_t + h * p.q_lat_stride_h + d]
                                         : p.q_pe[t * p.q_pe_stride_t + h * p.q_pe_stride_h + d - C]);
    __syncthreads();

    const int32_t* blocks = p.block_table + int64_t(r) * p.max_blocks;
    float acc[kGenAcc];
#pragma unroll
    for (int k = 0; k < kGenAcc; ++k) acc[k] = 0.0f;
    float m = -INFINITY, l_part = 0.0f;
    for (int j0 = begin; j0 < end; j0 += kGenThreads) {
        const int j = j0 + tid;
        float sc = -INFINITY;
        if (j < end) {
            const int64_t slot = int64_t(blocks[j / bs]) * bs + j % bs;
            s_slot[tid] = slot;
            float dot = 0.0f;
            for (int d = 0; d < D; ++d) dot = fmaf(sq[d], cache_value(p, slot, d), dot);
            sc = dot * scale_log2;
        }
        const float m_new = fmaxf(m, block_reduce<true>(sc, scratch));  // finite: position j0 is visible
        const float corr = exp2f(m - m_new);
        m = m_new;
        const float pj = j < end ? exp2f(sc - m) : 0.0f;
        sp[tid] = pj;
        l_part = l_part * corr + pj;
        __syncthreads();
        const int n = min(kGenThreads, end - j0);
#pragma unroll
        for (int k = 0; k < kGenAcc; ++k) {
            const int d = tid + k * kGenThreads;
            if (d < C) {
                float a = acc[k] * corr;
                for (int jj = 0; jj < n; ++jj) a = fmaf(sp[jj], cache_value(p, s_slot[jj], d), a);
                acc[k] = a;
            }
        }
        __syncthreads();  // sp and s_entry are rewritten by the next chunk
    }
    const float l = block_reduce<false>(l_part, scratch);
    const float inv = 1.0f / l;  // l ≥ 1: the maximum's own term
    if (num_splits == 1) {
        uint16_t* dst = p.out + int64_t(t) * p.out_stride_t + int64_t(h) * p.out_stride_h;
#pragma unroll
        for (int k = 0; k < kGenAcc; ++k)
            if (tid + k * kGenThreads < C) dst[tid + k * kGenThreads] = float_to_bf16_bits(acc[k] * inv);
    } else {
        float* dst = part_o + prow * C;
#pragma unroll
        for (int k = 0; k < kGenAcc; ++k)
            if (tid + k * kGenThreads < C) dst[tid + k * kGenThreads] = acc[k] * inv;
        if (tid == 0) part_lse[prow] = m + log2f(l);
    }
}

// ======================================================================================
// Combine
// ======================================================================================
constexpr int kCombineThreads = 128;

// grid (T·H rows, column blocks of 128): out = Σ_s 2^(lse_s − max) · o_s / Σ_s 2^(lse_s − max). Splits
// with lse = −inf saw nothing of the row; their partial rows were never written and are not read. A
// thread owns one column and reads eight splits' values at once (independent loads). Launched as a
// programmatic dependent of the split kernel (launch_pdl): it waits for that grid's writes before reading.
__global__ void __launch_bounds__(kCombineThreads)
    mla_combine_kernel(const MlaAttentionParams p, int num_splits, const float* part_o, const float* part_lse) {
    __shared__ float s_w[kMaxSplits];
    __shared__ float s_inv;
    const int total_rows = p.num_tokens * p.num_heads, C = p.kv_lora;
    const int row = blockIdx.x, tid = threadIdx.x, d = blockIdx.y * kCombineThreads + tid;
    pdl_enter();
    if (tid < 32) {
        float lse[kMaxSplits / 32];
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < kMaxSplits / 32; ++i) {
            const int s = tid + 32 * i;
            lse[i] = s < num_splits ? part_lse[size_t(s) * total_rows + row] : -INFINITY;
            mx = fmaxf(mx, lse[i]);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < kMaxSplits / 32; ++i) {
            const float w = lse[i] == -INFINITY ? 0.0f : exp2f(lse[i] - mx);
            s_w[tid + 32 * i] = w;
            sum += w;
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        if (tid == 0) s_inv = 1.0f / sum;
    }
    __syncthreads();
    const float inv = s_inv;
    const int t = row / p.num_heads, h = row % p.num_heads;
    uint16_t* dst = p.out + int64_t(t) * p.out_stride_t + int64_t(h) * p.out_stride_h;
    const float* src = part_o + size_t(row) * C;
    const size_t split_stride = size_t(total_rows) * C;
    if (d < C) {
        float acc = 0.0f;
        for (int s0 = 0; s0 < num_splits; s0 += 8) {
            float v[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) v[i] = s_w[s0 + i] != 0.0f ? src[(s0 + i) * split_stride + d] : 0.0f;
#pragma unroll
            for (int i = 0; i < 8; ++i) acc = fmaf(s_w[s0 + i], v[i], acc);
        }
        dst[d] = float_to_bf16_bits(acc * inv);
    }
}

// ======================================================================================
// FP8 cache entries
// ======================================================================================
// A warp per entry: lane L holds c_kv values [16L, 16L + 16) (scale group L / 8) and, for L < 8,
// rope bytes [16L, 16L + 16).
__global__ void __launch_bounds__(128) quantize_latent_fp8_kernel(const uint16_t* in, int64_t n, uint8_t* out) {
    const int64_t e = int64_t(blockIdx.x) * 4 + threadIdx.x / 32;
    if (e >= n) return;
    const int lane = threadIdx.x % 32;
    const uint16_t* src = in + e * kDim;
    uint8_t* dst = out + e * kMlaFp8EntryBytes;
    const uint4 a = *reinterpret_cast<const uint4*>(src + 16 * lane),
                b = *reinterpret_cast<const uint4*>(src + 16 * lane + 8);
    const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    float v[16], amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        v[2 * i] = bf16_bits_to_float(uint16_t(w[i] & 0xffffu));
        v[2 * i + 1] = bf16_bits_to_float(uint16_t(w[i] >> 16));
        amax = fmaxf(amax, fmaxf(fabsf(v[2 * i]), fabsf(v[2 * i + 1])));
    }
#pragma unroll
    for (int off = 1; off < 8; off <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const float scale = fp8_cache_scale(amax);
    uint32_t q[4] = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < 16; ++i)
        q[i / 4] |= uint32_t(__nv_cvt_float_to_fp8(v[i] / scale, __NV_SATFINITE, __NV_E4M3)) << (8 * (i % 4));
    *reinterpret_cast<uint4*>(dst + 16 * lane) = make_uint4(q[0], q[1], q[2], q[3]);
    if (lane % 8 == 0) *reinterpret_cast<float*>(dst + kMlaFp8ScaleOffset + 4 * (lane / 8)) = scale;
    if (lane < 8)
        *reinterpret_cast<uint4*>(dst + kMlaFp8RopeOffset + 16 * lane) =
            *reinterpret_cast<const uint4*>(src + kLora + 8 * lane);
}

// ======================================================================================
// Host
// ======================================================================================
void check_params(const MlaAttentionParams& p) {
    const std::string dims = " (T=" + std::to_string(p.num_tokens) + " R=" + std::to_string(p.num_requests) +
                             " H=" + std::to_string(p.num_heads) + " kv_lora=" + std::to_string(p.kv_lora) +
                             " rope=" + std::to_string(p.rope_dim) + " block=" + std::to_string(p.block_size) + ")";
    FANOUT_DEVICE_REQUIRE(p.num_tokens >= 0 && p.num_requests >= 1 && p.num_heads >= 1 && p.num_heads <= 65535,
                          "mla attention: bad counts" + dims);
    FANOUT_DEVICE_REQUIRE(p.kv_lora >= 1 && p.kv_lora <= kGenMaxLora && p.rope_dim >= 1 && p.rope_dim <= kGenMaxRope,
                          "mla attention: needs 1 <= kv_lora <= 1024 and 1 <= rope <= 128" + dims);
    FANOUT_DEVICE_REQUIRE(p.block_size >= 1 && p.max_blocks >= 1 && p.max_query_len >= 1,
                          "mla attention: block_size, max_blocks and max_query_len must be positive" + dims);
    FANOUT_DEVICE_REQUIRE(p.query_start && p.kv_len && p.positions && p.block_table && p.q_lat && p.q_pe && p.out,
                          "mla attention: a null device pointer" + dims);
    FANOUT_DEVICE_REQUIRE((p.cache == nullptr) != (p.cache_fp8 == nullptr),
                          "mla attention: exactly one of cache (bf16) and cache_fp8 must be set" + dims);
}

bool aligned(const void* ptr, size_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

// Splits so that CTAs × splits fill the SMs once (floor: a second, partial wave costs more than
// it gains), capped by kMaxSplits and by what the workspace holds.
int pick_splits(int64_t ctas, const MlaAttentionParams& p, const MlaWorkspace* ws, int force_splits) {
    int splits =
        force_splits > 0 ? force_splits : int(std::max<int64_t>(1, device_sm_count() / std::max<int64_t>(1, ctas)));
    splits = std::min(splits, kMaxSplits);
    if (splits <= 1) return 1;
    const size_t per_split = size_t(p.num_tokens) * size_t(p.num_heads) * size_t(p.kv_lora + 1);
    const size_t fits = ws == nullptr || per_split == 0 ? 0 : ws->partial_floats / per_split;
    splits = int(std::min<size_t>(size_t(splits), fits));
    return std::max(splits, 1);
}

void launch_combine(const MlaAttentionParams& p, int splits, const float* part_o, const float* part_lse,
                    cudaStream_t stream) {
    const int64_t rows = int64_t(p.num_tokens) * p.num_heads;
    launch_pdl(mla_combine_kernel, dim3(unsigned(rows), unsigned((p.kv_lora + kCombineThreads - 1) / kCombineThreads)),
               kCombineThreads, 0, stream, p, splits, part_o, part_lse);
}

// The FP8 cache's three views, each [kTmapRows rows 656 bytes apart]: the e4m3 c_kv in boxes of 64
// rows × 128 bytes (128-byte swizzle), the scales in 64 × 16 bytes (no swizzle), the bf16 rope part
// in 64 × 64 values (128-byte swizzle: a k_pe panel as the bf16 cache's).
struct Fp8CacheMaps {
    CUtensorMap c_kv, scale, rope;
};

Fp8CacheMaps fp8_cache_tensor_maps(const uint8_t* cache) {
    TensorMapSpec s;
    s.type = CU_TENSOR_MAP_DATA_TYPE_UINT8;
    s.elem_bytes = 1;
    s.base = cache;
    s.rank = 2;
    s.dims[0] = kLora;
    s.dims[1] = kTmapRows;
    s.strides[0] = kMlaFp8EntryBytes;
    s.box[0] = 128;
    s.box[1] = kTile;
    Fp8CacheMaps m;
    m.c_kv = make_tensor_map(s, "mla attention: the FP8 cache's c_kv");
    s.base = cache + kMlaFp8ScaleOffset;
    s.dims[0] = 16;
    s.box[0] = 16;
    s.swizzle = CU_TENSOR_MAP_SWIZZLE_NONE;
    m.scale = make_tensor_map(s, "mla attention: the FP8 cache's scales");
    s.type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    s.elem_bytes = 2;
    s.base = cache + kMlaFp8RopeOffset;
    s.dims[0] = kRope;
    s.box[0] = 64;
    s.swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
    m.rope = make_tensor_map(s, "mla attention: the FP8 cache's rope part");
    return m;
}

// The cache as a [kTmapRows, 576] bf16 matrix in 64 × 64 boxes (one swizzled panel of one block).
CUtensorMap cache_tensor_map(const uint16_t* cache) {
    TensorMapSpec s;
    s.base = cache;
    s.rank = 2;
    s.dims[0] = kDim;
    s.dims[1] = kTmapRows;
    s.strides[0] = kDim * sizeof(uint16_t);
    s.box[0] = 64;
    s.box[1] = kTile;
    return make_tensor_map(s, "mla attention: the cache");
}

}  // namespace

MlaWorkspace::MlaWorkspace(size_t partial_bytes) : partial_floats(partial_bytes / sizeof(float)) {
    if (partial_floats > 0) FANOUT_CUDA_CHECK(cudaMalloc(&partials, partial_floats * sizeof(float)));
}

MlaWorkspace::~MlaWorkspace() { cudaFree(partials); }

void launch_quantize_latent_fp8(const uint16_t* entries, int64_t n, uint8_t* out, void* cuda_stream) {
    FANOUT_DEVICE_REQUIRE(n >= 0 && n / 4 < 0x7fffffff, "quantize_latent_fp8: " + std::to_string(n) + " entries");
    FANOUT_DEVICE_REQUIRE(aligned(entries, 16) && aligned(out, 16),
                          "quantize_latent_fp8: pointers must be 16-byte aligned");
    if (n == 0) return;
    quantize_latent_fp8_kernel<<<unsigned((n + 3) / 4), 128, 0, static_cast<cudaStream_t>(cuda_stream)>>>(entries, n,
                                                                                                          out);
    FANOUT_CUDA_CHECK_LAUNCH("quantize_latent_fp8_kernel");
}

MlaKernel mla_attention_kernel_for(const MlaAttentionParams& p) {
    const bool widths = p.kv_lora == kLora && p.rope_dim == kRope && p.block_size == kTile;
    // 16-byte cp.async of q rows; 16-byte stores of out rows.
    const bool layout = aligned(p.q_lat, 16) && aligned(p.q_pe, 16) && aligned(p.cache, 16) &&
                        aligned(p.cache_fp8, 16) && aligned(p.out, 16) && p.q_lat_stride_t % 8 == 0 &&
                        p.q_lat_stride_h % 8 == 0 && p.q_pe_stride_t % 8 == 0 && p.q_pe_stride_h % 8 == 0 &&
                        p.out_stride_t % 8 == 0 && p.out_stride_h % 8 == 0;
    // Row maxima are taken on raw scores, which needs a positive scale (the generic kernel takes any).
    return widths && layout && p.scale > 0.0f && p.num_requests <= 65535 ? MlaKernel::kTensorCore : MlaKernel::kGeneric;
}

void launch_mla_attention_generic(const MlaAttentionParams& p, MlaWorkspace* workspace, void* cuda_stream,
                                  int force_splits) {
    check_params(p);
    FANOUT_DEVICE_REQUIRE(p.cache_fp8 == nullptr || mla_fp8_widths_ok(p.kv_lora, p.rope_dim),
                          "mla attention: the FP8 cache needs kv_lora a multiple of 4 and an even rope width" +
                              std::string(" (kv_lora=") + std::to_string(p.kv_lora) +
                              " rope=" + std::to_string(p.rope_dim) + ")");
    if (p.num_tokens == 0) return;
    const auto stream = static_cast<cudaStream_t>(cuda_stream);
    const int splits = pick_splits(int64_t(p.num_tokens) * p.num_heads, p, workspace, force_splits);
    float* part_o = splits > 1 ? workspace->partials : nullptr;
    float* part_lse = splits > 1 ? part_o + size_t(splits) * p.num_tokens * p.num_heads * p.kv_lora : nullptr;
    launch_pdl(mla_generic_kernel, dim3(unsigned(p.num_tokens), unsigned(p.num_heads), unsigned(splits)), kGenThreads,
               0, stream, p, splits, p.scale * kLog2e, part_o, part_lse);
    if (splits > 1) launch_combine(p, splits, part_o, part_lse, stream);
}

void launch_mla_attention(const MlaAttentionParams& p, MlaWorkspace* workspace, void* cuda_stream, int force_splits) {
    check_params(p);
    if (p.num_tokens == 0) return;
    if (mla_attention_kernel_for(p) == MlaKernel::kGeneric) {
        launch_mla_attention_generic(p, workspace, cuda_stream, force_splits);
        return;
    }
    static PerDevice<bool> smem_set_on;  // the attribute is the current device's only
    smem_set_on.get([] {
        for (auto kernel : {mla_fast_kernel<false>, mla_fast_kernel<true>})
            FANOUT_CUDA_CHECK(
                cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kFastSmemBytes));
        return true;
    });
    const auto stream = static_cast<cudaStream_t>(cuda_stream);
    const int64_t row_blocks = (int64_t(p.max_query_len) * p.num_heads + kRows - 1) / kRows;
    FANOUT_DEVICE_REQUIRE(row_blocks <= 0x7fffffff, "mla attention: max_query_len × heads too large");
    const int splits = pick_splits(row_blocks * p.num_requests, p, workspace, force_splits);
    float* part_o = splits > 1 ? workspace->partials : nullptr;
    float* part_lse = splits > 1 ? part_o + size_t(splits) * p.num_tokens * p.num_heads * kLora : nullptr;
    const dim3 grid(unsigned(row_blocks), unsigned(splits), unsigned(p.num_requests));
    // A plain launch, not launch_pdl: with the programmatic dependency the kernel alone measured
    // 0.6% slower (bench mla, batch 128: 575–576 against 572 µs; PERF.md, 2026-12-03).
    if (p.cache_fp8 != nullptr) {
        const Fp8CacheMaps m = fp8_cache_tensor_maps(p.cache_fp8);
        mla_fast_kernel<true><<<grid, kFastThreads, kFastSmemBytes, stream>>>(m.c_kv, m.rope, m.scale, p, splits,
                                                                              p.scale * kLog2e, part_o, part_lse);
    } else {
        const CUtensorMap tmap = cache_tensor_map(p.cache);
        mla_fast_kernel<false><<<grid, kFastThreads, kFastSmemBytes, stream>>>(tmap, tmap, tmap, p, splits,
                                                                               p.scale * kLog2e, part_o, part_lse);
    }
    FANOUT_CUDA_CHECK_LAUNCH("mla_fast_kernel");
    if (splits > 1) launch_combine(p, splits, part_o, part_lse, stream);
}

}  // namespace fanout::ops

// MLA prefill attention, MHA form, on the GPU: see mha_prefill_cuda.h for the math and the contract.
//
// * mha_fast_kernel (nope 128 / rope 64 / v 128), FlashAttention-2 style on mma.sync m16n8k16 bf16:
//   grid (⌈T / 64⌉, H); a CTA owns 64 query rows of one head, four warps of 16 rows each. Q (64 × 192)
//   is staged through shared memory once and kept in registers as A fragments. Key tiles of 64
//   positions — K = [k_nope | k_pe] (64 × 192) and V (64 × 128) — stream through two shared-memory
//   buffers by cp.async, K of tile n + 1 and V of tile n + 1 each in flight while tile n is used:
//     S = Q·Kᵀ          12 k-steps × 8 n-tiles of mma per warp, K fragments by ldmatrix;
//     online softmax   per row in f32 (base 2, scale folded in), rows spread over a lane quad;
//     O += P·V          P re-packed from the S accumulators to bf16 A fragments (no shared
//                       memory round trip), V fragments by ldmatrix.trans.
//   Causal: a CTA reads only the tiles up to its last row's position; tiles past its first row's
//   position get the per-element mask. Tiles run from key 0 upward, so every row's running maximum
//   is finite from the first tile on (key 0 is visible to every query).
//   Shared-memory rows are 16-byte chunks XOR-swizzled by row % 8 within each 128 bytes, so the
//   eight row addresses of every ldmatrix phase fall in distinct banks.
// * mha_generic_kernel: a warp per (token, head), f32 throughout; any widths and alignments.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "fanout/core/cuda_check.h"
#include "fanout/ops/bf16_bits.cuh"
#include "fanout/ops/mha_prefill_cuda.h"

namespace fanout::ops {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

// Two f32 → bf16x2 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16_rn(float lo, float hi) {
    uint32_t d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

// 2^x; 2^−∞ = 0.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- cp.async (16 bytes; src_bytes = 0 writes zeros and reads nothing) ----
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// ---- ldmatrix / mma ----
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// d[16, 8] += a[16, 16] · b[16, 8], bf16 operands, f32 accumulators. Fragments (g = lane / 4,
// c = 2 · (lane % 4)): a0 (g, c..c+1), a1 (g+8, c..), a2 (g, c+8..), a3 (g+8, c+8..); b0 (k c..c+1,
// n g), b1 (k c+8.., n g); d0,d1 (g, c..c+1), d2,d3 (g+8, c..c+1).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ======================================================================================
// Fast kernel
// ======================================================================================
constexpr int kNope = 128, kRope = 64, kQk = kNope + kRope, kVDim = 128;
constexpr int kBlockM = 64;  // query rows per CTA
constexpr int kBlockN = 64;  // keys per tile
constexpr int kFastWarps = kBlockM / 16;
constexpr int kFastThreads = 32 * kFastWarps;
constexpr int kQkChunks = kQk / 8;  // 16-byte chunks per Q/K row: 24 (16 of nope, 8 of rope)
constexpr int kNopeChunks = kNope / 8;
constexpr int kVChunks = kVDim / 8;  // 16
constexpr int kQTileBytes = kBlockM * kQk * 2;
constexpr int kKTileBytes = kBlockN * kQk * 2;
constexpr int kVTileBytes = kBlockN * kVDim * 2;
constexpr int kFastSmemBytes = kQTileBytes + 2 * kKTileBytes + 2 * kVTileBytes;  // 104 KB: two CTAs per SM
static_assert(kQkChunks % 8 == 0 && kVChunks % 8 == 0, "the swizzle permutes chunks within groups of 8");
static_assert(kBlockM % 16 == 0 && kBlockN % 16 == 0 && kQk % 16 == 0 && kVDim % 16 == 0, "mma tiling");

// Byte offset of 16-byte chunk c of row r in a tile whose rows are kChunks chunks wide.
template <int kChunks>
__device__ __forceinline__ uint32_t swizzled(int r, int c) {
    return uint32_t(r * (kChunks * 16) + ((c ^ (r & 7)) << 4));
}

// Q rows m0 .. m0 + kBlockM of head h; rows past T are zero-filled.
__device__ __forceinline__ void load_q_tile(uint32_t sq, const MhaPrefillParams& p, int m0, int h) {
    const uint16_t* base = p.q + int64_t(h) * p.q_stride_h;
    for (int i = threadIdx.x; i < kBlockM * kQkChunks; i += kFastThreads) {
        const int r = i / kQkChunks, c = i % kQkChunks, t = m0 + r;
        const bool ok = t < p.num_tokens;
        cp_async_16(sq + swizzled<kQkChunks>(r, c), base + int64_t(ok ? t : 0) * p.q_stride_t + c * 8, ok ? 16 : 0);
    }
}

// K rows [key0, key0 + kBlockN) = [k_nope[j, h] | k_pe[j]]; keys ≥ n_keys are zero-filled.
__device__ __forceinline__ void load_k_tile(uint32_t sk, const MhaPrefillParams& p, int key0, int n_keys, int h) {
    const uint16_t* nope = p.k_nope + int64_t(h) * p.k_stride_h;
    for (int i = threadIdx.x; i < kBlockN * kQkChunks; i += kFastThreads) {
        const int r = i / kQkChunks, c = i % kQkChunks, j = key0 + r;
        const bool ok = j < n_keys;
        const int64_t jj = ok ? j : 0;
        const uint16_t* src =
            c < kNopeChunks ? nope + jj * p.k_stride_t + c * 8 : p.k_pe + jj * p.k_pe_stride_t + (c - kNopeChunks) * 8;
        cp_async_16(sk + swizzled<kQkChunks>(r, c), src, ok ? 16 : 0);
    }
}

// V rows [key0, key0 + kBlockN) of head h; keys ≥ n_keys are zero-filled (0 · garbage could be NaN).
__device__ __forceinline__ void load_v_tile(uint32_t sv, const MhaPrefillParams& p, int key0, int n_keys, int h) {
    const uint16_t* base = p.v + int64_t(h) * p.v_stride_h;
    for (int i = threadIdx.x; i < kBlockN * kVChunks; i += kFastThreads) {
        const int r = i / kVChunks, c = i % kVChunks, j = key0 + r;
        const bool ok = j < n_keys;
        cp_async_16(sv + swizzled<kVChunks>(r, c), base + int64_t(ok ? j : 0) * p.v_stride_t + c * 8, ok ? 16 : 0);
    }
}

// s[8 n-tiles of 8 keys][4] = Q (this warp's 16 rows) · Kᵀ (the tile's 64 keys).
__device__ __forceinline__ void score_tile(float (&s)[kBlockN / 8][4], const uint32_t (&qf)[kQk / 16][4], uint32_t sk,
                                           int lane) {
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    // ldmatrix.x4 lanes 0-7 / 8-15 / 16-23 / 24-31 address keys +0..7 chunk 2kk, +0..7 chunk 2kk+1,
    // +8..15 chunk 2kk, +8..15 chunk 2kk+1: registers {b0, b1} of two consecutive n-tiles.
    const int key_in_pair = (lane & 7) + ((lane >> 4) << 3), chunk_hi = (lane >> 3) & 1;
#pragma unroll
    for (int kk = 0; kk < kQk / 16; ++kk)
#pragma unroll
        for (int np = 0; np < kBlockN / 16; ++np) {
            uint32_t b[4];
            ldmatrix_x4(b, sk + swizzled<kQkChunks>(np * 16 + key_in_pair, 2 * kk + chunk_hi));
            mma_bf16_16816(s[2 * np], qf[kk], b[0], b[1]);
            mma_bf16_16816(s[2 * np + 1], qf[kk], b[2], b[3]);
        }
}

// o[16 n-tiles of 8 columns][4] += P (16 rows × 64 keys, bf16 A fragments per 16 keys) · V tile.
__device__ __forceinline__ void accumulate_pv(float (&o)[kVDim / 8][4], const uint32_t (&pf)[kBlockN / 16][4],
                                              uint32_t sv, int lane) {
    // ldmatrix.x4.trans lanes 0-15 address keys +0..15 of chunk 2dp, lanes 16-31 of chunk 2dp+1:
    // registers {b0, b1} of n-tiles 2dp and 2dp+1.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
#pragma unroll
        for (int dp = 0; dp < kVDim / 16; ++dp) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, sv + swizzled<kVChunks>(kk * 16 + (lane & 15), 2 * dp + (lane >> 4)));
            mma_bf16_16816(o[2 * dp], pf[kk], b[0], b[1]);
            mma_bf16_16816(o[2 * dp + 1], pf[kk], b[2], b[3]);
        }
}

// grid (⌈T / kBlockM⌉, H). scale_log2 = scale · log2(e); scores are kept raw, exponents in base 2.
__global__ void __launch_bounds__(kFastThreads, 2) mha_fast_kernel(const MhaPrefillParams p, float scale_log2) {
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t sq = smem_u32(smem), sk0 = sq + kQTileBytes, sv0 = sk0 + 2 * kKTileBytes;
    const int h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int T = p.num_tokens, prefix = p.ctx_len - T;
    const int m0 = (gridDim.x - 1 - blockIdx.x) * kBlockM;  // the last (longest) query blocks start first
    // Keys visible to any of the CTA's rows: [0, n_keys); tiles from `first_masked` on hold a key past
    // the first row's position.
    const int n_keys = prefix + min(m0 + kBlockM, T);
    const int n_tiles = (n_keys + kBlockN - 1) / kBlockN;
    const int first_masked = (prefix + m0 + 1) / kBlockN;

    load_q_tile(sq, p, m0, h);
    load_k_tile(sk0, p, 0, n_keys, h);
    cp_async_commit();
    load_v_tile(sv0, p, 0, n_keys, h);
    cp_async_commit();

    // This thread's two rows: quad row g and g + 8 of the warp's 16 (positions pos[0], pos[1]).
    const int row0 = m0 + warp * 16 + lane / 4;
    const int pos[2] = {prefix + row0, prefix + row0 + 8};
    uint32_t qf[kQk / 16][4];
    float o[kVDim / 8][4];
#pragma unroll
    for (int d = 0; d < kVDim / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY};  // raw scores
    float row_sum[2] = {0.0f, 0.0f};            // this lane's share of Σ 2^(score·scale_log2 − max·scale_log2)

    for (int n = 0; n < n_tiles; ++n) {
        const int buf = n & 1;
        cp_async_wait<1>();  // Q and K of tile n have landed (V of tile n may be in flight)
        __syncthreads();     // ... for every thread; and tile n − 1 is no longer read by anyone
        if (n == 0) {
#pragma unroll
            for (int kk = 0; kk < kQk / 16; ++kk)
                ldmatrix_x4(qf[kk], sq + swizzled<kQkChunks>(warp * 16 + (lane & 15), 2 * kk + (lane >> 4)));
        }
        if (n + 1 < n_tiles) load_k_tile(sk0 + (buf ^ 1) * kKTileBytes, p, (n + 1) * kBlockN, n_keys, h);
        cp_async_commit();

        float s[kBlockN / 8][4];
        score_tile(s, qf, sk0 + buf * kKTileBytes, lane);
        if (n >= first_masked) {
#pragma unroll
            for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (n * kBlockN + j * 8 + 2 * (lane % 4) + (e & 1) > pos[e >> 1]) s[j][e] = -INFINITY;
        }

        // Online softmax: the tile's row maxima over the quad, rescale O and the sums.
        float scaled_max[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = row_max[r];
#pragma unroll
            for (int j = 0; j < kBlockN / 8; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            // Finite from tile 0 on (key 0 is visible to every row); the guard keeps NaN out regardless.
            scaled_max[r] = mx == -INFINITY ? 0.0f : mx * scale_log2;
            const float corr = fast_exp2(row_max[r] * scale_log2 - scaled_max[r]);  // 0 on the first tile
            row_max[r] = mx;
            row_sum[r] *= corr;
#pragma unroll
            for (int d = 0; d < kVDim / 8; ++d) o[d][2 * r] *= corr, o[d][2 * r + 1] *= corr;
        }
        // P = 2^(s·scale_log2 − max), packed into the A fragments of P·V: n-tiles 2kk and 2kk + 1 of S
        // are the left and right halves of k-step kk.
        uint32_t pf[kBlockN / 16][4];
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j) {
            const float p0 = fast_exp2(fmaf(s[j][0], scale_log2, -scaled_max[0]));
            const float p1 = fast_exp2(fmaf(s[j][1], scale_log2, -scaled_max[0]));
            const float p2 = fast_exp2(fmaf(s[j][2], scale_log2, -scaled_max[1]));
            const float p3 = fast_exp2(fmaf(s[j][3], scale_log2, -scaled_max[1]));
            row_sum[0] += p0 + p1;
            row_sum[1] += p2 + p3;
            pf[j / 2][(j % 2) * 2] = pack_bf16_rn(p0, p1);
            pf[j / 2][(j % 2) * 2 + 1] = pack_bf16_rn(p2, p3);
        }

        cp_async_wait<1>();  // V of tile n has landed (K of tile n + 1 may be in flight)
        __syncthreads();
        if (n + 1 < n_tiles) load_v_tile(sv0 + (buf ^ 1) * kVTileBytes, p, (n + 1) * kBlockN, n_keys, h);
        cp_async_commit();
        accumulate_pv(o, pf, sv0 + buf * kVTileBytes, lane);
    }
    cp_async_wait<0>();  // nothing is pending (the last groups are empty); leave no copy behind

#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float sum = row_sum[r];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const float inv = 1.0f / sum;  // sum ≥ 1: the running maximum's own term is 2^0
        const int t = row0 + 8 * r;
        if (t >= T) continue;
        uint16_t* dst = p.out + int64_t(t) * p.out_stride_t + int64_t(h) * p.out_stride_h + 2 * (lane % 4);
#pragma unroll
        for (int d = 0; d < kVDim / 8; ++d)
            *reinterpret_cast<uint32_t*>(dst + d * 8) = pack_bf16_rn(o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
    }
}

// ======================================================================================
// Generic kernel
// ======================================================================================
constexpr int kGenWarps = 4;
constexpr int kGenThreads = 32 * kGenWarps;
constexpr int kGenMaxQk = 1024;  // nope + rope
constexpr int kGenMaxV = 256;
constexpr int kGenVPerLane = kGenMaxV / 32;

// grid (⌈T / kGenWarps⌉, H); warp w owns token blockIdx.x · kGenWarps + w of head blockIdx.y. Keys in
// chunks of 32: a lane scores one key, then every lane accumulates its output columns
// (lane + 32k) over the chunk's keys.
__global__ void __launch_bounds__(kGenThreads) mha_generic_kernel(const MhaPrefillParams p, float scale_log2) {
    __shared__ float s_q[kGenWarps][kGenMaxQk];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, h = blockIdx.y;
    const int t = blockIdx.x * kGenWarps + warp;
    if (t >= p.num_tokens) return;  // warp-uniform; the kernel has no block-wide barrier
    const int nope = p.nope, qk = p.nope + p.rope, V = p.v_dim;
    float* q = s_q[warp];
    const uint16_t* q_row = p.q + int64_t(t) * p.q_stride_t + int64_t(h) * p.q_stride_h;
    for (int d = lane; d < qk; d += 32) q[d] = bf16_bits_to_float(q_row[d]);
    __syncwarp();

    const int visible = p.ctx_len - p.num_tokens + t + 1;
    float acc[kGenVPerLane];
#pragma unroll
    for (int k = 0; k < kGenVPerLane; ++k) acc[k] = 0.0f;
    float m = -INFINITY, l_part = 0.0f;
    for (int j0 = 0; j0 < visible; j0 += 32) {
        const int j = j0 + lane;
        float sc = -INFINITY;
        if (j < visible) {
            const uint16_t* kn = p.k_nope + int64_t(j) * p.k_stride_t + int64_t(h) * p.k_stride_h;
            const uint16_t* kp = p.k_pe + int64_t(j) * p.k_pe_stride_t;
            float dot = 0.0f;
            for (int d = 0; d < nope; ++d) dot = fmaf(q[d], bf16_bits_to_float(kn[d]), dot);
            for (int d = nope; d < qk; ++d) dot = fmaf(q[d], bf16_bits_to_float(kp[d - nope]), dot);
            sc = dot * scale_log2;
        }
        float mx = sc;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        const float m_new = fmaxf(m, mx);  // finite: key j0 is visible
        const float corr = exp2f(m - m_new);
        m = m_new;
        const float pj = j < visible ? exp2f(sc - m) : 0.0f;
        l_part = l_part * corr + pj;
        const int n = min(32, visible - j0);
#pragma unroll
        for (int k = 0; k < kGenVPerLane; ++k) acc[k] *= corr;
        for (int jj = 0; jj < n; ++jj) {
            const float w = __shfl_sync(0xffffffffu, pj, jj);
            const uint16_t* v_row = p.v + int64_t(j0 + jj) * p.v_stride_t + int64_t(h) * p.v_stride_h;
#pragma unroll
            for (int k = 0; k < kGenVPerLane; ++k)
                if (lane + 32 * k < V) acc[k] = fmaf(w, bf16_bits_to_float(v_row[lane + 32 * k]), acc[k]);
        }
    }
    float l = l_part;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
    const float inv = 1.0f / l;  // l ≥ 1: the maximum's own term
    uint16_t* dst = p.out + int64_t(t) * p.out_stride_t + int64_t(h) * p.out_stride_h;
#pragma unroll
    for (int k = 0; k < kGenVPerLane; ++k)
        if (lane + 32 * k < V) dst[lane + 32 * k] = float_to_bf16_bits(acc[k] * inv);
}

// ======================================================================================
// Host
// ======================================================================================
void check_params(const MhaPrefillParams& p) {
    const std::string dims = " (num_tokens=" + std::to_string(p.num_tokens) + " ctx_len=" + std::to_string(p.ctx_len) +
                             " num_heads=" + std::to_string(p.num_heads) + " nope=" + std::to_string(p.nope) +
                             " rope=" + std::to_string(p.rope) + " v_dim=" + std::to_string(p.v_dim) +
                             " scale=" + std::to_string(p.scale) + ")";
    FANOUT_DEVICE_REQUIRE(p.num_tokens >= 0 && p.ctx_len >= p.num_tokens,
                          "mha prefill: needs 0 <= num_tokens <= ctx_len" + dims);
    FANOUT_DEVICE_REQUIRE(p.num_heads >= 1 && p.num_heads <= 65535,
                          "mha prefill: needs 1 <= num_heads <= 65535" + dims);
    FANOUT_DEVICE_REQUIRE(p.nope >= 1 && p.rope >= 1 && p.nope + p.rope <= kGenMaxQk,
                          "mha prefill: needs nope >= 1, rope >= 1 and nope + rope <= 1024" + dims);
    FANOUT_DEVICE_REQUIRE(p.v_dim >= 1 && p.v_dim <= kGenMaxV, "mha prefill: needs 1 <= v_dim <= 256" + dims);
    FANOUT_DEVICE_REQUIRE(std::isfinite(p.scale) && p.scale > 0.0f, "mha prefill: scale must be finite and > 0" + dims);
    FANOUT_DEVICE_REQUIRE(p.num_tokens == 0 || (p.q && p.k_nope && p.k_pe && p.v && p.out),
                          "mha prefill: a null device pointer among q, k_nope, k_pe, v, out" + dims);
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// The fast kernel's widths, 16-byte cp.async sources and 4-byte output stores.
bool fast_path_fits(const MhaPrefillParams& p) {
    const bool dims = p.nope == kNope && p.rope == kRope && p.v_dim == kVDim;
    const bool pointers =
        aligned16(p.q) && aligned16(p.k_nope) && aligned16(p.k_pe) && aligned16(p.v) && aligned16(p.out);
    const bool strides = (p.q_stride_t | p.q_stride_h | p.k_stride_t | p.k_stride_h | p.k_pe_stride_t | p.v_stride_t |
                          p.v_stride_h | p.out_stride_t | p.out_stride_h) %
                             8 ==
                         0;
    return dims && pointers && strides;
}

}  // namespace

const char* mha_prefill_kernel_name(MhaPrefillKernel k) {
    switch (k) {
        case MhaPrefillKernel::kWgmma:
            return "wgmma";
        case MhaPrefillKernel::kMmaSync:
            return "mma.sync";
        case MhaPrefillKernel::kGeneric:
            return "generic";
    }
    return "?";
}

MhaPrefillKernel mha_prefill_kernel_for(const MhaPrefillParams& p) {
    return fast_path_fits(p) ? MhaPrefillKernel::kWgmma : MhaPrefillKernel::kGeneric;
}

void launch_mha_prefill(const MhaPrefillParams& p, void* cuda_stream) {
    check_params(p);
    launch_mha_prefill(p, cuda_stream, mha_prefill_kernel_for(p));
}

void launch_mha_prefill(const MhaPrefillParams& p, void* cuda_stream, MhaPrefillKernel kernel) {
    check_params(p);
    const auto stream = static_cast<cudaStream_t>(cuda_stream);
    FANOUT_DEVICE_REQUIRE(kernel == MhaPrefillKernel::kGeneric || fast_path_fits(p),
                          std::string("mha prefill: the ") + mha_prefill_kernel_name(kernel) +
                              " kernel needs nope 128, rope 64, v_dim 128, 16-byte-aligned pointers and strides "
                              "that are multiples of 8 elements (nope=" +
                              std::to_string(p.nope) + " rope=" + std::to_string(p.rope) +
                              " v_dim=" + std::to_string(p.v_dim) + ")");
    if (p.num_tokens == 0) return;
    switch (kernel) {
        case MhaPrefillKernel::kWgmma:
            FANOUT_DEVICE_REQUIRE(
                p.num_tokens <= 65535 * 128,
                "mha prefill: at most 8,388,480 tokens per launch, got " + std::to_string(p.num_tokens));
            detail::launch_mha_prefill_wgmma(p, cuda_stream);
            return;
        case MhaPrefillKernel::kMmaSync: {
            // NOTE: set on every launch (a host-side attribute write, graph-capture safe): a once-per-process
            // flag would cover only the device that was current the first time.
            FANOUT_CUDA_CHECK(
                cudaFuncSetAttribute(mha_fast_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kFastSmemBytes));
            const unsigned blocks = unsigned((p.num_tokens + kBlockM - 1) / kBlockM);
            mha_fast_kernel<<<dim3(blocks, unsigned(p.num_heads)), kFastThreads, kFastSmemBytes, stream>>>(
                p, p.scale * kLog2e);
            FANOUT_CUDA_CHECK_LAUNCH("mha_fast_kernel");
            return;
        }
        case MhaPrefillKernel::kGeneric: {
            const unsigned blocks = unsigned((p.num_tokens + kGenWarps - 1) / kGenWarps);
            mha_generic_kernel<<<dim3(blocks, unsigned(p.num_heads)), kGenThreads, 0, stream>>>(p, p.scale * kLog2e);
            FANOUT_CUDA_CHECK_LAUNCH("mha_generic_kernel");
            return;
        }
    }
}

}  // namespace fanout::ops

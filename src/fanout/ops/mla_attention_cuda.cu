// MLA attention, absorbed form, on the GPU: see mla_attention_cuda.h for the math and the contract.
//
// * mla_fast_kernel (sm_90a, kv_lora 512 / rope 64 / block 64): a CTA owns 64 rows — (token, head)
//   pairs of one request, row = t_local · H + h — and a contiguous range of kv tiles (64 positions,
//   exactly one cache block, so a tile is 73,728 contiguous bytes). Two warpgroups:
//     S = Q·Kᵀ     wgmma m64n32k16 ×36: warpgroup g scores kv columns [32g, 32g + 32) of the tile;
//     softmax      row maxima exchanged through shared memory, P (bf16) written to shared memory;
//     O += P·V     wgmma m64n256k16 ×4: warpgroup g owns output columns [256g, 256g + 256).
//   V is the first 512 columns of the same tile (no second load): S reads it K-major, P·V reads it
//   N-major through the same 128-byte-swizzled panels. Tiles stream through two buffers by cp.async.
// * mla_generic_kernel: one CTA per (token, head), f32 throughout; any widths, any block size.
// * mla_combine_kernel: split-KV partials (o/l and log2-sum-exp per split) → bf16 output.
//
// Split-KV: the host picks the split count from host values only (CTAs vs SM count, the
// workspace); each CTA derives its kv range on the device from kv_len/positions, so a captured
// graph stays valid for any lengths. A split that sees no position of a row writes lse = −inf,
// which the combine skips.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "fanout/core/cuda_check.h"
#include "fanout/ops/gemm.h"
#include "fanout/ops/mla_attention_cuda.h"
#include "fanout/ops/sm90.cuh"

namespace fanout::ops {
namespace {

constexpr int kMaxSplits = 64;
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float bf16_to_float(uint16_t v) { return __uint_as_float(uint32_t(v) << 16); }

// Round to nearest even (finite inputs; NaN stays NaN).
__device__ __forceinline__ uint16_t float_to_bf16(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    return uint32_t(float_to_bf16(lo)) | (uint32_t(float_to_bf16(hi)) << 16);
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
constexpr int kRows = 64;                              // query rows per CTA (wgmma M)
constexpr int kTile = 64;                              // kv positions per tile = cache block size
constexpr int kChunks = kDim / 8;                      // 16-byte chunks per entry row: 72
constexpr int kPanelBytes = kRows * 128;               // one 64-column panel of 64 rows: 8 KB
constexpr int kTileBytes = kChunks / 8 * kPanelBytes;  // 9 panels: 72 KB (Q and each kv buffer)
constexpr int kFastThreads = 256;                      // two consumer warpgroups
constexpr int kFastSmemBytes = 3 * kTileBytes + kPanelBytes + (2 * 64 + 2 * 64 + 64) * 4 + 1024;
static_assert(kFastSmemBytes <= 227 * 1024, "fast MLA kernel's shared memory");

// Byte offset of 16-byte chunk c of row r in a [panel][row][128 B] tile with the 128-byte swizzle
// (chunk index XOR row % 8) that TMA and wgmma use: conflict-free for both the cp.async writes
// and the tensor cores' reads.
__device__ __forceinline__ uint32_t swizzled(int r, int c) {
    return uint32_t((c >> 3) * kPanelBytes + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// wgmma descriptor of an N-major (MN-major) operand in the same swizzled panels: 64-element
// column panels `kPanelBytes` apart (leading byte offset), 8-row groups 1024 bytes apart (stride).
__device__ __forceinline__ uint64_t desc_mn_major_sw128(const void* tile) {
    const uint64_t addr = sm90::smem_addr(tile);
    return ((addr & 0x3FFFF) >> 4) | (uint64_t{kPanelBytes >> 4} << 16) | (uint64_t{1024 >> 4} << 32) |
           (uint64_t{1} << 62);
}

// d[64, 32] (+)= a · b, bf16 operands from shared memory (a K-major; b K-major), f32 accumulators.
__device__ __forceinline__ void wgmma_s(float (&d)[16], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
        "}, "
        "%16, %17, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// d[64, 256] (+)= a · b, bf16 operands from shared memory (a K-major; b N-major), f32 accumulators.
__device__ __forceinline__ void wgmma_pv(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, "
        "%128, %129, p, 1, 1, 0, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
          "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
          "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
          "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
          "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),
          "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]),
          "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]),
          "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),
          "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),
          "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]),
          "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),
          "+f"(d[126]), "+f"(d[127])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// grid (row blocks of max_query_len·H, splits, requests); 256 threads.
__global__ void __launch_bounds__(kFastThreads, 1)
    mla_fast_kernel(const MlaAttentionParams p, int num_splits, float scale_log2, float* part_o, float* part_lse) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
    uint8_t* sq = smem;                                         // Q: [64 rows, 576] swizzled
    uint8_t* skv = smem + kTileBytes;                           // two kv tiles
    uint8_t* sp = smem + 3 * kTileBytes;                        // P: [64 rows, 64 kv] bf16 swizzled
    float* s_max = reinterpret_cast<float*>(sp + kPanelBytes);  // [2 warpgroups][64 rows]
    float* s_sum = s_max + 2 * kRows;                           // [2][64]
    int* s_limit = reinterpret_cast<int*>(s_sum + 2 * kRows);   // [64] visible positions per row

    const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32, tig = lane % 4;
    const int split = blockIdx.y, r = blockIdx.z, H = p.num_heads;
    const int q0 = p.query_start[r], num_rows = (p.query_start[r + 1] - q0) * H;
    const int first_row = blockIdx.x * kRows;  // request-local row = t_local * H + h
    if (first_row >= num_rows) return;         // this request has fewer query tokens than max_query_len
    const int total_rows = p.num_tokens * H;   // rows of the split partials

    if (tid < kRows) {
        const int row = first_row + tid;
        s_limit[tid] = row < num_rows ? min(p.positions[q0 + row / H] + 1, p.kv_len[r]) : 0;
    }
    __syncthreads();
    int kv_end = 0;  // the CTA's causal horizon: no row sees position kv_end or later
    for (int i = 0; i < kRows; ++i) kv_end = max(kv_end, s_limit[i]);
    const int num_tiles = (kv_end + kTile - 1) / kTile;
    const int per_split = (num_tiles + num_splits - 1) / num_splits;
    const int tile_begin = split * per_split, tile_end = min(num_tiles, tile_begin + per_split);

    // Rows this thread holds in the wgmma fragments (both warpgroups hold all 64 rows).
    const int r0 = (tid % 128) / 32 * 16 + lane / 4, r1 = r0 + 8;

    if (tile_begin >= tile_end) {  // only when split: nothing of this range is visible to any row
        if (tid < kRows && first_row + tid < num_rows) {
            const int row = first_row + tid, t = q0 + row / H, h = row % H;
            part_lse[size_t(split) * total_rows + size_t(t) * H + h] = -INFINITY;
        }
        return;
    }

    // Q rows (zeros past the request's rows) and the first kv tile: one cp.async group.
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
    const int32_t* blocks = p.block_table + int64_t(r) * p.max_blocks;
    // Rows past kv_end are zero-filled, never read: past kv_len a block holds whatever was there
    // (NaN included), and 0 · NaN would poison P·V.
    auto load_tile = [&](int tile, uint8_t* dst) {
        const uint16_t* base = p.cache + int64_t(blocks[tile]) * (kTile * kDim);
        const int valid_rows = kv_end - tile * kTile;
        for (int i = tid; i < kTile * kChunks; i += kFastThreads) {
            const int row = i / kChunks, c = i % kChunks;
            cp_async_16(dst + swizzled(row, c), base + i * 8, row < valid_rows ? 16 : 0);
        }
    };
    load_tile(tile_begin, skv);
    cp_async_commit();

    float o[128], s[16];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) s[i] = 0.0f;
    // Running maxima (log2 units, scaled) and this thread's partial row sums, for rows r0 and r1.
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    const int lim0 = s_limit[r0], lim1 = s_limit[r1];

    for (int tile = tile_begin; tile < tile_end; ++tile) {
        const int buf = (tile - tile_begin) & 1;
        // The other buffer was last read in the previous iteration, which ended with a barrier.
        if (tile + 1 < tile_end) load_tile(tile + 1, skv + (buf ^ 1) * kTileBytes);
        cp_async_commit();
        cp_async_wait<1>();  // this thread's copies of `tile` (and Q) have landed
        sm90::fence_proxy_async();
        __syncthreads();  // ... and everyone's
        const uint8_t* kv = skv + buf * kTileBytes;

        // S[64, 32] = Q · K[32·wg .. 32·wg + 32)ᵀ over 576 dims (36 k-steps of 16 = 32 bytes).
        sm90::fence_regs(s);  // last tile's reads of s come before wgmma.fence
        sm90::wgmma_fence();
#pragma unroll
        for (int kd = 0; kd < kDim / 16; ++kd) {
            const int panel = kd / 4, kbyte = (kd % 4) * 32;
            const uint64_t da = sm90::desc_k_major_sw128(sq + panel * kPanelBytes + kbyte);
            const uint64_t db = sm90::desc_k_major_sw128(kv + panel * kPanelBytes + wg * 32 * 128 + kbyte);
            wgmma_s(s, da, db, kd > 0);
        }
        sm90::wgmma_commit();
        sm90::wgmma_wait<0>();
        sm90::fence_regs(s);

        // Causal/tail mask and scale. Fragment: register 4j + i is column 8j + 2·tig + (i & 1),
        // row r0 for i < 2 and r1 otherwise.
        const int col0 = tile * kTile + wg * 32 + 2 * tig;
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int col = col0 + 8 * j + i;
                s[4 * j + i] = col < lim0 ? s[4 * j + i] * scale_log2 : -INFINITY;
                s[4 * j + 2 + i] = col < lim1 ? s[4 * j + 2 + i] * scale_log2 : -INFINITY;
                mx0 = fmaxf(mx0, s[4 * j + i]);
                mx1 = fmaxf(mx1, s[4 * j + 2 + i]);
            }
#pragma unroll
        for (int off = 1; off < 4; off <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
        }
        if (tig == 0) {
            s_max[wg * kRows + r0] = mx0;
            s_max[wg * kRows + r1] = mx1;
        }
        __syncthreads();
        mx0 = fmaxf(mx0, s_max[(wg ^ 1) * kRows + r0]);
        mx1 = fmaxf(mx1, s_max[(wg ^ 1) * kRows + r1]);
        const float new0 = fmaxf(m0, mx0), new1 = fmaxf(m1, mx1);
        // A row that has seen nothing yet keeps −inf; subtracting 0 then keeps exp2 at 0, not NaN.
        const float base0 = new0 == -INFINITY ? 0.0f : new0, base1 = new1 == -INFINITY ? 0.0f : new1;
        const float corr0 = exp2f(m0 - base0), corr1 = exp2f(m1 - base1);
        m0 = new0;
        m1 = new1;
        float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                s[4 * j + i] = exp2f(s[4 * j + i] - base0);
                s[4 * j + 2 + i] = exp2f(s[4 * j + 2 + i] - base1);
                sum0 += s[4 * j + i];
                sum1 += s[4 * j + 2 + i];
            }
        l0 = l0 * corr0 + sum0;
        l1 = l1 * corr1 + sum1;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
            o[4 * j] *= corr0;
            o[4 * j + 1] *= corr0;
            o[4 * j + 2] *= corr1;
            o[4 * j + 3] *= corr1;
        }
        // P → shared memory as the K-major A operand: columns 32·wg + 8j + 2·tig (+1).
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int chunk = wg * 4 + j;
            *reinterpret_cast<uint32_t*>(sp + r0 * 128 + ((chunk ^ (r0 & 7)) << 4) + tig * 4) =
                pack_bf16(s[4 * j], s[4 * j + 1]);
            *reinterpret_cast<uint32_t*>(sp + r1 * 128 + ((chunk ^ (r1 & 7)) << 4) + tig * 4) =
                pack_bf16(s[4 * j + 2], s[4 * j + 3]);
        }
        sm90::fence_proxy_async();
        __syncthreads();

        // O[64, 256·wg ..) += P[64, 64] · V[64, 256·wg ..): 4 k-steps of 16 kv rows (2 KB each).
        // fence_regs first: the rescaled accumulators must be written before wgmma.fence.
        sm90::fence_regs(o);
        sm90::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kTile / 16; ++kk) {
            const uint64_t da = sm90::desc_k_major_sw128(sp + kk * 32);
            const uint64_t db = desc_mn_major_sw128(kv + wg * 4 * kPanelBytes + kk * 16 * 128);
            wgmma_pv(o, da, db, 1);
        }
        sm90::wgmma_commit();
        sm90::wgmma_wait<0>();
        sm90::fence_regs(o);
        __syncthreads();  // both warpgroups are done with this kv buffer and with P
    }

    // Row sums: the quad's columns, then the other warpgroup's half.
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

#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = first_row + (half ? r1 : r0);
        if (row >= num_rows) continue;
        const int64_t t = q0 + row / H, h = row % H;
        const float l = half ? l1 : l0, m = half ? m1 : m0;
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        if (num_splits == 1) {
            uint16_t* dst = p.out + t * p.out_stride_t + h * p.out_stride_h + wg * 256 + 2 * tig;
#pragma unroll
            for (int j = 0; j < 32; ++j)
                *reinterpret_cast<uint32_t*>(dst + 8 * j) =
                    pack_bf16(o[4 * j + 2 * half] * inv, o[4 * j + 2 * half + 1] * inv);
        } else {
            const size_t prow = size_t(split) * total_rows + size_t(t) * H + h;
            float* dst = part_o + prow * kLora + wg * 256 + 2 * tig;
#pragma unroll
            for (int j = 0; j < 32; ++j)
                *reinterpret_cast<float2*>(dst + 8 * j) =
                    make_float2(o[4 * j + 2 * half] * inv, o[4 * j + 2 * half + 1] * inv);
            if (wg == 0 && tig == 0) part_lse[prow] = l > 0.0f ? m + log2f(l) : -INFINITY;
        }
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

// grid (T, H, splits); one CTA per (token, head, split), positions [begin, end) of the split in
// chunks of 128: a thread scores one position, then every thread accumulates its output columns.
__global__ void __launch_bounds__(kGenThreads)
    mla_generic_kernel(const MlaAttentionParams p, int num_splits, float scale_log2, float* part_o, float* part_lse) {
    __shared__ float sq[kGenMaxLora + kGenMaxRope];
    __shared__ float sp[kGenThreads];
    __shared__ int64_t s_entry[kGenThreads];
    __shared__ float scratch[kGenThreads / 32];
    const int t = blockIdx.x, h = blockIdx.y, split = blockIdx.z, tid = threadIdx.x;
    const int H = p.num_heads, C = p.kv_lora, D = p.kv_lora + p.rope_dim, bs = p.block_size;
    // The request of token t: the last r with query_start[r] <= t.
    int lo = 0, hi = p.num_requests - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (p.query_start[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    const int r = lo;
    const int visible = min(p.positions[t] + 1, p.kv_len[r]);
    const int per_split = (visible + num_splits - 1) / num_splits;
    const int begin = split * per_split, end = min(visible, begin + per_split);
    const size_t row = size_t(t) * H + h, prow = size_t(split) * p.num_tokens * H + row;
    if (begin >= end) {
        if (tid == 0) part_lse[prow] = -INFINITY;
        return;
    }
    for (int d = tid; d < D; d += kGenThreads)
        sq[d] = bf16_to_float(d < C ? p.q_lat[t * p.q_lat_stride_t + h * p.q_lat_stride_h + d]
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
            const int64_t entry = (int64_t(blocks[j / bs]) * bs + j % bs) * D;
            s_entry[tid] = entry;
            float dot = 0.0f;
            for (int d = 0; d < D; ++d) dot = fmaf(sq[d], bf16_to_float(p.cache[entry + d]), dot);
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
                for (int jj = 0; jj < n; ++jj) a = fmaf(sp[jj], bf16_to_float(p.cache[s_entry[jj] + d]), a);
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
            if (tid + k * kGenThreads < C) dst[tid + k * kGenThreads] = float_to_bf16(acc[k] * inv);
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
constexpr int kCombineWarps = 8;

// One warp per (token, head) row: out = Σ_s 2^(lse_s − max) · o_s / Σ_s 2^(lse_s − max). Splits
// with lse = −inf saw nothing of the row; their partial rows were never written and are skipped.
__global__ void __launch_bounds__(kCombineWarps * 32)
    mla_combine_kernel(const MlaAttentionParams p, int num_splits, const float* part_o, const float* part_lse) {
    __shared__ float s_w[kCombineWarps][kMaxSplits];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int total_rows = p.num_tokens * p.num_heads, C = p.kv_lora;
    const int row = blockIdx.x * kCombineWarps + warp;
    if (row >= total_rows) return;
    float mx = -INFINITY;
    for (int s = lane; s < num_splits; s += 32) mx = fmaxf(mx, part_lse[size_t(s) * total_rows + row]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float sum = 0.0f;
    for (int s = lane; s < num_splits; s += 32) {
        const float lse = part_lse[size_t(s) * total_rows + row];
        const float w = lse == -INFINITY ? 0.0f : exp2f(lse - mx);
        s_w[warp][s] = w;
        sum += w;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    __syncwarp();
    const float inv = 1.0f / sum;
    const int t = row / p.num_heads, h = row % p.num_heads;
    uint16_t* dst = p.out + int64_t(t) * p.out_stride_t + int64_t(h) * p.out_stride_h;
    for (int d = lane; d < C; d += 32) {
        float acc = 0.0f;
        for (int s = 0; s < num_splits; ++s) {
            const float w = s_w[warp][s];
            if (w != 0.0f) acc = fmaf(w, part_o[(size_t(s) * total_rows + row) * C + d], acc);
        }
        dst[d] = float_to_bf16(acc * inv);
    }
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
    FANOUT_DEVICE_REQUIRE(
        p.query_start && p.kv_len && p.positions && p.block_table && p.cache && p.q_lat && p.q_pe && p.out,
        "mla attention: a null device pointer" + dims);
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
    mla_combine_kernel<<<unsigned((rows + kCombineWarps - 1) / kCombineWarps), kCombineWarps * 32, 0, stream>>>(
        p, splits, part_o, part_lse);
    FANOUT_CUDA_CHECK_LAUNCH("mla_combine_kernel");
}

}  // namespace

MlaWorkspace::MlaWorkspace(size_t partial_bytes) : partial_floats(partial_bytes / sizeof(float)) {
    if (partial_floats > 0) FANOUT_CUDA_CHECK(cudaMalloc(&partials, partial_floats * sizeof(float)));
}

MlaWorkspace::~MlaWorkspace() { cudaFree(partials); }

MlaKernel mla_attention_kernel_for(const MlaAttentionParams& p) {
    const bool widths = p.kv_lora == kLora && p.rope_dim == kRope && p.block_size == kTile;
    // 16-byte cp.async of q rows; 4-byte bf16 pairs stored to out.
    const bool layout = aligned(p.q_lat, 16) && aligned(p.q_pe, 16) && aligned(p.cache, 16) && aligned(p.out, 4) &&
                        p.q_lat_stride_t % 8 == 0 && p.q_lat_stride_h % 8 == 0 && p.q_pe_stride_t % 8 == 0 &&
                        p.q_pe_stride_h % 8 == 0 && p.out_stride_t % 2 == 0 && p.out_stride_h % 2 == 0;
    return widths && layout && p.num_requests <= 65535 ? MlaKernel::kTensorCore : MlaKernel::kGeneric;
}

void launch_mla_attention_generic(const MlaAttentionParams& p, MlaWorkspace* workspace, void* cuda_stream,
                                  int force_splits) {
    check_params(p);
    if (p.num_tokens == 0) return;
    const auto stream = static_cast<cudaStream_t>(cuda_stream);
    const int splits = pick_splits(int64_t(p.num_tokens) * p.num_heads, p, workspace, force_splits);
    float* part_o = splits > 1 ? workspace->partials : nullptr;
    float* part_lse = splits > 1 ? part_o + size_t(splits) * p.num_tokens * p.num_heads * p.kv_lora : nullptr;
    mla_generic_kernel<<<dim3(unsigned(p.num_tokens), unsigned(p.num_heads), unsigned(splits)), kGenThreads, 0,
                         stream>>>(p, splits, p.scale * kLog2e, part_o, part_lse);
    FANOUT_CUDA_CHECK_LAUNCH("mla_generic_kernel");
    if (splits > 1) launch_combine(p, splits, part_o, part_lse, stream);
}

void launch_mla_attention(const MlaAttentionParams& p, MlaWorkspace* workspace, void* cuda_stream, int force_splits) {
    check_params(p);
    if (p.num_tokens == 0) return;
    if (mla_attention_kernel_for(p) == MlaKernel::kGeneric) {
        launch_mla_attention_generic(p, workspace, cuda_stream, force_splits);
        return;
    }
    static const bool smem_set = [] {
        FANOUT_CUDA_CHECK(
            cudaFuncSetAttribute(mla_fast_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kFastSmemBytes));
        return true;
    }();
    (void)smem_set;
    const auto stream = static_cast<cudaStream_t>(cuda_stream);
    const int64_t row_blocks = (int64_t(p.max_query_len) * p.num_heads + kRows - 1) / kRows;
    FANOUT_DEVICE_REQUIRE(row_blocks <= 0x7fffffff, "mla attention: max_query_len × heads too large");
    const int splits = pick_splits(row_blocks * p.num_requests, p, workspace, force_splits);
    float* part_o = splits > 1 ? workspace->partials : nullptr;
    float* part_lse = splits > 1 ? part_o + size_t(splits) * p.num_tokens * p.num_heads * kLora : nullptr;
    mla_fast_kernel<<<dim3(unsigned(row_blocks), unsigned(splits), unsigned(p.num_requests)), kFastThreads,
                      kFastSmemBytes, stream>>>(p, splits, p.scale * kLog2e, part_o, part_lse);
    FANOUT_CUDA_CHECK_LAUNCH("mla_fast_kernel");
    if (splits > 1) launch_combine(p, splits, part_o, part_lse, stream);
}

}  // namespace fanout::ops

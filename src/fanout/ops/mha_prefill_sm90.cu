// MLA prefill attention in MHA form on Hopper's wgmma (mha_prefill_cuda.h has the math and the
// contract; this is the kernel launch_mha_prefill picks at DeepSeek-V3's widths — nope 128, rope 64,
// v 128 — on sm_90). FlashAttention-3's structure, written for these widths:
//
// * A work item is 128 query rows of one request and one head. The kernel is persistent — one CTA
//   per SM of three warpgroups, taking items from a counter until none is left (item_at, the
//   kernel). Warpgroup 0 is the producer: one thread has TMA load an item's Q (three 64-dim panels
//   of 128 rows: nope 0–63, nope 64–127, rope) and then each key tile of 128 positions — K as the
//   same three panels (k_pe, shared by the heads, is the third), V as two 64-dim panels — into a
//   two-stage ring (80 KB a stage, 128-byte swizzle), one mbarrier `full` per stage; the consumers
//   hand a stage back on `empty` and Q on `q_empty`, so the next item's Q and first tiles load
//   under the current item's last P·V and output.
// * Warpgroups 1 and 2 are consumers, 64 query rows each: S = Q·Kᵀ by wgmma m64n128k16 with both
//   operands in shared memory (12 k-steps over the 192 dims), online softmax in f32 registers
//   (base 2, the scale folded in), P packed to bf16 in registers in the accumulator's own fragment
//   layout, O += P·V by wgmma m64n128k16 with P from registers and V read N-major from the same
//   swizzled panels TMA wrote (no transpose pass).
// * Within a consumer, tile n + 1's S is issued before tile n's P·V, so its softmax runs while the
//   tensor cores do P·V; across the two consumers a ping-pong of named barriers makes each issue
//   its wgmma only after the other has issued its own, so one's softmax runs under the other's
//   matrix work (+7% at 4,096 tokens over letting them interleave freely).
// * Causal: an item reads the key tiles up to its last row's position; tiles that reach past its
//   warpgroup's first row get the per-element mask (keys past ctx_len are masked too: TMA fills
//   them with zeros). Key 0 is visible to every query, so each row's running maximum is finite
//   after the first tile.
// * Several requests per launch: an item's request comes from its index; the request's offsets
//   (query_start / kv_start) place its rows in Q and out and its keys in K/V; keys past the
//   request's own are masked like keys past ctx_len.
// * Item order: groups of up to 8 heads; within a group the row blocks with the most key tiles
//   come first (then requests, heads fastest), so the items in flight share a few heads' K/V in L2
//   and the longest work starts first.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "fanout/core/cuda_check.h"
#include "fanout/ops/device_context.h"
#include "fanout/ops/mha_prefill_cuda.h"
#include "fanout/ops/sm90.cuh"
#include "fanout/ops/tensor_map.h"

namespace fanout::ops {
namespace {

using namespace sm90;

constexpr int kBM = 128;                 // query rows per CTA: two consumer warpgroups of 64
constexpr int kBN = 128;                 // key positions per tile
constexpr int kStages = 2;               // key tiles in flight
constexpr int kPanel = 128 * 128;        // one 64-dim panel of 128 rows, 128-byte rows: 16 KB
constexpr int kQBytes = 3 * kPanel;      // Q: nope 0–63, nope 64–127, rope
constexpr int kStageBytes = 5 * kPanel;  // K (three panels), then V (two)
constexpr int kSmemBytes = kQBytes + kStages * kStageBytes + 1024;  // + alignment slack
constexpr int kThreads = 384;
static_assert(kSmemBytes <= 227 * 1024, "the MHA prefill kernel's shared memory");
constexpr int kProducerRegs = 40, kConsumerRegs = 232;  // 128·40 + 256·232 ≤ 64K registers per SM
constexpr float kLog2e = 1.4426950408889634f;

// Tensor-map coordinates of (head h, row r) for a [rows][heads] or [heads][rows] map (the map's
// dims follow the strides: the smaller stride is the inner one).
struct RowsHeads {
    bool heads_inner;
    __device__ int c1(int h, int r) const { return heads_inner ? h : r; }
    __device__ int c2(int h, int r) const { return heads_inner ? r : h; }
};

struct Maps {
    RowsHeads q, k, v;
};

// The mask of one key tile when `mask` (key col visible to the thread's rows while col < lim0 /
// lim1: −∞ otherwise) and the two rows' maxima of the raw scores, quad-reduced. Fragment:
// register 4j + i is column 8j + 2·tig + (i & 1), row r0 for i < 2 and r0 + 8 otherwise.
__device__ __forceinline__ void mask_max(float (&s)[64], bool mask, int col0, int lim0, int lim1, float& mx0,
                                         float& mx1) {
    mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int col = col0 + 8 * j + i;
            if (mask) {
                s[4 * j + i] = col < lim0 ? s[4 * j + i] : -INFINITY;
                s[4 * j + 2 + i] = col < lim1 ? s[4 * j + 2 + i] : -INFINITY;
            }
            mx0 = fmaxf(mx0, s[4 * j + i]), mx1 = fmaxf(mx1, s[4 * j + 2 + i]);
        }
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
    }
}

// The online softmax of one tile in log2 units (scale_log2 = softmax scale · log2 e, > 0, so the
// raw maxima scale to the scaled ones): new running maxima m0/m1, s ← 2^(s·scale_log2 − m) (one
// FFMA and one ex2 each), l ← l·corr + Σ s; returns the factors the running output must be
// multiplied by (0 on the first tile: m was −∞).
__device__ __forceinline__ void softmax_tile(float (&s)[64], float mx0, float mx1, float scale_log2, float& m0,
                                             float& m1, float& l0, float& l1, float& corr0, float& corr1) {
    const float n0 = fmaxf(m0, mx0 * scale_log2), n1 = fmaxf(m1, mx1 * scale_log2);  // finite: key 0 is in tile 0
    corr0 = exp2f(m0 - n0), corr1 = exp2f(m1 - n1);
    m0 = n0, m1 = n1;
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            s[4 * j + i] = exp2f(fmaf(s[4 * j + i], scale_log2, -n0));
            s[4 * j + 2 + i] = exp2f(fmaf(s[4 * j + 2 + i], scale_log2, -n1));
            sum0 += s[4 * j + i];
            sum1 += s[4 * j + 2 + i];
        }
    l0 = l0 * corr0 + sum0;
    l1 = l1 * corr1 + sum1;
}

__device__ __forceinline__ void pack_p(const float (&s)[64], uint32_t (&pk)[32]) {
#pragma unroll
    for (int i = 0; i < 32; ++i) pk[i] = pack_bf16_rn(s[2 * i], s[2 * i + 1]);
}

// S = Q·Kᵀ for the consumer's 64 rows (qa: its rows of the Q panels) over one stage, committed.
__device__ __forceinline__ void issue_s(float (&s)[64], const uint8_t* qa, const uint8_t* stage) {
    wgmma_fence();
#pragma unroll
    for (int pn = 0; pn < 3; ++pn)
#pragma unroll
        for (int kb = 0; kb < 4; ++kb)
            wgmma_bf16_n128(s, desc_k_major_sw128(qa + pn * kPanel + kb * 32),
                            desc_k_major_sw128(stage + pn * kPanel + kb * 32), pn > 0 || kb > 0 ? 1 : 0);
    wgmma_commit();
}

// O += P·V over one stage's V panels (N-major: 64-dim panels kPanel apart), committed.
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&pk)[32], const uint8_t* stage) {
    wgmma_fence();
    const uint8_t* v = stage + 3 * kPanel;
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk)
        wgmma_bf16_n128_rs(o, pk[4 * kk], pk[4 * kk + 1], pk[4 * kk + 2], pk[4 * kk + 3],
                           desc_mn_major_sw128(v + kk * 16 * 128, kPanel));
    wgmma_commit();
}

// Named barriers of the consumers' ping-pong (0 is __syncthreads): consumer c may issue its
// wgmma once the other has issued its own (kBarTurn + c: c syncs, the other arrives).
constexpr int kBarTurn = 1;

// One work item: 128 query rows (from m0) of one request and one head.
struct Item {
    int h, m0;
    int q0, T;    // the request's queries: rows q0 .. q0 + T − 1 of q and out
    int k0, ctx;  // its keys: rows k0 .. k0 + ctx − 1 of K/V; query i sits at position ctx − T + i
    int n_tiles;  // key tiles the item reads: keys 0 .. ctx − T + its last row
    bool valid;   // false: past the request's rows (or a malformed request with fewer keys than queries)
};

// Item u of the launch. The order: groups of heads_per_group heads (their K/V stay in L2 together),
// within a group the row blocks with the most key tiles first, then requests, heads fastest. CTAs
// take the next item from a counter as they free up, so the items in flight are a window of
// consecutive ones and the longest start first.
__device__ __forceinline__ Item item_at(const MhaPrefillParams& p, int u, int heads_per_group, int blocks_per_req) {
    const int R = p.num_requests, group_items = heads_per_group * R * blocks_per_req;
    const int g = u / group_items, r = u - g * group_items;
    const int heads_here = min(heads_per_group, p.num_heads - g * heads_per_group);
    const int unit = r / heads_here, req = unit % R;
    Item it;
    it.h = g * heads_per_group + r % heads_here;
    it.m0 = (blocks_per_req - 1 - unit / R) * kBM;
    it.q0 = 0, it.T = p.num_tokens, it.k0 = 0, it.ctx = p.ctx_len;
    if (p.query_start != nullptr) {
        it.q0 = p.query_start[req], it.T = p.query_start[req + 1] - it.q0;
        it.k0 = p.kv_start[req], it.ctx = p.kv_start[req + 1] - it.k0;
    }
    const int offset = it.ctx - it.T, last_row = min(it.m0 + kBM, it.T) - 1;
    it.n_tiles = (offset + last_row) / kBN + 1;
    // Malformed offsets (a request past the tensors, fewer keys than queries) make the item invalid:
    // skipped, nothing read or written for it.
    it.valid = it.m0 < it.T && offset >= 0 && it.q0 >= 0 && it.k0 >= 0 && it.q0 + it.T <= p.num_tokens &&
               it.k0 + it.ctx <= p.ctx_len;
    return it;
}

// Persistent: one CTA per SM. Its producer takes items from counters[0] (skipping the ones past
// their request's rows) and hands each to the consumers through shared memory with its Q, so the
// next item's Q and first key tiles load while the consumers finish the current one (its last
// P·V and the output). An index past the end tells the consumers to stop. The last CTA to run out
// resets the counters (counters[1] counts the CTAs that ran out) for the next launch.
__global__ void __launch_bounds__(kThreads, 1)
    mha_prefill_wgmma_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                             const __grid_constant__ CUtensorMap tm_kpe, const __grid_constant__ CUtensorMap tm_v,
                             const Maps maps, const MhaPrefillParams p, float scale_log2, int heads_per_group,
                             int blocks_per_req, int num_items, int* counters) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
    uint8_t* sq = smem;
    uint8_t* ring = smem + kQBytes;
    __shared__ uint64_t q_full, q_empty, full[kStages], empty[kStages];
    __shared__ int item_slot[2];  // the item handed over with the Q load of parity 0 / 1

    if (threadIdx.x == 0) {
        mbar_init(&q_full, 1);
        mbar_init(&q_empty, 256);  // every consumer thread, once its item's scores are all computed
        for (int s = 0; s < kStages; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 256);  // every consumer thread
        }
        mbar_fence_init();
        tma_prefetch_descriptor(&tm_q);
        tma_prefetch_descriptor(&tm_k);
        tma_prefetch_descriptor(&tm_kpe);
        tma_prefetch_descriptor(&tm_v);
    }
    __syncthreads();

    const int wg = static_cast<int>(threadIdx.x) / 128;
    if (wg == 0) {
        setmaxnreg_dec<kProducerRegs>();
        if (threadIdx.x == 0) {
            int s = 0;
            uint32_t phase = 0, q_phase = 0;
            for (;;) {
                int u = atomicAdd(&counters[0], 1);
                while (u < num_items && !item_at(p, u, heads_per_group, blocks_per_req).valid)
                    u = atomicAdd(&counters[0], 1);
                mbar_wait(&q_empty, q_phase ^ 1);  // the previous item's scores are done with Q
                item_slot[q_phase] = u;
                if (u >= num_items) {
                    mbar_arrive(&q_full);  // no load: the consumers read the end
                    __threadfence();       // this CTA's last take happens before its count
                    if (atomicAdd(&counters[1], 1) == static_cast<int>(gridDim.x) - 1) {
                        counters[0] = 0;  // every CTA has run out: no take is left in this launch
                        counters[1] = 0;
                    }
                    break;
                }
                const Item it = item_at(p, u, heads_per_group, blocks_per_req);
                const int h = it.h, row = it.q0 + it.m0;
                mbar_arrive_expect_tx(&q_full, kQBytes);
                for (int pn = 0; pn < 3; ++pn)
                    tma_load_3d(sq + pn * kPanel, &tm_q, &q_full, 64 * pn, maps.q.c1(h, row), maps.q.c2(h, row));
                q_phase ^= 1;
                for (int n = 0; n < it.n_tiles; ++n) {
                    const int key = it.k0 + n * kBN;
                    mbar_wait(&empty[s], phase ^ 1);
                    mbar_arrive_expect_tx(&full[s], kStageBytes);
                    uint8_t* st = ring + s * kStageBytes;
                    tma_load_3d(st, &tm_k, &full[s], 0, maps.k.c1(h, key), maps.k.c2(h, key));
                    tma_load_3d(st + kPanel, &tm_k, &full[s], 64, maps.k.c1(h, key), maps.k.c2(h, key));
                    tma_load_2d(st + 2 * kPanel, &tm_kpe, &full[s], 0, key);  // keys past the request: masked
                    tma_load_3d(st + 3 * kPanel, &tm_v, &full[s], 0, maps.v.c1(h, key), maps.v.c2(h, key));
                    tma_load_3d(st + 4 * kPanel, &tm_v, &full[s], 64, maps.v.c1(h, key), maps.v.c2(h, key));
                    if (++s == kStages) s = 0, phase ^= 1;
                }
            }
        }
        return;
    }

    setmaxnreg_inc<kConsumerRegs>();
    const int c = wg - 1;
    const int tid = static_cast<int>(threadIdx.x) % 128, warp = tid / 32, lane = tid % 32, tig = lane % 4;
    const uint8_t* qa = sq + c * 64 * 128;

    // Ping-pong: each batch of wgmma waits for the other consumer's previous batch to be issued,
    // so one consumer's softmax runs while the other's wgmma hold the tensor cores. The turns run
    // on across items (both consumers issue the same batches).
    const auto my_turn = [&] { named_barrier(kBarTurn + c, 256); };
    const auto your_turn = [&] { named_barrier_arrive(kBarTurn + (1 - c), 256); };
    // Consumer 1 lets consumer 0 go first; at the end consumer 0 takes consumer 1's last hand-over.
    if (c == 1) named_barrier_arrive(kBarTurn, 256);

    int s = 0;
    uint32_t phase = 0, q_phase = 0;
    for (;;) {
        mbar_wait(&q_full, q_phase);  // the item and its Q
        const int u = item_slot[q_phase];
        if (u >= num_items) break;
        const Item it = item_at(p, u, heads_per_group, blocks_per_req);
        const int offset = it.ctx - it.T;
        const int row0 = it.m0 + 64 * c + 16 * warp + lane / 4, row1 = row0 + 8;  // this thread's query rows
        const int lim0 = min(offset + row0 + 1, it.ctx), lim1 = min(offset + row1 + 1, it.ctx);
        const int first_lim = min(offset + it.m0 + 64 * c + 1, it.ctx);  // the warpgroup's smallest limit

        float o[64];
#pragma unroll
        for (int i = 0; i < 64; ++i) o[i] = 0.0f;
        float m_0 = -INFINITY, m_1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
        float sc[64];
        uint32_t pk[32];
        float mx0, mx1, corr0, corr1;

        // Tile 0's scores and P.
        mbar_wait(&full[s], phase);
        my_turn();
        issue_s(sc, qa, ring + s * kStageBytes);
        your_turn();
        wgmma_wait<0>();
        fence_regs(sc);
        mask_max(sc, kBN > first_lim, 2 * tig, lim0, lim1, mx0, mx1);
        softmax_tile(sc, mx0, mx1, scale_log2, m_0, m_1, l0, l1, corr0, corr1);
        pack_p(sc, pk);

        // Tile n's P·V with tile n + 1's scores in flight ahead of it.
        for (int n = 0; n + 1 < it.n_tiles; ++n) {
            const int s_next = s + 1 == kStages ? 0 : s + 1;
            const uint32_t phase_next = s + 1 == kStages ? phase ^ 1 : phase;
            mbar_wait(&full[s_next], phase_next);
            my_turn();
            issue_s(sc, qa, ring + s_next * kStageBytes);
            issue_pv(o, pk, ring + s * kStageBytes);
            your_turn();
            wgmma_wait<1>();  // the scores are in
            fence_regs(sc);
            const int col0 = (n + 1) * kBN;
            mask_max(sc, col0 + kBN > first_lim, col0 + 2 * tig, lim0, lim1, mx0, mx1);
            softmax_tile(sc, mx0, mx1, scale_log2, m_0, m_1, l0, l1, corr0, corr1);
            wgmma_wait<0>();  // P·V of tile n is in; its stage is free
            fence_regs(o);
            mbar_arrive(&empty[s]);
            scale_rows(o, corr0, corr1);
            pack_p(sc, pk);
            s = s_next, phase = phase_next;
        }
        mbar_arrive(&q_empty);  // every score of the item is computed: the next item's Q may come
        q_phase ^= 1;
        my_turn();
        issue_pv(o, pk, ring + s * kStageBytes);
        your_turn();
        wgmma_wait<0>();
        fence_regs(o);
        mbar_arrive(&empty[s]);
        if (++s == kStages) s = 0, phase ^= 1;

            // Output: 1 / l per row (l ≥ 1: the maximum's own term), bf16 pairs straight from the fragment.
#pragma unroll
        for (int off = 1; off < 4; off <<= 1) {
            l0 += __shfl_xor_sync(0xffffffffu, l0, off);
            l1 += __shfl_xor_sync(0xffffffffu, l1, off);
        }
        const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
        uint16_t* out0 = p.out + int64_t(it.q0 + row0) * p.out_stride_t + int64_t(it.h) * p.out_stride_h + 2 * tig;
        uint16_t* out1 = p.out + int64_t(it.q0 + row1) * p.out_stride_t + int64_t(it.h) * p.out_stride_h + 2 * tig;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            if (row0 < it.T)
                *reinterpret_cast<uint32_t*>(out0 + 8 * j) = pack_bf16_rn(o[4 * j] * inv0, o[4 * j + 1] * inv0);
            if (row1 < it.T)
                *reinterpret_cast<uint32_t*>(out1 + 8 * j) = pack_bf16_rn(o[4 * j + 2] * inv1, o[4 * j + 3] * inv1);
        }
    }
    if (c == 0) named_barrier(kBarTurn, 256);  // consumer 1's last hand-over
}

// A [rows][heads][width] or [heads][rows][width] bf16 tensor (element strides) in boxes of
// 64 values × one head × box_rows rows.
CUtensorMap rows_heads_map(const uint16_t* base, int width, int heads, int rows, int64_t stride_row,
                           int64_t stride_head, uint32_t box_rows, bool& heads_inner, const char* what) {
    heads_inner = stride_head <= stride_row;
    TensorMapSpec s;
    s.base = base;
    s.rank = 3;
    s.dims[0] = uint64_t(width);
    s.dims[1] = uint64_t(heads_inner ? heads : rows);
    s.dims[2] = uint64_t(heads_inner ? rows : heads);
    s.strides[0] = uint64_t(heads_inner ? stride_head : stride_row) * 2;
    s.strides[1] = uint64_t(heads_inner ? stride_row : stride_head) * 2;
    s.box[0] = 64;
    s.box[1] = heads_inner ? 1 : box_rows;
    s.box[2] = heads_inner ? box_rows : 1;
    return make_tensor_map(s, what);
}

}  // namespace

namespace detail {

void launch_mha_prefill_wgmma(DeviceContext& ctx, const MhaPrefillParams& p) {
    Maps maps{};
    const CUtensorMap tq = rows_heads_map(p.q, p.nope + p.rope, p.num_heads, p.num_tokens, p.q_stride_t, p.q_stride_h,
                                          kBM, maps.q.heads_inner, "mha prefill q");
    const CUtensorMap tk = rows_heads_map(p.k_nope, p.nope, p.num_heads, p.ctx_len, p.k_stride_t, p.k_stride_h, kBN,
                                          maps.k.heads_inner, "mha prefill k_nope");
    const CUtensorMap tv = rows_heads_map(p.v, p.v_dim, p.num_heads, p.ctx_len, p.v_stride_t, p.v_stride_h, kBN,
                                          maps.v.heads_inner, "mha prefill v");
    TensorMapSpec kpe;
    kpe.base = p.k_pe;
    kpe.rank = 2;
    kpe.dims[0] = uint64_t(p.rope);
    kpe.dims[1] = uint64_t(p.ctx_len);
    kpe.strides[0] = uint64_t(p.k_pe_stride_t) * 2;
    kpe.box[0] = 64;
    kpe.box[1] = kBN;
    const CUtensorMap tkpe = make_tensor_map(kpe, "mha prefill k_pe");
    // Heads per group: the largest divisor of H up to 8. Measured on an H200 (docs/PERF.md, the
    // sweep over 2 … 128): 8 is within 4% of the best group at every shape (128 heads × 1,024 …
    // 16,384 keys, 16 and 32 heads, four requests) while all 128 heads at once lose 15–18% at 4,096
    // keys (each head's K/V read from DRAM by one CTA at a time), and groups that do not divide H
    // lose up to 15%.
    int group = 1;
    for (int g = 1; g <= std::min(8, p.num_heads); ++g)
        if (p.num_heads % g == 0) group = g;
    const auto kernel = mha_prefill_wgmma_kernel;
    // NOTE: set on every launch (a host-side attribute write, graph-capture safe): a once-per-process
    // flag would cover only the device that was current the first time.
    FANOUT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    const int rows = p.query_start ? p.max_query_len : p.num_tokens, blocks_per_req = (rows + kBM - 1) / kBM;
    const int64_t items = int64_t(p.num_heads) * p.num_requests * blocks_per_req;
    const unsigned ctas = unsigned(std::min<int64_t>(items, ctx.sm_count()));  // one per SM (shared memory: one fits)
    kernel<<<ctas, kThreads, kSmemBytes, ctx.stream()>>>(tq, tk, tkpe, tv, maps, p, p.scale * kLog2e, group,
                                                         blocks_per_req, int(items), ctx.work_counters());
    FANOUT_CUDA_CHECK_LAUNCH("mha_prefill_wgmma_kernel");
}

}  // namespace detail
}  // namespace fanout::ops

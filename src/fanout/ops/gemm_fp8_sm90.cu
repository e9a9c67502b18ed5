// The FP8 block-scaled GEMM on Hopper tensor cores, dense and grouped (gemm.h, grouped_gemm_cuda.h).
//
// One persistent kernel for the three layouts. Each CTA (or cluster pair) walks output tiles
// first, first + stride, ... (the masked layout's unpaired split kernels: whichever it takes next,
// kDynamic); its warpgroups have fixed roles:
//  * warpgroup 0 — the producer thread: per 128-wide K block of a tile it waits for a free stage
//    of the shared-memory ring and has TMA load the x tile [block_m × 128] and the W tile
//    [block_n × 128] into it (128-byte swizzle), completing on the stage's `full` mbarrier; and
//    the scale loader warp, which puts the stage's sx column and sw values beside it and arrives
//    on `full` too.
//  * warpgroups 1..block_m/64 — consumers, 64 rows each. Per K block: wait for `full`, four
//    m64·n·k32 FP8 wgmmas into a fresh f32 partial, wait for them, free the stage, promote:
//    acc += partial · sx[row, kb] · sw[n/128, kb]. A 256-wide tile does this per 128-column half
//    (one weight-scale block each), so registers hold acc[128] + part[64]. The 64 × 64 tiles keep
//    two partials instead: K block kb + 1's wgmmas run while kb's partial is promoted.
// The ring runs across tiles, so the producer loads the next tile while consumers finish one.
//
// Split-K: tile t's K blocks are cut into `splits` ranges (a CTA takes at most one of a dense
// tile's, and the masked one-round plan one per CTA); each split
// but the last stores its f32 partial tile to the workspace in fragment order and counts itself on
// the tile's counter; the last split waits for the count, adds the others' partials in split order
// and its own, resets the counter and writes bf16 — one kernel, deterministic, no memset. Against
// the earlier protocol (every split stored and counted, the last to arrive reloaded all of them)
// the M = 64 split GEMMs run 0.6-2.7 µs faster (o_proj 34.1 against 36.8 µs; PERF.md, nineteenth
// session). Dense launches split every tile. The masked layout splits only the tiles of a last,
// partial wave (its tile count is known on the device only): with R tiles left over after the full
// waves of the persistent grid's G CTAs and R <= G/2, each of them is split s = min(splits, G/R,
// K blocks / kMinTailSplitKb) ways (gemm.h) into ranges of ceil(K blocks / s), the last one the
// rest, so the CTAs that would idle through the last wave share its K loops instead. In cluster
// pairs G counts pairs and R pair units; both CTAs of a split unit take the same K range of their
// own row block (a partial slot each). Unpaired, a last wave of G/2 < R <= 2G/3 tiles splits 3 ways
// (3R units over two rounds of the grid), and the units are handed out as CTAs ask for them
// (kDynamic), so the CTAs whose whole tiles finished first take the split ones.
//
// Dense stream-K (GemmConfig::stream_k): the whole waves run whole tiles; the K blocks of the tiles
// left over, tile after tile, are cut into equal shares of at least kMinStreamKShare blocks, at
// most one per CTA (pair) of the grid, so a partial last wave costs its share of a tile instead of
// a whole one. A share meets one tile or
// two; each tile's shares reduce as split K's do (the share holding its last K block adds the
// others'), and a CTA runs its part of the later tile first (gemm_stream_k.h).
//
// Cluster pairs: two CTAs on tiles stacked along M fetch half of their shared W tile each and
// multicast it to both. In the contiguous layout a pair may straddle two experts' blocks; then
// each CTA fetches its own W tile.
//
// Grouped: the W tile comes from expert e's slice of [E·N, K]; contiguous tiles take e from the
// 128-row block's entry, masked tiles come from a tile list built in shared memory from the
// device counts (prefix over experts of ceil(count/block_m)·n_blocks), so empty experts cost a
// lookup and the grid is the same for every routing.
// Only fmt-free headers here.
#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cuda/atomic>
#include <iterator>
#include <string>
#include <type_traits>

#include "fanout/core/cuda_check.h"
#include "fanout/core/per_device.h"
#include "fanout/core/search.cuh"
#include "fanout/ops/fp8_constants.h"
#include "fanout/ops/gemm.h"
#include "fanout/ops/gemm_stream_k.h"
#include "fanout/ops/grouped_gemm_cuda.h"
#include "fanout/ops/sm90.cuh"
#include "fanout/ops/tensor_map.h"

namespace fanout::ops {
namespace {

using namespace sm90;

constexpr int kBK = 128;           // K per stage = one scale block = one 128-byte swizzle row
constexpr int kMaxExperts = 1024;  // masked layout: experts per launch
constexpr int kUnitRing = 4;       // kDynamic: units the producer may hand out ahead of its readers
// Register budget per thread after setmaxnreg over 128 producer-side and 128·consumers threads:
// at most what the CTA was launched with (launch_regs), since setmaxnreg.inc takes registers only
// from those the CTA's own setmaxnreg.dec released (a split past it blocks the consumers forever;
// PERF.md, MLA decode's converter warpgroup).
constexpr int kProducerRegs = 56;
// Small tiles (one consumer warpgroup, at most 128 wide: the decode shapes) run two CTAs per SM,
// so one streams while the other starts or finishes a tile, and a PDL-launched next GEMM finds
// room; each then gets half of the registers and of the shared-memory budget.
__host__ __device__ constexpr int ctas_per_sm(int bm, int bn) { return bm == 64 && bn <= 128 ? 2 : 1; }
// Three consumer warpgroups (192-row tiles): 128·56 + 384·152 = 65,536.
__host__ __device__ constexpr int consumer_regs(int consumers, int ctas) {
    return ctas == 2 ? 200 : consumers == 1 ? 232 : consumers == 2 ? 224 : 152;
}
// The registers a CTA of `threads` threads is launched with, `ctas` of them per SM: each thread's
// share of the 64K, in steps of 8, at most 248.
__host__ __device__ constexpr int launch_regs(int threads, int ctas) {
    const int per_thread = 65536 / (threads * ctas) / 8 * 8;
    return threads * (per_thread < 248 ? per_thread : 248);
}

// The 16 × 64 bf16 boxes each consumer warp stages its TMA stores in (the epilogue, below): a whole
// tile's on the 128 × 256 tiles, so that no warp waits within a tile for its previous store to
// have read its box, at the cost of the fourth stage (64 KB against 16); one elsewhere. Measured
// in the thirty-sixth session (run158, H100, against one box): q_b at M = 4,096 1.5% faster, kv_b
// and the shared down projection 1%, the contiguous grouped GEMMs 0–1.4%; the masked layout's split
// kernels (TAIL) lost 1–2% without their fourth stage, and qkv_a lost on the 192-row and 192-wide
// tiles (15% at M = 1,024 on 192 × 128 with its same four stages, 1.3% at 4,096 on 128 × 192).
__host__ __device__ constexpr int epilogue_boxes(int bm, int bn, bool tail) {
    return bm == 128 && bn == 256 && !tail ? bn / 64 : 1;
}

// The dynamic shared memory of a CTA with `s` stages (`tail`: the masked split kernels), in order
// after up to 1 KB of alignment slack: the stages' x and W tiles (K-major, 1024-byte aligned), the
// consumer warps' epilogue boxes (`boxes` each), each stage's scales (sx of the tile's rows, sw of
// its one or two 128-column blocks, padded to 16 bytes), then the ring's full and empty barriers.
// One definition for the kernel's addresses, the launch's size and the stage count.
struct SmemLayout {
    int boxes, stage_bytes, scales_off, full_off, empty_off, bytes;
    __host__ __device__ constexpr SmemLayout(int bm, int bn, int s, bool tail)
        : boxes(epilogue_boxes(bm, bn, tail)),
          stage_bytes((bm + bn) * 128),
          scales_off(s * stage_bytes + (bm / 64) * 4 * boxes * 16 * 64 * 2),
          full_off(scales_off + s * (bm + 4) * 4),
          empty_off(full_off + 8 * s),
          bytes(1024 + empty_off + 8 * s) {}
};

enum class Layout { kDense, kContiguous, kMasked };

struct Params {
    const float* sx;
    const float* sw;
    __nv_bfloat16* y;
    const __nv_bfloat16* residual;  // dense only; may alias y
    int rows;                       // dense: M; contiguous: rows; masked: max_m
    int N, K, nkb, n_blocks;
    int splits;        // dense: every tile's K splits; masked: at most this many for a last wave's tiles
    int kb_per_split;  // dense: K blocks per split
    float* partials;
    int* counters;
    unsigned* ticket;             // split K but kDynamic: hands out the units (GemmWorkspace::ticket)
    unsigned* grab;               // masked, unpaired split K: hands out units as CTAs ask (GemmWorkspace::grab)
    const int32_t* block_expert;  // contiguous
    const int32_t* counts;        // masked
    int num_experts;
    bool tma_store;   // the epilogue writes y through TMA (else plain stores)
    int x_tail_rows;  // rows of x a load through tmap_x_tail brings (launch_config)
    int tail_slots;   // masked split K: BM × BN partial tiles the workspace holds (launch_config)
};

// A dense stream-K launch's parameters (GemmConfig::stream_k; launch_config makes the plan): its
// TAIL kernels' alone, so that the other kernels' parameters stay as they were.
struct StreamKParams : Params {
    StreamKPlan sk;
};
template <Layout L, bool TAIL>
using ParamsOf = std::conditional_t<L == Layout::kDense && TAIL, StreamKParams, Params>;

struct Tile {
    int a_row;     // first row of the tile in x, sx and y
    int rows;      // valid rows from a_row (<= 0: nothing to do)
    int b_row;     // first row of the tile in the stacked W
    int n0;        // first output column
    int sw_base;   // index of sw[.., n0 / 128, 0]
    int kb0, kb1;  // K blocks of this tile (split)
    int id;        // split K: the tile's slot in the workspace (partials and counter)
    int split = 0, splits = 1;
    bool shared_w = true;  // with clusters: every CTA of it loads this W tile (else each its own)
    bool skip = false;     // no CTA of the cluster has rows here: all of them pass it by
};

// Tile t of the launch. With clusters of CL CTAs t names CL tiles stacked along M that share
// their W tile, and `rank` picks one; the last may lie past M or the expert's count (rows <= 0:
// it runs the pipeline for its peer and writes nothing).
//
// Dense and contiguous tiles go in groups of kGroupM row units (units of CL row blocks): within a
// group the row unit varies fastest, then the column block, so the tiles running at once cover a
// near-square patch of y and read its x rows and W columns from L2 instead of streaming all of x
// once per column block (32,768 contiguous rows of 7 KB against 16 column blocks were 3.9 GB of
// x). Up to kGroupM row units (every decode size) this is the plain row-fastest order. Groups of 4
// and 16 measured slower than 8 (PERF.md, 2026-12-03).
constexpr int kGroupM = 8;

// TAIL: the launch's last wave is shared out in K — masked: split (plan_tail); dense: stream-K
// (StreamKParams, gemm_stream_k.h).
template <int BM, int BN, Layout L, int CL, bool TAIL>
struct Scheduler {
    const ParamsOf<L, TAIL>& p;
    const int* prefix;  // masked: tiles before expert e, in shared memory
    int m_blocks;
    // Masked: units [0, full) are whole tiles; the `tail` tiles after them run as tail_splits K
    // ranges of tail_kb blocks (the last one the rest), unit full + split · tail + i for tile
    // full + i: a tile's last split comes after its others.
    int full = 0, tail = 0, tail_splits = 1, tail_kb = 0;

    // Masked, once the prefix is in shared memory: split the tiles (pair units) of the last wave
    // over the grid's `ctas` (pairs) when they fill at most half of it (the header's split-K), or,
    // unpaired, 3 ways over two rounds when they fill at most two thirds and the workspace holds
    // their partials. Every thread of every CTA must reach the same plan — it does, from the same
    // counts (the stream orders their writes before this launch); plans that differed could leave
    // a last split waiting for ever.
    __device__ void plan_tail(int ctas) {
        const int tiles = prefix[p.num_experts], r = tiles % ctas, deep = p.nkb / kMinTailSplitKb;
        int s = 1;
        if (r > 0 && 2 * r <= ctas) {
            s = min(min(p.splits, ctas / r), deep);
        } else if (CL == 1 && r > 0 && 3 * r <= 2 * ctas && min(p.splits, deep) >= 3 && 3 * r <= p.tail_slots) {
            s = 3;
        }
        if (s > 1) {
            // Ranges of ceil(nkb / s): all but the last at least kMinTailSplitKb, the last the rest
            // (49 blocks in 3: 17, 17, 15; V3's 56: 19, 19, 18). Even ranges (split · nkb / s)
            // made ptxas spill in the 128 × 256 kernel.
            tail_kb = (p.nkb + s - 1) / s;
            s = (p.nkb + tail_kb - 1) / tail_kb;  // no empty split; still >= 2 (3 for two rounds: nkb >= 48)
        }
        full = s > 1 ? tiles - r : tiles;
        tail = s > 1 ? r : 0;
        tail_splits = s > 1 ? s : 1;
    }

    __device__ int m_units() const { return (m_blocks + CL - 1) / CL; }

    // Contiguous: the expert of the 128-row block holding `row`, or -1 for a padding block or a
    // row past the end.
    __device__ int expert_of(int row) const {
        if (row >= p.rows) return -1;
        const int e = p.block_expert[row / kBK];
        return e >= 0 && e < p.num_experts ? e : -1;
    }

    __device__ int total() const {
        if constexpr (L == Layout::kMasked)
            return TAIL ? full + tail * tail_splits : prefix[p.num_experts];
        else if constexpr (L == Layout::kDense && TAIL)
            return p.sk.units();  // whole tiles, then two pieces per share (gemm_stream_k.h)
        else
            return m_units() * p.n_blocks * (L == Layout::kDense ? p.splits : 1);
    }

    __device__ Tile get(int t, int rank) const {
        Tile tile{};
        const int sw_per_expert = ((p.N + kBK - 1) / kBK) * p.nkb;
        if constexpr (L == Layout::kMasked) {
            const bool split = TAIL && t >= full;  // a unit of the last wave's split tiles
            const int u = split ? full + (t - full) % tail : t;
            const int e = segment_of(prefix, p.num_experts, u),
                      local = u - prefix[e];  // prefix[e] <= u < prefix[e + 1]
            const int count = min(max(p.counts[e], 0), p.rows);
            const int units = ((count + BM - 1) / BM + CL - 1) / CL;  // row blocks of the expert, CL per unit
            const int m0 = (CL * (local % units) + rank) * BM;
            tile.n0 = (local / units) * BN;
            tile.a_row = e * p.rows + m0;
            tile.rows = count - m0;
            tile.b_row = e * p.N + tile.n0;
            tile.sw_base = e * sw_per_expert + (tile.n0 / kBK) * p.nkb;
            tile.kb0 = 0;
            tile.kb1 = p.nkb;
            tile.id = t;
            if (split) {
                tile.split = (t - full) / tail;
                tile.splits = tail_splits;
                tile.kb0 = tile.split * tail_kb;
                tile.kb1 = min(p.nkb, tile.kb0 + tail_kb);
                tile.id = (u - full) * CL + rank;  // id · splits + split < the partial slots (plan_tail)
            }
        } else {
            const int per_split = m_units() * p.n_blocks;
            int u = t % per_split;
            StreamKPiece piece{};
            bool sk = false;  // a stream-K piece
            if constexpr (L == Layout::kDense && TAIL) {
                if (t >= p.sk.full) {
                    if (!stream_k_piece(p.sk, t, piece)) {
                        tile.skip = true;
                        return tile;
                    }
                    u = piece.tile;
                    sk = true;
                }
            }
            const int group = u / (kGroupM * p.n_blocks), in_group = u % (kGroupM * p.n_blocks);
            const int group_units = min(kGroupM, m_units() - group * kGroupM);
            const int m_unit = group * kGroupM + in_group % group_units;
            const int m_blk = CL * m_unit + rank, n_blk = in_group / group_units;
            tile.n0 = n_blk * BN;
            tile.a_row = m_blk * BM;
            tile.id = m_blk + n_blk * m_blocks;
            if constexpr (L == Layout::kDense) {
                tile.split = t / per_split;
                tile.splits = p.splits;
                tile.rows = p.rows - tile.a_row;
                tile.b_row = tile.n0;
                tile.sw_base = (tile.n0 / kBK) * p.nkb;
                tile.kb0 = tile.split * p.kb_per_split;
                tile.kb1 = min(p.nkb, tile.kb0 + p.kb_per_split);
                if constexpr (TAIL) {
                    if (sk) {
                        tile.split = piece.split;
                        tile.splits = piece.splits;
                        tile.kb0 = piece.kb0;
                        tile.kb1 = piece.kb1;
                        tile.id = (u - p.sk.full) * CL + rank;  // (id + 1) · sk.slots <= the partial slots
                    }
                }
            } else {
                // A block past the rows (the last pair's second CTA) or of no expert (padding)
                // computes expert 0's product for its peer and writes nothing; a pair with no
                // expert's block (the unused end of the model's spill region) is skipped.
                const int e = expert_of(tile.a_row);
                tile.rows = e >= 0 ? min(BM, p.rows - tile.a_row) : 0;
                tile.b_row = max(e, 0) * p.N + tile.n0;
                tile.sw_base = max(e, 0) * sw_per_expert + (tile.n0 / kBK) * p.nkb;
                tile.kb0 = 0;
                tile.kb1 = p.nkb;
                if constexpr (CL > 1) {
                    // The pair shares its W tile only when both blocks take the same expert's.
                    static_assert(CL <= 2, "the pair's peer is rank ^ 1");
                    const int peer = expert_of((CL * m_unit + (rank ^ 1)) * BM);
                    tile.shared_w = max(peer, 0) == max(e, 0);
                    tile.skip = e < 0 && peer < 0;
                }
            }
        }
        if constexpr (CL == 1) tile.skip = tile.rows <= 0;  // (a skipped stream-K piece returned above)
        return tile;
    }
};

__device__ __forceinline__ float bf16_at(const __nv_bfloat16* p, size_t i) { return __bfloat162float(p[i]); }

// TAIL: the masked layout's split K or dense stream-K, a separate instantiation so that the kernels
// that never share a wave carry none of its code (with the split in every masked kernel, EP128's
// unsplit down projection ran 75 against 72 µs and the pairs' variants 2-18 µs slower; PERF.md,
// twenty-sixth session). The dense ones keep the default kernel's stages and store boxes.
template <int BM, int BN, int STAGES, Layout L, int CL, bool TAIL>
__global__ void __launch_bounds__((BM / 64 + 1) * 128, ctas_per_sm(BM, BN))
    gemm_fp8_sm90_kernel(const __grid_constant__ CUtensorMap tmap_x, const __grid_constant__ CUtensorMap tmap_x_tail,
                         const __grid_constant__ CUtensorMap tmap_w, const __grid_constant__ CUtensorMap tmap_y,
                         const ParamsOf<L, TAIL> p) {
    constexpr int kConsumers = BM / 64;
    constexpr int kABytes = BM * kBK, kBBytes = BN * kBK, kStageBytes = kABytes + kBBytes;
    constexpr int kScaleFloats = BM + 4;  // sx per row, sw per 128 columns (<= 2), padded to 16 bytes
    static_assert(!TAIL || L != Layout::kContiguous, "the contiguous layout shares no wave");
    constexpr bool kMaskedTail = TAIL && L == Layout::kMasked;
    constexpr SmemLayout kLayout(BM, BN, STAGES, kMaskedTail);
    constexpr int kBoxes = kLayout.boxes, kBoxBytes = 16 * 64 * 2;
    static_assert(kLayout.stage_bytes == kStageBytes, "SmemLayout and the kernel disagree on a stage");
    constexpr int kAcc = BN / 2;  // f32 accumulators per thread (m64 × BN over 128 threads)
    // wgmma width: a 256-wide tile runs as two n128 halves, each promoted before the next, so
    // the registers hold acc[128] + part[64] instead of two 128-float sets. A 192-wide tile
    // (dense only: qkv_a's N = 2112 is 11 of them, where 256-wide tiles waste 8% of their columns
    // and leave the last of three waves four-fifths empty at M = 4096) runs as one n192 group:
    // acc[96] + part[96].
    constexpr int kWN = BN < 128 || BN == 192 ? BN : 128, kHalves = BN / kWN, kPart = kWN / 2;
    // W's scales per stage: one per 128-column block of each half; a 192-wide tile's columns
    // straddle W's 128-column blocks (n0 % 128 is 0 or 64), so it takes one per 64-column chunk.
    constexpr bool kChunked = BN == 192;
    constexpr int kWScales = kChunked ? BN / 64 : kHalves;
    static_assert(kWScales <= 4, "a stage's scales hold at most four W values");
    // Two partials in flight: the 64 × 64 tiles, whose one consumer warpgroup is alone with its
    // K loop's chain (see the loop).
    constexpr bool kPipelined = BM == 64 && BN == 64;
    // A consumer warpgroup with no row of x in its 64 skips the MMAs (the `idle` loop below) on
    // the 256-wide and 192-row tiles. On 128 × 128 tiles that path cost 1–2.5% on the
    // compute-bound gate+up GEMMs even where no warpgroup was idle, more than the down
    // projections gained (1–2 µs; PERF.md, 2026-12-03); 64-row tiles have one warpgroup.
    constexpr bool kSkipIdle = BM > 64 && (BN == 256 || BM == 192);
    static_assert(!kPipelined || STAGES >= 2, "two partials in flight hold two stages");
    static_assert(128 * (kProducerRegs + kConsumers * consumer_regs(kConsumers, ctas_per_sm(BM, BN))) <=
                      launch_regs(128 * (kConsumers + 1), ctas_per_sm(BM, BN)),
                  "setmaxnreg may hand out only the registers the CTA was launched with");
    static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "stages must keep 1024-byte alignment");

    extern __shared__ uint8_t smem_raw[];
    // Aligned by an offset from smem_raw (not by rounding a generic pointer), so every pointer
    // derived from it stays visibly in shared memory: the compiler then uses shared loads and
    // 32-bit addresses instead of generic ones it rebuilds per K block (PERF.md, 2026-12-02).
    uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    // SmemLayout's regions; the consumers' K loop uses the offsets directly.
    constexpr uint32_t kScalesOff = kLayout.scales_off, kFullOff = kLayout.full_off, kEmptyOff = kLayout.empty_off;
    uint8_t* epilogue = smem + STAGES * kStageBytes;
    float* scales = reinterpret_cast<float*>(smem + kScalesOff);
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + kFullOff);
    uint64_t* empty = reinterpret_cast<uint64_t*>(smem + kEmptyOff);
    __shared__ int prefix[L == Layout::kMasked ? kMaxExperts + 1 : 1];

    constexpr bool kSplitK = L == Layout::kDense || TAIL;
    Scheduler<BM, BN, L, CL, TAIL> sched{p, prefix, (p.rows + BM - 1) / BM};
    const int rank = CL > 1 ? static_cast<int>(cluster_rank()) : 0;
    const int stride = gridDim.x / CL;
    // With split K a tile's last split waits for its others, so the units are handed out in the
    // order the CTAs start (a ticket), not by their index: whichever CTAs run, the earlier splits
    // of a tile are in CTAs already running before its last split is handed out, and they never
    // wait. By index, a last split started before its others could hold the SM they need while
    // another stream's kernel holds the rest. The ticket is the CTA's place in the stride (its first
    // unit); atomicInc wraps it to zero as the grid's last CTA takes one: one atomic, and the next
    // launch finds it at zero (its CTAs start after every CTA here took its ticket: they wait for
    // grid_launch_dependents below, and without a programmatic dependency for this grid's end).
    __shared__ int ticket;
    // kDynamic (the masked layout's split kernels, unpaired): no ticket; the producer takes each
    // unit from p.grab as it gets to it and passes it on through unit_ring (below).
    constexpr bool kDynamic = kMaskedTail && CL == 1;
    const bool ticketed = kSplitK && (p.splits > 1 || (TAIL && L == Layout::kDense)) && !kDynamic;
    constexpr int kRing = kDynamic ? kUnitRing : 1;
    __shared__ int unit_ring[kRing];
    __shared__ uint64_t unit_full[kRing], unit_empty[kRing];
    // The W tile of a stage: with clusters each CTA fetches 1/CL of its rows for all of them — or,
    // when the CTAs' tiles take different W tiles (contiguous blocks of two experts), each its own
    // in CL boxes, for the same bytes on its barrier.
    auto load_w = [&](int stage, int kb, const Tile& tile) {
        uint8_t* dst = smem + stage * kStageBytes + kABytes;
        if constexpr (CL == 1) {
            tma_load_2d(dst, &tmap_w, &full[stage], kb * kBK, tile.b_row);
        } else {
            constexpr int kRows = BN / CL;
            if (tile.shared_w) {
                tma_load_2d_multicast(dst + rank * kRows * kBK, &tmap_w, &full[stage], kb * kBK,
                                      tile.b_row + rank * kRows, static_cast<uint16_t>((1 << CL) - 1));
            } else {
#pragma unroll
                for (int c = 0; c < CL; ++c)
                    tma_load_2d(dst + c * kRows * kBK, &tmap_w, &full[stage], kb * kBK, tile.b_row + c * kRows);
            }
        }
    };

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            // full: the TMA producer's expect_tx and lane 0 of the scale loader; empty: lane 0 of
            // every consumer warp of every CTA of the cluster (each after its warp's reads).
            mbar_init(&full[s], 1 + 1);
            mbar_init(&empty[s], CL * kConsumers * 4);
        }
        if constexpr (kDynamic)
            for (int i = 0; i < kRing; ++i) {
                mbar_init(&unit_full[i], 1);                    // the producer, with the unit in unit_ring
                mbar_init(&unit_empty[i], 1 + kConsumers * 4);  // lane 0 of the scale loader and of each consumer warp
            }
        mbar_fence_init();
        tma_prefetch_descriptor(&tmap_x);
        tma_prefetch_descriptor(&tmap_x_tail);
        tma_prefetch_descriptor(&tmap_w);
        if (ticketed && rank == 0) ticket = static_cast<int>(atomicInc(p.ticket, static_cast<unsigned>(stride - 1)));
    }
    if constexpr (CL > 1)
        cluster_sync();  // the peers' barriers exist before anything is multicast to them
    else
        __syncthreads();
    // The cluster's share of the tiles: from `first` on, every stride-th.
    int first = static_cast<int>(blockIdx.x) / CL;
    if (ticketed) first = CL > 1 && rank != 0 ? ld_shared_cluster(smem_addr(&ticket), 0) : ticket;

    // Launched with a programmatic dependency on the previous kernel: everything before
    // grid_dependency_wait() overlaps its tail. Only the dense producer does work there (it
    // fetches the weight tiles of its first stages, which no kernel writes), and split K's ticket
    // (above: the previous launch on this workspace handed out all of its own before this grid
    // could start, and atomics on one address are ordered); every other read of activations,
    // counts or the workspace and every write comes after the wait.
    grid_launch_dependents();
    // A tile with fewer than BM rows of x loads them through tmap_x_tail, whose box is only as tall
    // as those rows (rounded up to 8; launch_config); its rows past the box are never stored, so
    // whatever the stage held there only feeds discarded outputs. The stage then expects fewer bytes.
    auto x_map = [&](const Tile& tile) { return tile.rows < BM ? &tmap_x_tail : &tmap_x; };
    auto stage_tx = [&](const Tile& tile) {
        return static_cast<uint32_t>((tile.rows < BM ? p.x_tail_rows : BM) * kBK + kBBytes);
    };
    int prefetched = 0;  // producer: K blocks of its first tile already requested
    if constexpr (L == Layout::kDense) {
        if (threadIdx.x == 0 && first < sched.total()) {
            const Tile tile = sched.get(first, rank);
            prefetched = TAIL && tile.skip ? 0 : min(STAGES, tile.kb1 - tile.kb0);  // (stream-K: a piece)
            for (int i = 0; i < prefetched; ++i) {  // fresh stages: no need to wait for `empty`
                mbar_arrive_expect_tx(&full[i], stage_tx(tile));
                load_w(i, tile.kb0 + i, tile);
            }
            grid_dependency_wait();
            for (int i = 0; i < prefetched; ++i)
                tma_load_2d(smem + i * kStageBytes, x_map(tile), &full[i], (tile.kb0 + i) * kBK, tile.a_row);
        }
    }
    grid_dependency_wait();
    if constexpr (L == Layout::kMasked) {
        // prefix[e] = Σ_{e' < e} ceil(count/BM) · n_blocks, by warp 0 in chunks of 32 experts.
        if (threadIdx.x < 32) {
            int carry = 0;
            for (int base = 0; base < p.num_experts; base += 32) {
                const int e = base + static_cast<int>(threadIdx.x);
                int v = 0;
                if (e < p.num_experts)
                    v = (((min(max(p.counts[e], 0), p.rows) + BM - 1) / BM + CL - 1) / CL) * p.n_blocks;
#pragma unroll
                for (int o = 1; o < 32; o <<= 1) {
                    const int u = __shfl_up_sync(0xffffffffu, v, o);
                    if (threadIdx.x >= o) v += u;
                }
                if (e < p.num_experts) prefix[e + 1] = carry + v;
                carry += __shfl_sync(0xffffffffu, v, 31);
            }
            if (threadIdx.x == 0) prefix[0] = 0;
        }
    }
    __syncthreads();
    if constexpr (kMaskedTail) sched.plan_tail(stride);

    const int total = sched.total();
    const int wg = threadIdx.x / 128;
    // kDynamic: this CTA's next unit, the one the producer takes next from p.grab (an atomicInc
    // that wraps to zero at the last of the total + G takes: each CTA stops at its first one past
    // the end), passed to the scale loader and the consumers through unit_ring (else a CTA's units
    // are first, first + stride, ...). A CTA asks only while it runs, and the units come in order,
    // a tile's last split after its others (Scheduler::get): so each CTA's units run in the order
    // they were taken, and the lowest unit not yet done can always finish (its CTA has done its
    // earlier ones, and a last split's others are lower) — no last split waits on a CTA that may
    // not be running, and the CTAs that get through their whole tiles first take the split ones
    // (a producer takes its next unit once it has issued the loads of its current one, some
    // STAGES K blocks ahead of its consumers).
    int ring_slot = 0;
    uint32_t ring_phase = 0;
    auto advance = [&]() -> int {
        if constexpr (kDynamic) {
            const int slot = ring_slot;
            const uint32_t ph = ring_phase;
            if (++ring_slot == kRing) ring_slot = 0, ring_phase ^= 1;
            int u;
            if (threadIdx.x == 0) {  // the producer
                mbar_wait(&unit_empty[slot], ph ^ 1);
                u = static_cast<int>(atomicInc(p.grab, static_cast<unsigned>(total + stride - 1)));
                unit_ring[slot] = u;
                mbar_arrive(&unit_full[slot]);
            } else {
                mbar_wait(&unit_full[slot], ph);
                u = unit_ring[slot];
                __syncwarp();
                if (threadIdx.x % 32 == 0) mbar_arrive(&unit_empty[slot]);
            }
            return u;
        } else {
            return 0;  // (not called)
        }
    };

    if (wg == 0) {
        setmaxnreg_dec<kProducerRegs>();
        if (threadIdx.x == 0) {
            int s = prefetched % STAGES;
            uint32_t phase = prefetched == STAGES ? 1 : 0;
            for (int t = kDynamic ? advance() : first; t < total; t = kDynamic ? advance() : t + stride) {
                const Tile tile = sched.get(t, rank);
                if (tile.skip) continue;
                for (int kb = tile.kb0 + (t == first ? prefetched : 0); kb < tile.kb1; ++kb) {
                    mbar_wait(&empty[s], phase ^ 1);  // with clusters: free in every CTA of it
                    mbar_arrive_expect_tx(&full[s], stage_tx(tile));
                    tma_load_2d(smem + s * kStageBytes, x_map(tile), &full[s], kb * kBK, tile.a_row);
                    load_w(s, kb, tile);
                    if (++s == STAGES) s = 0, phase ^= 1;
                }
            }
        } else if (threadIdx.x / 32 == 1) {
            // The scale loader (warp 1): each stage's sx column and sw values into shared memory,
            // STAGES K blocks ahead of the consumers, so their strided loads never stall them. On
            // the 64 × 64 tiles the loads of a tile's next kScaleDepth K blocks are in flight while
            // it waits for a stage: one K block's loads at a time made its L2 misses a serial chain
            // beside the memory-bound decode tiles (PERF.md, nineteenth session; q_b's 64 × 128
            // tile lost 1-3 µs with it).
            const int lane = threadIdx.x % 32;
            int s = 0;
            uint32_t phase = 0;
            constexpr int kScaleDepth = kPipelined ? 4 : 1;  // the 64 × 64 tiles only (above)
            for (int t = kDynamic ? advance() : first; t < total; t = kDynamic ? advance() : t + stride) {
                const Tile tile = sched.get(t, rank);
                if (tile.skip) continue;
                float v[kScaleDepth][BM / 32], w[kScaleDepth];
                auto load = [&](int kb, float(&vv)[BM / 32], float& ww) {
#pragma unroll
                    for (int i = 0; i < BM / 32; ++i) {
                        const int r = lane + 32 * i;
                        vv[i] = r < tile.rows ? __ldg(p.sx + static_cast<size_t>(tile.a_row + r) * p.nkb + kb) : 0.0f;
                    }
                    ww = 0.0f;
                    if (lane < kWScales) {
                        const int col = kChunked ? 64 * lane : lane * kWN;  // the value's first column in the tile
                        const int blk = kChunked ? (tile.n0 % kBK + col) / kBK : lane;  // its W block after n0's
                        if (tile.n0 + col < p.N) ww = __ldg(p.sw + tile.sw_base + blk * p.nkb + kb);
                    }
                };
#pragma unroll
                for (int j = 0; j < kScaleDepth; ++j)
                    if (tile.kb0 + j < tile.kb1) load(tile.kb0 + j, v[j], w[j]);
                for (int kb = tile.kb0; kb < tile.kb1; kb += kScaleDepth) {
#pragma unroll
                    for (int j = 0; j < kScaleDepth; ++j) {  // unrolled: v[j] stays in registers
                        if (kb + j >= tile.kb1) break;
                        float* dst = scales + s * kScaleFloats;
                        mbar_wait(&empty[s], phase ^ 1);
#pragma unroll
                        for (int i = 0; i < BM / 32; ++i) dst[lane + 32 * i] = v[j][i];
                        if (lane < kWScales) dst[BM + lane] = w[j];
                        __syncwarp();  // the warp's stores before lane 0's release
                        if (lane == 0) mbar_arrive(&full[s]);
                        if (++s == STAGES) s = 0, phase ^= 1;
                        if (kb + j + kScaleDepth < tile.kb1) load(kb + j + kScaleDepth, v[j], w[j]);
                    }
                }
            }
        }
        if constexpr (CL > 1) cluster_sync();  // no CTA leaves while a peer may still write to it
        return;
    }

    setmaxnreg_inc<consumer_regs(kConsumers, ctas_per_sm(BM, BN))>();
    const int consumer = wg - 1;
    const int ctid = threadIdx.x - 128;  // 0 .. 128·kConsumers
    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    const int r_lo = 64 * consumer + 16 * warp + lane / 4;  // this thread's rows in the tile: r_lo, r_lo + 8
    // The K loop addresses shared memory from one 32-bit base and compile-time offsets, and steps
    // the wgmma descriptors' low words by adds: built per K block from pointers, these addresses
    // took ~100 dependent instructions on the wait → promote → issue chain that bounds the tensor
    // cores' use (Nsight Compute, PERF.md 2026-12-02).
    uint32_t base = smem_addr(smem);
    opaque(base);  // one register: left visible, the compiler rebuilds it at every K block
    constexpr uint32_t kStageDesc = kStageBytes / 16, kHalfDesc = kWN * kBK / 16;
    int s = 0;
    uint32_t phase = 0;
    // kDefer: a tile's epilogue waits in acc_kept until the warpgroup has issued the first wgmmas
    // of its next tile, so the tensor cores work while it stores (the K loop's first block below).
    // Grouped layouts, 64- and 128-wide tiles of one or two consumer warpgroups: 1–2% faster there
    // (PERF.md, 2026-12-04). Not the wider tiles, where acc, a partial and the epilogue's registers
    // do not fit without spills; not the 64 × 64 tiles, whose K loop keeps two partials in flight;
    // not the dense layout, whose 128-wide tiles at decode sizes lost 3–8% (a CTA's one tile).
    constexpr bool kDefer = L != Layout::kDense && !kPipelined && kAcc <= 64 && kConsumers <= 2;
    float acc_kept[kDefer ? kAcc : 1];

    // Epilogue: bf16 out (+ residual). Each warp owns 16 rows of its warpgroup's 64; per 8-column
    // group each thread holds two adjacent columns of rows r_lo and r_lo + 8. A warp whose 16
    // rows are all valid (and N % 8 == 0) writes them 64 columns at a time into its next 2 KB box
    // (epilogue_boxes of them, in turn), in the 128-byte swizzle of y's tensor map (stmatrix), and
    // has TMA store that box (clipped at N), waiting only for its own store kBoxes before to have
    // read the box — no named barrier between warps (DECISIONS: 2–6% at prefill sizes against
    // warpgroup-wide boxes). Warps with rows past the tile's (M edges, masked counts) store
    // from registers, so no row past them is touched.
    int box_slot = 0;  // the warp's next staging box: its stores take them in turn, across tiles
    auto store_tile = [&](const Tile& tile, const float* acc) {
        const int w_row = 64 * consumer + 16 * warp;  // the warp's first row in the tile
        if (p.tma_store && tile.rows >= w_row + 16) {
            uint8_t* boxes = epilogue + (4 * consumer + warp) * kBoxes * kBoxBytes;
#pragma unroll
            for (int c = 0; c < BN / 64; ++c) {
                if (tile.n0 + 64 * c >= p.N) break;
                uint32_t pk[16];
#pragma unroll
                for (int jj = 0; jj < 8; ++jj) {
                    const int j = 8 * c + jj, col = tile.n0 + 8 * j + 2 * (lane % 4);
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
                        if (p.residual != nullptr && col < p.N) {
                            const size_t idx = static_cast<size_t>(tile.a_row + r_lo + 8 * h) * p.N + col;
                            v0 += bf16_at(p.residual, idx);
                            v1 += bf16_at(p.residual, idx + 1);
                        }
                        pk[2 * jj + h] = pack_bf16_rn(v0, v1);
                    }
                }
                // The box's previous store, kBoxes stores ago, has read it.
                uint8_t* box = boxes + box_slot * kBoxBytes;
                if (lane == 0) bulk_wait_read<kBoxes - 1>();
                __syncwarp();
                store_rows_sw128(box, pk, lane / 4, lane);
                fence_proxy_async();
                __syncwarp();
                if (lane == 0) {
                    tma_store_2d(&tmap_y, box, tile.n0 + 64 * c, tile.a_row + w_row);
                    bulk_commit();
                }
                if (++box_slot == kBoxes) box_slot = 0;
            }
            return;
        }
        const bool pairs = (p.N % 2) == 0;
#pragma unroll
        for (int j = 0; j < kAcc / 4; ++j) {
            const int col = tile.n0 + 8 * j + 2 * (lane % 4);
            if (col >= p.N) continue;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = r_lo + 8 * h;
                if (r >= tile.rows) continue;
                const size_t idx = static_cast<size_t>(tile.a_row + r) * p.N + col;
                float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
                const bool two = col + 1 < p.N;
                if (p.residual != nullptr) {
                    v0 += bf16_at(p.residual, idx);
                    if (two) v1 += bf16_at(p.residual, idx + 1);
                }
                if (two && pairs) {
                    *reinterpret_cast<__nv_bfloat162*>(p.y + idx) = __floats2bfloat162_rn(v0, v1);
                } else {
                    p.y[idx] = __float2bfloat16(v0);
                    if (two) p.y[idx + 1] = __float2bfloat16(v1);
                }
            }
        }
    };
    int pending = -1;  // kDefer: the tile index whose results acc_kept holds, not yet stored
    auto flush = [&] {
        if (pending >= 0) store_tile(sched.get(pending, rank), acc_kept);
        pending = -1;
    };

    for (int t = kDynamic ? advance() : first; t < total; t = kDynamic ? advance() : t + stride) {
        int kb0, kb1;
        bool idle;  // none of this warpgroup's 64 rows is in x (the last row block, a masked count)
        {
            const Tile tile = sched.get(t, rank);
            // With clusters a tile past M still runs its pipeline (the peer's W rows come through
            // it) unless the whole cluster skips it.
            if (tile.skip) continue;
            kb0 = tile.kb0;
            kb1 = tile.kb1;
            idle = kSkipIdle && tile.rows <= 64 * consumer;
        }
        opaque(kb1);                        // kept, not recomputed from the parameters per K block
        float acc_tile[kDefer ? 1 : kAcc];  // a tile's own accumulators, when no epilogue waits
        float* acc = kDefer ? acc_kept : acc_tile;
        if constexpr (!kDefer) {
#pragma unroll
            for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
        }
        // Four k32 wgmmas over stage `st` (columns h·kWN.. of the W tile) into `part`, committed.
        auto issue = [&](int st, int h, float(&part)[kPart]) {
            const uint32_t a_lo = desc_k_major_sw128_lo(base) + st * kStageDesc + consumer * (64 * kBK / 16);
            const uint32_t b_lo = desc_k_major_sw128_lo(base) + st * kStageDesc + kABytes / 16 + h * kHalfDesc;
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < kBK / 32; ++k)
                Wgmma<kWN>::mma(part, desc_from_lo(a_lo + 2 * k), desc_from_lo(b_lo + 2 * k), k > 0 ? 1 : 0);
            wgmma_commit();
        };
        // The stage's last reader hands it back to the producer(s).
        auto release = [&](int st) {
            const uint32_t bar = base + kEmptyOff + 8 * st;
            __syncwarp();  // the warp's reads of the stage (scales) before lane 0's release
            if (lane == 0) {
                mbar_arrive(bar);
                for (int c = 1; c < CL; ++c) mbar_arrive_cluster(bar, (rank + c) % CL);
            }
        };
        // a += part · scale; with `first` (a kDefer tile's first K block) a = part · scale, so acc
        // needs no zeroing and holds the previous tile's results until that block's wgmmas run.
        // s_lo / s_hi: the scales of rows r_lo / r_lo + 8 — one per part, or with kChunked one per
        // 64-column chunk (8 fragment columns of 8), each with its own W block's scale.
        auto promote = [&](bool first, const float(&part)[kPart], float* a, const float* s_lo, const float* s_hi) {
#pragma unroll
            for (int j = 0; j < kPart / 4; ++j) {
                const float lo = s_lo[kChunked ? j / 8 : 0], hi = s_hi[kChunked ? j / 8 : 0];
                a[4 * j + 0] = first ? part[4 * j + 0] * lo : fmaf(part[4 * j + 0], lo, a[4 * j + 0]);
                a[4 * j + 1] = first ? part[4 * j + 1] * lo : fmaf(part[4 * j + 1], lo, a[4 * j + 1]);
                a[4 * j + 2] = first ? part[4 * j + 2] * hi : fmaf(part[4 * j + 2], hi, a[4 * j + 2]);
                a[4 * j + 3] = first ? part[4 * j + 3] * hi : fmaf(part[4 * j + 3], hi, a[4 * j + 3]);
            }
        };
        // Per K block: each half's wgmmas into a fresh partial, wait, promote — except on the
        // 64 × 64 tiles (kPipelined), which keep two partials so that block kb + 1's wgmmas run
        // while kb's are promoted. There the CTA's one consumer warpgroup is alone with its chain
        // (wait → promote → issue); with two or more, the other warpgroups fill the gap: two
        // partials on 128 × 64 and 128 × 128 tiles measured no faster (PERF.md, 2026-12-03), nor
        // did making two warpgroups take turns at issuing (2026-12-02). Written as a loop over
        // pairs of K blocks with unconditional issues, ptxas keeps the wgmmas asynchronous; the
        // earlier tries, with the issue in a branch or dummy groups past the end, it serialized
        // (C7518, C7514).
        if constexpr (kPipelined) {
            // The loop goes two K blocks at a time so that each partial stays a fixed set of
            // registers; the last one or two K blocks are peeled (every tile, split or not, has at
            // least one: the launch makes no empty split).
            float pa[kPart], pb[kPart];
            float sc_a_lo, sc_a_hi, sc_b_lo, sc_b_hi;  // the row scales times the W block's scale
            int st_a, st_b;                            // their stages
            // Waits for the next stage, reads its scales and issues its wgmmas into `part`.
            auto start = [&](int& st, float& lo, float& hi, float(&part)[kPart]) {
                st = s;
                mbar_wait(base + kFullOff + 8 * st, phase);
                const float* st_scales = scales + st * kScaleFloats;
                const float w = st_scales[BM];
                lo = st_scales[r_lo] * w;
                hi = st_scales[r_lo + 8] * w;
                issue(st, 0, part);
                if (++s == STAGES) s = 0, phase ^= 1;
            };
            start(st_a, sc_a_lo, sc_a_hi, pa);
            int kb = kb0 + 1;
            for (; kb + 1 < kb1; kb += 2) {
                start(st_b, sc_b_lo, sc_b_hi, pb);
                wgmma_wait<1>();
                fence_regs(pa);
                release(st_a);
                promote(false, pa, acc, &sc_a_lo, &sc_a_hi);
                start(st_a, sc_a_lo, sc_a_hi, pa);
                wgmma_wait<1>();
                fence_regs(pb);
                release(st_b);
                promote(false, pb, acc, &sc_b_lo, &sc_b_hi);
            }
            if (kb < kb1) {
                start(st_b, sc_b_lo, sc_b_hi, pb);
                wgmma_wait<1>();
                fence_regs(pa);
                release(st_a);
                promote(false, pa, acc, &sc_a_lo, &sc_a_hi);
                wgmma_wait<0>();
                fence_regs(pb);
                release(st_b);
                promote(false, pb, acc, &sc_b_lo, &sc_b_hi);
            } else {
                wgmma_wait<0>();
                fence_regs(pa);
                release(st_a);
                promote(false, pa, acc, &sc_a_lo, &sc_a_hi);
            }
        } else if (kSkipIdle && idle) {
            flush();
            // Nothing of its own to compute: it only hands the stages back, so the tensor cores
            // serve the tile's other warpgroups alone (a masked expert's last row block often holds
            // fewer than 64 rows; PERF.md, 2026-12-03). Its accumulators are never stored.
            for (int kb = kb0; kb < kb1; ++kb) {
                mbar_wait(base + kFullOff + 8 * s, phase);
                release(s);
                if (++s == STAGES) s = 0, phase ^= 1;
            }
        } else {
            // One K block; the first stores the pending tile once its first wgmmas are issued.
            // Peeled in every layout: in this form (first block apart, acc through a pointer, one
            // epilogue) the dense 128 × 256 tiles also ran 3–8% faster at prefill sizes, though
            // nothing of theirs is deferred (PERF.md, 2026-12-04; which part ptxas answers to was
            // not separated).
            auto k_block = [&](bool first) {
                mbar_wait(base + kFullOff + 8 * s, phase);
                // This thread's row scales and the W scales of the stage (read before it is released):
                // one per half, or one per 64-column chunk of the one 192-wide part.
                const float* st_scales = scales + s * kScaleFloats;
                const float sa_lo = st_scales[r_lo], sa_hi = st_scales[r_lo + 8];
                float sb[kWScales];
#pragma unroll
                for (int c = 0; c < kWScales; ++c) sb[c] = st_scales[BM + c];
#pragma unroll
                for (int h = 0; h < kHalves; ++h) {
                    float part[kPart];
                    issue(s, h, part);
                    if constexpr (kDefer)
                        if (first && h == 0) flush();
                    wgmma_wait<0>();
                    fence_regs(part);
                    if (h == kHalves - 1) release(s);
                    // The scales this part's columns take: its half's, or with kChunked each chunk's.
                    constexpr int kScalesHere = kChunked ? kWScales : 1;
                    float lo[kScalesHere], hi[kScalesHere];
#pragma unroll
                    for (int c = 0; c < kScalesHere; ++c) {
                        lo[c] = sa_lo * sb[kChunked ? c : h];
                        hi[c] = sa_hi * sb[kChunked ? c : h];
                    }
                    promote(kDefer && first, part, acc + h * kPart, lo, hi);
                }
                if (++s == STAGES) s = 0, phase ^= 1;
            };
            k_block(true);
            for (int kb = kb0 + 1; kb < kb1; ++kb) k_block(false);
        }
        const Tile tile = sched.get(t, rank);  // again: kept across the K loop it would take registers
        if (tile.rows <= 0) continue;

        if constexpr (kSplitK) {
            if (tile.splits > 1) {
                constexpr int kThreads = kConsumers * 128, kSlot = kThreads * kAcc / 4;  // float4s per split
                int slots = tile.splits;  // per tile id (stream-K: the plan's, for every tile)
                if constexpr (L == Layout::kDense && TAIL) slots = p.sk.slots;
                float4* all = reinterpret_cast<float4*>(p.partials) + static_cast<size_t>(tile.id) * slots * kSlot;
                cuda::atomic_ref<int, cuda::thread_scope_device> stored(p.counters[tile.id]);
                if (tile.split < tile.splits - 1) {
                    // Each float4 holds a quad with its pairs swapped (acc[1], acc[0], acc[3],
                    // acc[2]), read back the same way. A 16-byte store needs its four registers
                    // consecutive and aligned, so in plain order acc[j] would share the parity of
                    // the wgmma fragment's part[j], and every promotion FFMA would read two operands
                    // from one register bank. Swapped, ptxas gives acc[j] the other parity (as in
                    // the grouped layouts, which have no such store).
                    float4* mine = all + static_cast<size_t>(tile.split) * kSlot;
#pragma unroll
                    for (int i = 0; i < kAcc / 4; ++i)
                        mine[i * kThreads + ctid] =
                            make_float4(acc[4 * i + 1], acc[4 * i], acc[4 * i + 3], acc[4 * i + 2]);
                    named_barrier(1, kThreads);  // every consumer's stores before the one release
                    if (ctid == 0) stored.fetch_add(1, cuda::memory_order_release);
                    continue;
                }
                // The last split adds the others' partials to its own in split order (the sum does
                // not depend on who finishes first) once all of them are stored. Its wait cannot
                // block them (dense: the ticket hands them out before this one to CTAs already
                // running, and the launch keeps every unit in a CTA of its own; masked in pairs:
                // the same, a tile's splits being units t, t + tail, ..., each CTA's last and all
                // within one stride; unpaired masked: the order units are taken in, `advance`).
                if (ctid == 0) {
                    while (stored.load(cuda::memory_order_acquire) != tile.splits - 1) __nanosleep(32);
                    stored.store(0, cuda::memory_order_relaxed);  // for the next launch
                }
                named_barrier(1, kThreads);
                for (int sp = 0; sp < tile.splits - 1; ++sp) {  // a split's loads all in flight at once
                    const float4* src = all + static_cast<size_t>(sp) * kSlot;
#pragma unroll
                    for (int i = 0; i < kAcc / 4; ++i) {
                        const float4 v = __ldcg(src + i * kThreads + ctid);
                        acc[4 * i + 1] += v.x;  // pairs swapped, as stored
                        acc[4 * i] += v.y;
                        acc[4 * i + 3] += v.z;
                        acc[4 * i + 2] += v.w;
                    }
                }
            }
        }
        if (!kDefer) {
            store_tile(tile, acc);
        } else if (!idle) {
            pending = t;
        }
    }
    flush();
    if (p.tma_store && lane == 0) bulk_wait();  // this warp's stores are done
    if constexpr (CL > 1) cluster_sync();
}

// ---- host side ----

// A row-major [rows, cols] matrix of `elem_bytes`-byte elements in boxes of [box_rows × box_cols]
// with 128-byte swizzle (box_cols · elem_bytes = 128); loads past the edges fill zeros, stores
// past them are dropped.
CUtensorMap tmap_2d(CUtensorMapDataType type, int elem_bytes, const void* base, uint64_t rows, uint64_t cols,
                    uint32_t box_rows, uint32_t box_cols, CUtensorMapL2promotion promotion, const char* what) {
    TensorMapSpec s;
    s.type = type;
    s.elem_bytes = elem_bytes;
    s.base = base;
    s.rank = 2;
    s.dims[0] = cols;
    s.dims[1] = rows;
    s.strides[0] = cols * elem_bytes;
    s.box[0] = box_cols;
    s.box[1] = box_rows;
    s.promotion = promotion;
    return make_tensor_map(s, what);
}

// x or W: [rows, K] e4m3 in [box_rows × 128] boxes (one K block).
CUtensorMap tmap_rows_by_k(const uint8_t* base, uint64_t rows, uint64_t K, uint32_t box_rows) {
    return tmap_2d(CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, base, rows, K, box_rows, kBK, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                   "x or W");
}

// y [rows, N] bf16 in boxes of 16 rows × 64 columns (a warp's stores in the TMA-store epilogue).
CUtensorMap tmap_y(const void* y, uint64_t rows, uint64_t N) {
    return tmap_2d(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, y, rows, N, 16, 64, CU_TENSOR_MAP_L2_PROMOTION_NONE, "y");
}

// As many stages as fit (at most 16): a CTA gets at most 227 KB of shared memory, and with two
// per SM each gets half of the SM's 228 KB less the driver's 1 KB; the kernel's static arrays
// (the masked layout's prefix, the ticket, kDynamic's unit ring) come off first.
template <int BM, int BN, bool TAIL>
constexpr int stages() {
    constexpr int kStatic = (kMaxExperts + 2) * 4 + kUnitRing * (sizeof(int) + 2 * sizeof(uint64_t));
    constexpr int ctas = ctas_per_sm(BM, BN);
    constexpr int avail = (ctas == 1 ? 227 * 1024 : 228 * 1024 / ctas - 1024) - kStatic;
    int s = 16;
    while (s > 1 && SmemLayout(BM, BN, s, TAIL).bytes > avail) --s;
    return s;
}

// The operands of one launch: x [x_rows, K] and the stacked W [w_rows, K]; `units` tile units
// (clusters' worth) to spread over the persistent grid, or 0 when only the device knows (masked);
// with split K, the workspace's room (the launch checks it after capping the splits).
struct Operands {
    const uint8_t* x;
    uint64_t x_rows;
    const uint8_t* w;
    uint64_t w_rows;
    int units;
    size_t partial_capacity = 0;  // floats at Params::partials
    int counter_capacity = 0;     // ints at Params::counters
    bool stream_k = false;        // dense: GemmConfig::stream_k (launch_config plans it)
};

template <int BM, int BN, Layout L, int CL, bool TAIL = false>
void launch_config(const Operands& o, const Params& p, cudaStream_t stream) {
    constexpr bool kMaskedTail = TAIL && L == Layout::kMasked;
    constexpr int S = stages<BM, BN, kMaskedTail>();
    auto* kernel = gemm_fp8_sm90_kernel<BM, BN, S, L, CL, TAIL>;
    constexpr int smem = SmemLayout(BM, BN, S, kMaskedTail).bytes;
    cudaLaunchConfig_t launch{};
    launch.blockDim = dim3((BM / 64 + 1) * 128);
    launch.dynamicSmemBytes = smem;
    launch.stream = stream;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;  // see grid_dependency_wait()
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    attr[1].id = cudaLaunchAttributeClusterDimension;
    attr[1].val.clusterDim.x = CL;
    attr[1].val.clusterDim.y = 1;
    attr[1].val.clusterDim.z = 1;
    launch.attrs = attr;
    launch.numAttrs = CL > 1 ? 2 : 1;
    // How many clusters fit at once (CL > 1: pairs of SMs within a GPC): the persistent grid. Per
    // device, with the kernel's attributes, which CUDA keeps per device.
    static PerDevice<int> max_units_on;
    const int max_units = max_units_on.get([&] {
        FANOUT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        if constexpr (CL == 1) {
            int per_sm = 0;
            FANOUT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, launch.blockDim.x, smem));
            FANOUT_DEVICE_REQUIRE(per_sm > 0, "gemm_fp8: the kernel does not fit on a multiprocessor");
            return device_sm_count() * per_sm;
        } else {
            FANOUT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 0));
            launch.gridDim = dim3(CL * (device_sm_count() / CL));
            int clusters = 0;
            FANOUT_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch));
            FANOUT_DEVICE_REQUIRE(clusters > 0, "gemm_fp8: no cluster of " + std::to_string(CL) + " fits this GPU");
            return clusters;
        }
    });
    ParamsOf<L, TAIL> q{};
    static_cast<Params&>(q) = p;
    int units = o.units > 0 ? std::min(o.units, max_units) : max_units;
    if (L == Layout::kDense && p.splits > 1 && o.units > max_units) {
        // A tile's last split waits for its others (the kernel's split-K), so every unit needs a
        // CTA of its own: fewer splits, or none, where the tiles alone fill the GPU.
        const int per_split = o.units / p.splits, splits = std::max(1, max_units / per_split);
        q.kb_per_split = (p.nkb + splits - 1) / splits;
        q.splits = (p.nkb + q.kb_per_split - 1) / q.kb_per_split;
        units = std::min(per_split * q.splits, max_units);
    }
    if constexpr (L == Layout::kDense && gemm_fp8_stream_k_tile(BM, BN)) {
        if (o.stream_k) {  // the tiles past the whole waves dealt out in K shares, by the TAIL kernel
            const StreamKPlan plan = plan_stream_k(o.units, max_units, p.nkb, kMinStreamKShare);
            if constexpr (!TAIL) {
                if (plan.tiles > 0) return launch_config<BM, BN, L, CL, true>(o, p, stream);
            } else {
                q.sk = plan;
                units = max_units;
                const size_t need = static_cast<size_t>(q.sk.tiles) * CL * q.sk.slots * BM * BN;
                FANOUT_DEVICE_REQUIRE(need <= o.partial_capacity && q.sk.tiles * CL <= o.counter_capacity,
                                      "gemm_fp8: stream-K workspace too small (" + std::to_string(need * 4) +
                                          " bytes, " + std::to_string(q.sk.tiles * CL) + " counters needed)");
            }
        }
    }
    if (L != Layout::kContiguous && q.splits > 1) {
        // Dense: every tile's splits; masked: a slot per CTA of a split unit in one round, at most
        // one per CTA (a two-round split takes more only where tail_slots has them: plan_tail).
        const int tiles = L == Layout::kDense ? static_cast<int>((o.x_rows + BM - 1) / BM) * p.n_blocks : units * CL;
        const size_t need = static_cast<size_t>(tiles) * (L == Layout::kDense ? q.splits : 1) * BM * BN;
        FANOUT_DEVICE_REQUIRE(need <= o.partial_capacity && tiles <= o.counter_capacity,
                              "gemm_fp8: split-K workspace too small (" + std::to_string(need * 4) + " bytes, " +
                                  std::to_string(tiles) + " counters needed)");
        q.tail_slots = static_cast<int>(std::min<size_t>(o.partial_capacity / (size_t{BM} * BN), 1 << 30));
    }
    launch.gridDim = dim3(CL * units);
    // The last row block of a dense x that ends inside it (a decode step: M = 2 for one request
    // with MTP, or M = 200 on 128-row tiles) is loaded in a box of its rows rounded up to 8, not of
    // BM rows. With the full box, TMA's zero fill of the rows past the tensor made the GEMM slower
    // than with every row real: o_proj at M = 2 took 55.9 µs against 37.3 at M = 64, and 35.0 with
    // the short box (PERF.md, 2026-12-03). The grouped layouts' rows past a count are real memory.
    const uint32_t tail_rows =
        L == Layout::kDense && o.x_rows % BM != 0 ? uint32_t((o.x_rows % BM + 7) / 8 * 8) : uint32_t(BM);
    const CUtensorMap tx = tmap_rows_by_k(o.x, o.x_rows, p.K, BM);
    const CUtensorMap tx_tail = tail_rows == uint32_t(BM) ? tx : tmap_rows_by_k(o.x, o.x_rows, p.K, tail_rows);
    const CUtensorMap tw = tmap_rows_by_k(o.w, o.w_rows, p.K, BN / CL);
    q.x_tail_rows = static_cast<int>(tail_rows);
    q.tma_store = p.N % 8 == 0 && reinterpret_cast<uintptr_t>(p.y) % 16 == 0;
    const CUtensorMap ty = q.tma_store ? tmap_y(p.y, o.x_rows, p.N) : tx;
    FANOUT_CUDA_CHECK(cudaLaunchKernelEx(&launch, kernel, tx, tx_tail, tw, ty, q));
}

// Launches the entry of kGemmFp8Tiles from I on that matches cfg's tile (every entry's kernels are
// instantiated here, for the layouts it serves); check_config has made sure one does.
template <Layout L, size_t I = 0>
void launch_tile(const GemmConfig& cfg, const Operands& o, const Params& p, cudaStream_t stream) {
    if constexpr (I < std::size(kGemmFp8Tiles)) {
        constexpr GemmFp8Tile t = kGemmFp8Tiles[I];
        if constexpr (L == Layout::kDense || !t.dense_only) {
            if (cfg.block_m == t.block_m && cfg.block_n == t.block_n) {
                if constexpr (L == Layout::kMasked)
                    if (cfg.splits > 1)
                        return cfg.cluster == 2 ? launch_config<t.block_m, t.block_n, L, 2, true>(o, p, stream)
                                                : launch_config<t.block_m, t.block_n, L, 1, true>(o, p, stream);
                if (cfg.cluster == 2) return launch_config<t.block_m, t.block_n, L, 2>(o, p, stream);
                return launch_config<t.block_m, t.block_n, L, 1>(o, p, stream);
            }
        }
        launch_tile<L, I + 1>(cfg, o, p, stream);
    } else {
        FANOUT_DEVICE_REQUIRE(false, "gemm_fp8: no kernel for block_m " + std::to_string(cfg.block_m) + " × block_n " +
                                         std::to_string(cfg.block_n) + " (not checked by check_config)");
    }
}

// The configuration of a launch (the table's, or an override's), checked before anything divides
// by its sizes.
void check_config(const GemmConfig& cfg, Layout L, const char* what) {
    const bool dense = L == Layout::kDense;
    FANOUT_DEVICE_REQUIRE(gemm_fp8_tile_exists(cfg.block_m, cfg.block_n, dense),
                          std::string(what) + ": no kernel for block_m " + std::to_string(cfg.block_m) + " × block_n " +
                              std::to_string(cfg.block_n) + " (have " + gemm_fp8_tile_list(dense) + ")");
    FANOUT_DEVICE_REQUIRE(L != Layout::kContiguous || cfg.block_m <= 128,
                          std::string(what) + ": the contiguous layout's tiles stay inside one 128-row expert block " +
                              "(block_m " + std::to_string(cfg.block_m) + ")");
    FANOUT_DEVICE_REQUIRE(cfg.cluster == 1 || cfg.cluster == 2,
                          std::string(what) + ": clusters of " + std::to_string(cfg.cluster) + " (have 1 and 2)");
    FANOUT_DEVICE_REQUIRE(cfg.splits >= 1,
                          std::string(what) + ": splits must be at least 1, got " + std::to_string(cfg.splits));
    FANOUT_DEVICE_REQUIRE(
        !cfg.stream_k || (dense && cfg.splits == 1 && gemm_fp8_stream_k_tile(cfg.block_m, cfg.block_n)),
        std::string(what) + ": stream-K is built for the dense layout's 128 × 128 and 128 × 256 " +
            "tiles without splits (block " + std::to_string(cfg.block_m) + " × " + std::to_string(cfg.block_n) +
            ", splits " + std::to_string(cfg.splits) + ")");
}

void check_operands(const void* x, const void* w, int N, int K, const char* what) {
    FANOUT_DEVICE_REQUIRE(N > 0 && K > 0, std::string(what) + ": N and K must be positive, got N " + std::to_string(N) +
                                              ", K " + std::to_string(K));
    FANOUT_DEVICE_REQUIRE(K % 16 == 0,
                          std::string(what) + ": K must be a multiple of 16 for TMA, got " + std::to_string(K));
    FANOUT_DEVICE_REQUIRE(reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0,
                          std::string(what) + ": x and W must be 16-byte aligned");
}

// Split K's scratch for a launch: the workspace's partials, counters and ticket in p, its room in o
// (launch_config checks it once the splits are final). `what` names the caller in the error.
void attach_workspace(GemmWorkspace* workspace, Params& p, Operands& o, const char* what) {
    FANOUT_DEVICE_REQUIRE(workspace != nullptr, std::string(what) + ": split K needs a GemmWorkspace");
    p.partials = workspace->partials;
    p.counters = workspace->counters;
    p.ticket = workspace->ticket;
    p.grab = workspace->grab;
    o.partial_capacity = workspace->partial_floats;
    o.counter_capacity = workspace->num_counters;
}

Params base_params(const float* sx, const float* sw, uint16_t* y, int rows, int N, int K, int block_n) {
    Params p{};
    p.sx = sx;
    p.sw = sw;
    p.y = reinterpret_cast<__nv_bfloat16*>(y);
    p.rows = rows;
    p.N = N;
    p.K = K;
    p.nkb = (K + kBK - 1) / kBK;
    p.n_blocks = (N + block_n - 1) / block_n;
    p.splits = 1;
    p.kb_per_split = p.nkb;
    return p;
}

}  // namespace

int device_sm_count() {
    static PerDevice<int> sms_on;
    return sms_on.get([] {
        int dev = 0, sms = 0;
        FANOUT_CUDA_CHECK(cudaGetDevice(&dev));
        FANOUT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        return sms;
    });
}

GemmWorkspace::GemmWorkspace(size_t partial_bytes, int counters_count)
    : partial_floats(partial_bytes / sizeof(float)), num_counters(counters_count) {
    FANOUT_DEVICE_REQUIRE(counters_count >= 0, "GemmWorkspace: " + std::to_string(counters_count) + " counters");
    try {  // a failure part way frees the partials (no destructor runs for a throwing constructor)
        FANOUT_CUDA_CHECK(cudaMalloc(&partials, partial_floats * sizeof(float)));
        // The tile counters, then the ticket and the grab counter.
        const size_t bytes = static_cast<size_t>(num_counters) * sizeof(int) + 2 * sizeof(unsigned);
        FANOUT_CUDA_CHECK(cudaMalloc(&counters, bytes));
        ticket = reinterpret_cast<unsigned*>(counters + num_counters);
        grab = ticket + 1;
        // Waited for: the memset runs on the default stream, and the GEMMs may follow on a stream
        // that does not wait for it (a DeviceContext's is non-blocking) — a count that is not yet
        // zero would let a last split add partials that are not there, or wait for ever.
        FANOUT_CUDA_CHECK(cudaMemset(counters, 0, bytes));
        FANOUT_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    } catch (...) {
        cudaFree(partials);
        cudaFree(counters);
        throw;
    }
}

GemmWorkspace::~GemmWorkspace() {
    cudaFree(partials);
    cudaFree(counters);
}

void launch_gemm_fp8(const uint8_t* x, const float* sx, const uint8_t* w, const float* sw, uint16_t* y, int M, int N,
                     int K, void* cuda_stream, const uint16_t* residual, GemmWorkspace* workspace, GemmConfig cfg) {
    if (M <= 0 || N <= 0) return;
    if (K % 16 != 0) {
        FANOUT_DEVICE_REQUIRE(residual == nullptr, "gemm_fp8: a residual needs K a multiple of 16");
        return launch_gemm_fp8_simt(x, sx, w, sw, y, M, N, K, cuda_stream);
    }
    check_operands(x, w, N, K, "gemm_fp8");
    const int sms = device_sm_count();
    if (cfg.block_m == 0) cfg = pick_gemm_config(M, N, K, sms, workspace != nullptr);
    check_config(cfg, Layout::kDense, "gemm_fp8");
    Params p = base_params(sx, sw, y, M, N, K, cfg.block_n);
    p.residual = reinterpret_cast<const __nv_bfloat16*>(residual);
    const int m_blocks = (M + cfg.block_m - 1) / cfg.block_m;
    Operands o{x, uint64_t(M), w, uint64_t(N), 0};
    if (cfg.splits > 1) {
        attach_workspace(workspace, p, o, "gemm_fp8");
        p.kb_per_split = (p.nkb + cfg.splits - 1) / cfg.splits;
        p.splits = (p.nkb + p.kb_per_split - 1) / p.kb_per_split;  // no empty split
    }
    if (cfg.stream_k) {
        attach_workspace(workspace, p, o, "gemm_fp8");
        o.stream_k = true;
    }
    o.units = ((m_blocks + cfg.cluster - 1) / cfg.cluster) * p.n_blocks * p.splits;
    launch_tile<Layout::kDense>(cfg, o, p, static_cast<cudaStream_t>(cuda_stream));
}

void launch_grouped_gemm_fp8_contiguous(const uint8_t* x, const float* sx, int rows, const int32_t* block_expert,
                                        const uint8_t* w, const float* sw, int num_experts, int N, int K, uint16_t* y,
                                        void* cuda_stream, GemmConfig cfg) {
    if (rows <= 0) return;
    check_operands(x, w, N, K, "grouped_gemm_fp8_contiguous");
    FANOUT_DEVICE_REQUIRE(rows % kBK == 0,
                          "grouped_gemm_fp8_contiguous: rows must be a multiple of 128, got " + std::to_string(rows));
    FANOUT_DEVICE_REQUIRE(num_experts > 0, "grouped_gemm_fp8_contiguous: no experts");
    if (cfg.block_m == 0) cfg = kGroupedContiguousConfig;
    check_config(cfg, Layout::kContiguous, "grouped_gemm_fp8_contiguous");
    Params p = base_params(sx, sw, y, rows, N, K, cfg.block_n);
    p.block_expert = block_expert;
    p.num_experts = num_experts;
    const int m_blocks = rows / cfg.block_m;
    const int units = ((m_blocks + cfg.cluster - 1) / cfg.cluster) * p.n_blocks;
    launch_tile<Layout::kContiguous>(cfg, {x, uint64_t(rows), w, uint64_t(num_experts) * N, units}, p,
                                     static_cast<cudaStream_t>(cuda_stream));
}

void launch_grouped_gemm_fp8_masked(const uint8_t* x, const float* sx, const int32_t* counts, int num_experts,
                                    int max_m, const uint8_t* w, const float* sw, int N, int K, uint16_t* y,
                                    int expected_m, void* cuda_stream, GemmWorkspace* workspace, GemmConfig cfg) {
    if (max_m <= 0 || num_experts <= 0) return;
    check_operands(x, w, N, K, "grouped_gemm_fp8_masked");
    FANOUT_DEVICE_REQUIRE(num_experts <= kMaxExperts, "grouped_gemm_fp8_masked: at most " +
                                                          std::to_string(kMaxExperts) + " experts, got " +
                                                          std::to_string(num_experts));
    if (cfg.block_m == 0)
        cfg = pick_grouped_masked_config(expected_m, num_experts, N, K, device_sm_count(), workspace != nullptr);
    check_config(cfg, Layout::kMasked, "grouped_gemm_fp8_masked");
    Params p = base_params(sx, sw, y, max_m, N, K, cfg.block_n);
    p.counts = counts;
    p.num_experts = num_experts;
    Operands o{x, uint64_t(num_experts) * max_m, w, uint64_t(num_experts) * N, 0};
    if (cfg.splits > 1) {
        attach_workspace(workspace, p, o, "grouped_gemm_fp8_masked");
        p.splits = cfg.splits;
    }
    launch_tile<Layout::kMasked>(cfg, o, p, static_cast<cudaStream_t>(cuda_stream));
}

}  // namespace fanout::ops

// gemm_fp8: DeepSeek-V3's FP8 block-scaled GEMM, y[M, N] = x[M, K] · W[N, K]ᵀ.
//
// x is e4m3 with one f32 scale per 1×128 block of a row (act_quant); W is e4m3 with one f32 scale
// per 128×128 block (weight_scale_inv; partial blocks at the edges). Each 128-wide slice of K is
// accumulated in f32 and then promoted: y += partial · sx[m, kb] · sw[n / 128, kb]. The output is
// bf16 (the GPU kernels, optionally plus a bf16 residual) or f32 (the CPU reference).
//
// On the GPU (sm_90a): a persistent, warp-specialized kernel — one producer warpgroup feeding
// TMA tile loads through an mbarrier ring, one or two consumer warpgroups issuing FP8 wgmma and
// promoting each K block in registers — with split-K for shapes that have too few output tiles
// to fill the GPU (gemm_fp8_sm90.cu). The tile shape and split come from a table measured on
// H200 (`pick_gemm_config`, docs/PERF.md). K must be a multiple of 16 (TMA's row-stride rule);
// other K run on the plain SIMT kernel, which stays as the fallback.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "fanout/core/thread_pool.h"
#include "fanout/ops/fp8_constants.h"

namespace fanout::ops {

// x: [M, K] fp8; sx: [M, ceil(K/128)]; w: [N, K] fp8; sw: [ceil(N/128), ceil(K/128)]; y: [M, N] f32.
void gemm_fp8_cpu(const uint8_t* x, const float* sx, const uint8_t* w, const float* sw, float* y, int64_t M, int64_t N,
                  int64_t K, const Stream& s);

// The tile shape of one launch: block_m ∈ {64, 128} rows (one consumer warpgroup per 64),
// block_n ∈ {64, 128, 256} columns, or 192 × 128 (three consumer warpgroups; not for the contiguous
// grouped layout, whose tiles stay in one expert's 128-row block), or in the dense layout 128 × 192
// (one n192 wgmma group; gemm_fp8_tile_exists), K split `splits` ways (the masked grouped layout:
// at most `splits` ways, only the tiles of a last, partial wave), and
// `cluster` CTAs (1 or 2) that compute tiles stacked along M and fetch their shared W tile once,
// multicast to both (a contiguous pair straddling two experts fetches a W tile each).
// block_m = 0 asks for the measured table. `cublaslt`: the table measured cuBLASLt's block-scaled
// FP8 faster for this shape and M (prefill sizes): the DeviceContext launch runs it there, the
// tile shape is the fallback (and what the stream-only launch runs). `stream_k` (dense 128 × 128
// and 128 × 256 tiles, splits 1, needs a GemmWorkspace; the table picks it for o_proj and the dense
// MLP's down projection at M 513-1,024): the whole waves run whole tiles, and the K blocks of the
// tiles left over are dealt out in equal shares of at least kMinStreamKShare blocks, at most one
// per CTA (cluster) of the grid, so that a partial last wave takes its share of the time instead
// of a whole tile's (gemm_stream_k.h).
struct GemmConfig {
    int block_m = 0;
    int block_n = 0;
    int splits = 1;
    int cluster = 1;
    bool cublaslt = false;
    bool stream_k = false;
};

// The FP8 tile kernel's CTA tiles, the one list gemm_fp8_sm90.cu's launch instantiates (for the
// dense layout only where dense_only; each with clusters of 1 and 2).
struct GemmFp8Tile {
    int block_m, block_n;
    bool dense_only;
};
inline constexpr GemmFp8Tile kGemmFp8Tiles[] = {{64, 64, false},   {64, 128, false},  {64, 256, false},
                                                {128, 64, false},  {128, 128, false}, {128, 192, true},
                                                {128, 256, false}, {192, 128, false}};
// Whether the tile kernel is built for block_m × block_n in the dense layout (dense) or in the
// grouped ones, for sweeps and tests to walk; and those tiles as text ("64×64, …"), for errors.
bool gemm_fp8_tile_exists(int block_m, int block_n, bool dense);
std::string gemm_fp8_tile_list(bool dense);
// The dense tiles built with stream-K (GemmConfig::stream_k): the prefill tiles, where a partial
// last wave costs a whole tile's time.
constexpr bool gemm_fp8_stream_k_tile(int block_m, int block_n) {
    return block_m == 128 && (block_n == 128 || block_n == 256);
}

// The contiguous grouped GEMM's default tile (prefill: thousands of rows per rank): 128 × 256 in
// cluster pairs, 8.6-10.8% faster than unpaired at EP8..EP64 with the grouped tile order (PERF.md,
// eleventh session).
inline constexpr GemmConfig kGroupedContiguousConfig{128, 256, 1, 2};

// The measured choice for a dense shape on a GPU with `num_sms` multiprocessors; splits > 1 only
// when `split_k_allowed` (a GemmWorkspace is at hand).
GemmConfig pick_gemm_config(int M, int N, int K, int num_sms, bool split_k_allowed);
// The masked grouped GEMM's tile for `expected_m` tokens per expert of `num_experts`, N × K, on
// `num_sms` multiprocessors (grouped_gemm_cuda.h; the counts themselves are only on the device).
// Its `splits` caps the K splits of a last, partial wave's tiles, the only ones that layout splits
// (only when `split_k_allowed`: a GemmWorkspace is at hand).
inline constexpr int kMaskedTailSplits = 8;
// Splits of at least this many K blocks of 128 (the last of a tile's splits may hold fewer: the
// kernel's plan_tail). A split tile's partials make a round trip through L2 (the last split reads
// the others' 64-128 KB each), which costs about what a short split saves: the down projections'
// 16 K blocks in 4-way splits ran 5-8 µs slower at EP32..EP128, the gate+up's 56 in 2-way splits
// 8-20 µs faster at EP32 and EP64 (PERF.md, twenty-sixth session). Ranges of 8 (the down
// projection split 2 ways) were 2-5 µs faster in the layer and 2 µs faster to 4 µs slower in
// `bench kernels` (twenty-ninth session): not taken on one routing draw per point.
inline constexpr int kMinTailSplitKb = 16;
// Dense stream-K's shares hold at least this many K blocks (gemm_stream_k.h's plan_stream_k), so a
// small remainder does not become one-block shares whose partials cost more than they save. Below
// kMinTailSplitKb so that the shared experts' down projection (16 K blocks), whose last wave at M =
// 1,024 is 0.7 full, can take shares at all; there it then lost (run166: 35.2 against 28.4-28.8
// µs unshared). Not tuned.
inline constexpr int kMinStreamKShare = 8;
// The most rows an expert gets when routing spreads them in [0.7, 1.3] × the expected count: the
// spread of DeepGEMM's anchors, which `bench kernels` and `bench layer` draw (a model, not a
// measurement). pick_grouped_masked_config plans its tiles for it.
constexpr int64_t modelled_most_rows(int64_t expected) { return expected * 13 / 10; }
GemmConfig pick_grouped_masked_config(int expected_m, int num_experts, int N, int K, int num_sms, bool split_k_allowed);
// The order the quantization in front of a dense FP8 GEMM should write x's scales in: M-major where
// the table runs cuBLASLt, row-major where it runs the tile kernel — each kernel's own order, so
// neither needs a transpose. Either order gives the same result; the other one costs a launch.
// (The tile kernel reading M-major scales directly was slower: its scale loader finds row-major
// ones in L1, a 32-byte sector holding a row's scales of 8 K blocks, and M-major ones miss at
// every K block — qkv_a at M = 256: 17.0 against 13.2 µs.)
ScaleOrder gemm_fp8_scale_order(int M, int N, int K, int num_sms);
// The shapes cuBLASLt's block-scaled FP8 can take at all: whole 128-blocks of K in rows of 4 for
// W's scales (K % 512), N a multiple of 8.
constexpr bool gemm_fp8_cublaslt_shape(int N, int K) { return K > 0 && K % 512 == 0 && N > 0 && N % 8 == 0; }

#ifdef FANOUT_WITH_CUDA
class DeviceContext;  // device_context.h

// Device scratch for split-K: f32 partial tiles, one arrival counter per output tile, the ticket
// that hands out a launch's units in the order its CTAs start, and the counter that hands them
// out as CTAs ask (the masked layout's unpaired split kernels). The kernel leaves each at zero,
// so one workspace serves any sequence of GEMMs on one stream (CUDA graphs included); GEMMs
// running concurrently need one workspace each.
class GemmWorkspace {
  public:
    static constexpr size_t kDefaultPartialBytes = size_t{32} << 20;
    static constexpr int kDefaultCounters = 1 << 14;
    static constexpr size_t kDefaultBytes =
        kDefaultPartialBytes + kDefaultCounters * sizeof(int) + 2 * sizeof(unsigned);
    explicit GemmWorkspace(size_t partial_bytes = kDefaultPartialBytes, int num_counters = kDefaultCounters);
    ~GemmWorkspace();
    GemmWorkspace(const GemmWorkspace&) = delete;
    GemmWorkspace& operator=(const GemmWorkspace&) = delete;

    float* partials = nullptr;
    size_t partial_floats = 0;
    int* counters = nullptr;
    int num_counters = 0;
    unsigned* ticket = nullptr;  // after the counters, in their allocation
    unsigned* grab = nullptr;    // after the ticket
};

// y (bf16, uint16_t storage) = x · Wᵀ (+ residual, same shape, may alias y) by the tile kernel, x's
// scales row-major [M, ceil(K/128)]. `cfg` overrides the table (benchmarks); split-K needs
// `workspace`.
void launch_gemm_fp8(const uint8_t* x, const float* sx, const uint8_t* w, const float* sw, uint16_t* y, int M, int N,
                     int K, void* cuda_stream, const uint16_t* residual = nullptr, GemmWorkspace* workspace = nullptr,
                     GemmConfig cfg = {});

// The same on ctx's stream with its split-K workspace, and where the table says so (GemmConfig::
// cublaslt) through cuBLASLt's block-scaled FP8 (gemm_fp8_cublaslt.cc) when that can run it —
// the model's path. x's scales sx are in `sx_order` (fp8_constants.h); each kernel reads its own
// order (cuBLASLt M-major [ceil(K/128), M], the tile kernel row-major), and the other one costs a
// transpose into ctx's scratch first (gemm_fp8_scale_order names the order to write).
void launch_gemm_fp8(DeviceContext& ctx, const uint8_t* x, const float* sx, ScaleOrder sx_order, const uint8_t* w,
                     const float* sw, uint16_t* y, int M, int N, int K, const uint16_t* residual = nullptr);
// cuBLASLt's FP8 GEMM with DeepSeek's scales (x per 1×128, W per 128×128 blocks: VEC128_32F /
// BLK128x128_32F) on ctx's stream. cuBLASLt reads x's scales M-major; row-major ones are first
// transposed into ctx's scale scratch (one more launch, 2–3 µs). Needs K a multiple of 512 (whole
// blocks, and W's scale rows a multiple of 4 blocks as cuBLASLt lays them out), N a multiple of 8,
// x, W, y and the residual on 256-byte boundaries (the heuristic's assumption; W's scales on 16;
// M-major x scales on 16), row-major scales' M × K/128 within the scratch and an algorithm from
// cuBLASLt's heuristic for (M, N, K); returns false without launching when one of these fails. y
// may be the residual (in place).
bool launch_gemm_fp8_cublaslt(DeviceContext& ctx, const uint8_t* x, const float* sx, ScaleOrder sx_order,
                              const uint8_t* w, const float* sw, uint16_t* y, int M, int N, int K,
                              const uint16_t* residual = nullptr);

// The plain SIMT kernel (no tensor cores): any K; the fallback and the baseline. sx row-major.
void launch_gemm_fp8_simt(const uint8_t* x, const float* sx, const uint8_t* w, const float* sw, uint16_t* y, int M,
                          int N, int K, void* cuda_stream);

// BF16 checkpoints: y[M, N] = x[M, K] · W[N, K]ᵀ (+ residual), all bf16, f32 accumulation, through
// cuBLASLt on ctx's stream with its handle, workspace and per-shape plans (device_context.h).
void launch_gemm_bf16(DeviceContext& ctx, const uint16_t* x, const uint16_t* w, uint16_t* y, int M, int N, int K,
                      const uint16_t* residual = nullptr);
// Strided-batched BF16: y[b] = x[b] · W[b]ᵀ for b < batch — x[b] [M, K], W[b] [N, K], y[b] [M, N],
// bf16 with f32 accumulation, each operand with its own row stride (ld*) and batch stride
// (stride_*, elements). The absorbed attention's per-head projections (k_b, v_b) in place: k_b
// reads q_b's output rows as they are, v_b writes o_proj's input [T, H, v]. Through cuBLASLt on
// ctx (its plans cached per shape and strides, made on the first launch — outside a capture).
struct StridedBatchedGemm {
    int batch = 1, M = 0, N = 0, K = 0;
    const uint16_t* x = nullptr;
    int64_t ldx = 0, stride_x = 0;
    const uint16_t* w = nullptr;
    int64_t ldw = 0, stride_w = 0;
    uint16_t* y = nullptr;
    int64_t ldy = 0, stride_y = 0;
};
void launch_gemm_bf16_batched(DeviceContext& ctx, const StridedBatchedGemm& g);
// The same with an f32 result (the MoE router's logits, which the routing compares in f32); a
// few rows of a narrow W go to launch_gemv_bf16_f32 instead of cuBLASLt.
void launch_gemm_bf16_f32(DeviceContext& ctx, const uint16_t* x, const uint16_t* w, float* y, int M, int N, int K);
// y[M, N] f32 = x[M, K] · W[N, K]ᵀ by a CTA per column (gemv_bf16_cuda.cu): M <= kGemvMaxRows,
// N <= kGemvMaxColumns, K a multiple of 8, x and W 16-byte aligned (gemv_bf16_f32_fits). W is a
// weight: the kernel requests its first slice before waiting for the previous kernel (pdl.cuh), so
// no kernel just before it may write W.
constexpr int kGemvMaxRows = 8, kGemvMaxColumns = 4096;
bool gemv_bf16_f32_fits(const uint16_t* x, const uint16_t* w, int M, int N, int K);
void launch_gemv_bf16_f32(const uint16_t* x, const uint16_t* w, float* y, int M, int N, int K, void* cuda_stream);

// The multiprocessor count of the current device (cached).
int device_sm_count();
#endif

}  // namespace fanout::ops

// The tile table of the FP8 GEMM (gemm.h): which block shape and K split each dense shape runs
// with. The rows are the fastest configurations of `fanout bench kernels --sweep` on an H200 (132
// SMs) for DeepSeek-V3's six shapes and its dense layers' MLP (docs/PERF.md has the sweep); other
// shapes take the rule below, which those measurements suggest. Rows marked lt(...) run cuBLASLt's
// block-scaled FP8 where it can (`fanout bench kernels` measured it faster there, its x scales
// M-major as the quantizations then write them: q_b from M = 129 to 256, the dense MLP's gate+up
// from 65 and its down projection from 129, o_proj from 129, the shared gate+up from 257, the
// shared down projection from 129 to 256); their tile is the fallback. Rows re-swept on
// 2026-12-03, the cuBLASLt rows again once x's scales no longer needed a transpose; on 2026-12-04
// the prefill rows of q_b, kv_b and the shared down projection moved back to the tile kernel
// (three runs each), and qkv_a's past M = 1024 to the 128 × 192 tile (PERF.md, "The tile table at
// prefill sizes"); the dense MLP's down projection at M <= 64 to 64 × 64 split 2 once the 64 × 64
// tiles' scale loader looked ahead, and, once split K's last split reduced in place, q_b at M
// 65-128 to the 128 × 192 tile (swept as split 2, which the launch's one-wave cap runs unsplit: 256
// units against 132 CTAs) and the shared gate+up at M 129-256 to 128 × 128 split 2 (PERF.md,
// nineteenth and twenty-first sessions); the dense MLP's down projection at M 65-128 to its 64 ×
// 128 split-2 pair tile, which beat cuBLASLt there in each of the six kept `bench kernels` tables
// of run121-run140 (52.1-53.6 against 57.5-60.0 µs on H100s, 42.4 against 45.8 on an H200;
// PERF.md, thirty-first session); o_proj and the dense MLP's down projection at M 513-1,024 to
// 128 × 256 pairs with stream-K (run166, H100, M = 1,024, three samples each: o_proj 189.3-189.4
// against cuBLASLt's 193.5-194.2 µs, the down projection 212.0-212.2 against 217.5-217.7; measured
// at 1,024 only, 513 the bound a guess; the shared down projection lost there, 35.2 against 28.4-28.8).
#include <algorithm>
#include <array>
#include <cstdint>
#include <iterator>
#include <string>

#include "fanout/ops/fp8_quant.h"
#include "fanout/ops/gemm.h"

namespace fanout::ops {
namespace {

struct Row {
    int n, k, max_m;  // this row serves shape (n, k) for M <= max_m
    GemmConfig config;
};

constexpr GemmConfig lt(GemmConfig c) {
    c.cublaslt = true;
    return c;
}

constexpr GemmConfig sk(GemmConfig c) {
    c.stream_k = true;
    return c;
}

// clang-format off
constexpr std::array kTable = {
    // fused qkv_a 2112 × 7168
    Row{2112, 7168, 64, {64, 64, 4, 1}},      Row{2112, 7168, 128, {64, 64, 2, 1}},
    Row{2112, 7168, 256, {64, 64, 1, 1}},     Row{2112, 7168, 1024, {192, 128, 1, 1}},
    Row{2112, 7168, 1 << 30, {128, 192, 1, 1}},
    // q_b 24576 × 1536
    Row{24576, 1536, 64, {64, 128, 1, 1}},    Row{24576, 1536, 128, {128, 192, 1, 1}},
    Row{24576, 1536, 256, lt({128, 128, 1, 1})}, Row{24576, 1536, 1 << 30, {128, 256, 1, 2}},
    // kv_b 32768 × 512
    Row{32768, 512, 64, {64, 64, 1, 1}},      Row{32768, 512, 256, {128, 128, 1, 1}},
    Row{32768, 512, 1 << 30, {128, 256, 1, 2}},
    // o_proj 7168 × 16384
    Row{7168, 16384, 64, {64, 64, 2, 1}},     Row{7168, 16384, 128, {64, 128, 2, 2}},
    Row{7168, 16384, 256, lt({128, 256, 2, 2})}, Row{7168, 16384, 512, lt({128, 256, 1, 2})},
    Row{7168, 16384, 1024, sk({128, 256, 1, 2})}, Row{7168, 16384, 1 << 30, lt({128, 256, 1, 2})},
    // shared experts' gate+up 4096 × 7168
    Row{4096, 7168, 64, {64, 64, 4, 1}},      Row{4096, 7168, 128, {64, 64, 2, 2}},
    Row{4096, 7168, 256, {128, 128, 2, 1}}, Row{4096, 7168, 1 << 30, lt({128, 256, 1, 2})},
    // shared experts' down 7168 × 2048
    Row{7168, 2048, 64, {64, 64, 1, 1}},      Row{7168, 2048, 128, {64, 64, 1, 1}},
    Row{7168, 2048, 256, lt({128, 128, 1, 1})}, Row{7168, 2048, 1024, {128, 256, 1, 1}},
    Row{7168, 2048, 1 << 30, {128, 256, 1, 2}},
    // the dense layers' MLP gate+up 36864 × 7168 (intermediate 18432; sweep of 2026-12-02)
    Row{36864, 7168, 64, {64, 64, 1, 1}},     Row{36864, 7168, 128, lt({64, 128, 1, 2})},
    Row{36864, 7168, 256, lt({128, 128, 1, 1})}, Row{36864, 7168, 1 << 30, lt({128, 256, 1, 2})},
    // the dense layers' MLP down 7168 × 18432
    Row{7168, 18432, 64, {64, 64, 2, 1}},     Row{7168, 18432, 128, {64, 128, 2, 2}},
    Row{7168, 18432, 256, lt({128, 256, 2, 2})}, Row{7168, 18432, 512, lt({128, 256, 1, 2})},
    Row{7168, 18432, 1024, sk({128, 256, 1, 2})}, Row{7168, 18432, 1 << 30, lt({128, 256, 1, 2})},
};
// clang-format on

}  // namespace

GemmConfig pick_gemm_config(int M, int N, int K, int num_sms, bool split_k_allowed) {
    for (const Row& r : kTable)
        if (r.n == N && r.k == K && M <= r.max_m) {
            GemmConfig c = r.config;
            if (!split_k_allowed) c.splits = 1, c.stream_k = false;
            return c;
        }
    // Elsewhere: 64-row tiles only when M fits one; the widest N tile that still gives every
    // multiprocessor a tile (wider tiles fetch fewer bytes per FLOP); pairs of CTAs sharing
    // their W tile from M = 1024 on; and split K while that leaves the GPU under-filled and each
    // split at least 4 K blocks. Past M = 256, cuBLASLt where it can (as for the table's shapes).
    GemmConfig c;
    c.cublaslt = M > 256;
    c.block_m = M <= 64 ? 64 : 128;
    c.cluster = M >= 1024 ? 2 : 1;
    const int m_blocks = (M + c.block_m - 1) / c.block_m, nkb = (K + 127) / 128;
    c.block_n = 64;
    for (int bn : {256, 128})
        if (m_blocks * ((N + bn - 1) / bn) >= num_sms) {
            c.block_n = bn;
            break;
        }
    const int tiles = m_blocks * ((N + c.block_n - 1) / c.block_n);
    if (split_k_allowed)
        while (tiles * c.splits * 2 <= num_sms && nkb / (c.splits + 1) >= 4) ++c.splits;
    return c;
}

// The masked tile for `expected_m` tokens per expert. Routing spreads an expert's rows about the
// expected count, so the rule plans for the most an expert gets under the spread the benchmarks
// draw ([0.7, 1.3] × expected: DeepGEMM's anchors' spread, a model, not a measurement):
// * while 128 rows hold the most (up to 99 tokens): 128 × 256 (memory-bound, W read once);
// * while one 192-row block holds it (100-148 tokens), and from 100 tokens on wherever K is too
//   shallow to split (the down projection's 2,048): 192 × 128;
// * while a pair of 192-row blocks holds it (149-296 tokens), the experts' pairs (one per column
//   tile) fit one wave of the grid's pairs and 128 × 128 tiles for it would not: 192 × 128 in
//   pairs (EP128 at batch 32);
// * past that, a K deep enough for two ranges of kMinTailSplitKb blocks (the gate+up's 7,168) with
//   a workspace takes 128 × 256 with its last wave split in K (gemm_fp8_sm90.cu) where those tiles
//   fill at least one wave, from 1,024 tokens (eight or more row blocks) in cluster pairs that
//   multicast their W tile; otherwise 128 × 128, in pairs from 1,024 tokens.
// Measured (docs/PERF.md):
// * 192 × 128 pairs in the thirtieth session (run141, H100, the layer alternating three times):
//   EP128's gate+up at batch 32 (2 experts, 256 tokens each: 64 pairs on the H100's 66) 42.9-43.8
//   µs against 62.6-63.9 on 128 × 128, whose tiles the spread pushes past one wave (the layer's
//   counts 254 and 258: 160 tiles on 132 SMs; with counts at the mean, two 128-row blocks an
//   expert, it was 37 µs, below). At EP32 batch 128 (8 experts: 256 pairs, about four waves) they
//   lost, 151.8-154.8 against 144.2-144.6, though `bench kernels --draws 4` had them 2.5 µs ahead
//   on average there. Where 128 × 128 tiles fit one wave as well (EP256 at batch 16: one expert,
//   96 tiles) they stay: the rule takes the pairs only where they were measured to win.
// * 192 × 128 in the twenty-ninth session (run137, H100, batch 128, the layer's experts given
//   spread counts; `bench kernels`, each timing from an idle pause, agreed): EP16 gate+up 190-191
//   against 202-203 µs in the layer, down 104-105 against 111-112; EP64 down 72.5-74.6 against
//   74.3-76.5; EP32 and EP128 down level within 1 µs.
// * The split in the twenty-sixth: fewer tiles leave the last wave emptier and its split pays
//   (EP32 and EP64 gate+up at batch 128 on an H100: 116 and 109 µs in the layer against 126 and
//   117, counts then at the mean); under one wave the 128-wide tiles' twice as many fill the GPU
//   better than a split of all of them (EP128 at batch 32 with counts at the mean: 37 against 43
//   µs), and without a workspace the 256-wide tiles would run unsplit.
// * Pairs in the twenty-fifth and twenty-eighth: EP128's two GEMMs 197 against 208 µs (H200), its
//   gate+up 103-108 against 115 µs in the layer (H100); at EP64 pairs lose, an odd last row block
//   leaving a pair half empty.
GemmConfig pick_grouped_masked_config(int expected_m, int num_experts, int N, int K, int num_sms,
                                      bool split_k_allowed) {
    const int64_t most = modelled_most_rows(expected_m);
    if (most <= 128) return {128, 256, 1, 1};
    const bool deep = ceil_div(K, kFp8Block) >= 2 * kMinTailSplitKb, split = split_k_allowed && deep;
    if (!deep || most <= 192) return {192, 128, 1, 1};
    // One 192 × 128 pair per expert and column tile holds the most, those pairs fit one wave, and
    // 128 × 128 tiles for the most would not.
    const int64_t column_tiles = int64_t{num_experts} * ceil_div(N, 128);
    if (most <= 2 * 192 && column_tiles <= num_sms / 2 && column_tiles * ceil_div(most, 128) > num_sms)
        return {192, 128, 1, 2};
    const int64_t wide_tiles = int64_t{num_experts} * ceil_div(expected_m, 128) * ceil_div(N, 256);
    const bool wide_split = split && wide_tiles >= num_sms;
    if (expected_m >= 1024) return wide_split ? GemmConfig{128, 256, kMaskedTailSplits, 2} : GemmConfig{128, 128, 1, 2};
    if (wide_split) return {128, 256, kMaskedTailSplits, 1};
    return {128, 128, 1, 1};
}

bool gemm_fp8_tile_exists(int block_m, int block_n, bool dense) {
    return std::any_of(std::begin(kGemmFp8Tiles), std::end(kGemmFp8Tiles), [&](const GemmFp8Tile& t) {
        return t.block_m == block_m && t.block_n == block_n && (dense || !t.dense_only);
    });
}

std::string gemm_fp8_tile_list(bool dense) {
    std::string s;
    for (const GemmFp8Tile& t : kGemmFp8Tiles)
        if (dense || !t.dense_only)
            s += (s.empty() ? "" : ", ") + std::to_string(t.block_m) + "×" + std::to_string(t.block_n);
    return s;
}

ScaleOrder gemm_fp8_scale_order(int M, int N, int K, int num_sms) {
    return gemm_fp8_cublaslt_shape(N, K) && pick_gemm_config(M, N, K, num_sms, true).cublaslt ? ScaleOrder::kMMajor
                                                                                              : ScaleOrder::kRowMajor;
}

}  // namespace fanout::ops

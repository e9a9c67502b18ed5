// The FP8 GEMM's tile table (pick_gemm_config): the measured rows come back for DeepSeek-V3's
// shapes, split-K only when a workspace exists, and every other shape gets a configuration the
// kernel has (so a model with other widths never asks for a tile that does not exist).
#include <gtest/gtest.h>

#include <random>
#include <tuple>
#include <utility>

#include "fanout/ops/gemm.h"
#include "fanout/ops/gemm_stream_k.h"

namespace fanout::ops {
namespace {

bool same(const GemmConfig& a, const GemmConfig& b) {
    return a.block_m == b.block_m && a.block_n == b.block_n && a.splits == b.splits && a.cluster == b.cluster;
}

TEST(GemmConfig, MeasuredRowsForTheV3Shapes) {
    EXPECT_TRUE(same(pick_gemm_config(64, 7168, 16384, 132, true), {64, 64, 2, 1}));      // o_proj, decode
    EXPECT_TRUE(same(pick_gemm_config(4096, 7168, 16384, 132, true), {128, 256, 1, 2}));  // o_proj, prefill
    EXPECT_TRUE(same(pick_gemm_config(33, 2112, 7168, 132, true), {64, 64, 4, 1}));       // qkv_a, M <= 64
    EXPECT_TRUE(same(pick_gemm_config(65, 2112, 7168, 132, true), {64, 64, 2, 1}));       // qkv_a, M <= 128
    EXPECT_TRUE(same(pick_gemm_config(256, 36864, 7168, 132, true), {128, 128, 1, 1}));   // dense MLP gate+up
    EXPECT_TRUE(same(pick_gemm_config(256, 7168, 18432, 132, true), {128, 256, 2, 2}));   // dense MLP down
    for (int M : {65, 128}) {  // ... the tile, not cuBLASLt, up to M = 128
        const GemmConfig c = pick_gemm_config(M, 7168, 18432, 132, true);
        EXPECT_TRUE(same(c, {64, 128, 2, 2}) && !c.cublaslt) << M;
    }
    EXPECT_TRUE(pick_gemm_config(129, 7168, 18432, 132, true).cublaslt);
    EXPECT_TRUE(same(pick_gemm_config(256, 7168, 18432, 132, false), {128, 256, 1, 2}));  // ... no workspace
}

// Stream-K where run166 measured it ahead of cuBLASLt: o_proj and the dense MLP's down projection
// at M 513-1,024 in 128 × 256 pairs; cuBLASLt on either side; without a workspace the pairs unshared.
TEST(GemmConfig, StreamKForTheLastWaveOfTheWideProjections) {
    for (auto [N, K] : {std::pair{7168, 16384}, {7168, 18432}}) {
        for (int M : {513, 1024}) {
            const GemmConfig c = pick_gemm_config(M, N, K, 132, true);
            EXPECT_TRUE(same(c, {128, 256, 1, 2}) && c.stream_k && !c.cublaslt) << M << " " << K;
            EXPECT_FALSE(pick_gemm_config(M, N, K, 132, false).stream_k) << M << " " << K;
        }
        for (int M : {512, 1025}) {
            const GemmConfig c = pick_gemm_config(M, N, K, 132, true);
            EXPECT_TRUE(c.cublaslt && !c.stream_k) << M << " " << K;
        }
    }
    EXPECT_FALSE(pick_gemm_config(1024, 7168, 2048, 132, true).stream_k);  // the shared down projection lost
}

#ifdef FANOUT_WITH_CUDA
// Every stream-K launch the table asks for fits the model's default workspace (the launch refuses
// one that does not) on any Hopper grid: up to 66 pairs of CTAs (132 SMs; the H100 PCIe's 114 give
// 57), whatever M, for every V3 shape.
TEST(GemmConfig, TheTablesStreamKFitsTheDefaultWorkspace) {
    const std::pair<int, int> v3[] = {{2112, 7168}, {24576, 1536}, {32768, 512},  {7168, 16384},
                                      {4096, 7168}, {7168, 2048},  {36864, 7168}, {7168, 18432}};
    int checked = 0;
    for (const auto& [N, K] : v3)
        for (int M = 1; M <= 4096; ++M) {
            const GemmConfig c = pick_gemm_config(M, N, K, 132, true);
            if (!c.stream_k) continue;
            const int units =
                ((M + c.block_m - 1) / c.block_m + c.cluster - 1) / c.cluster * ((N + c.block_n - 1) / c.block_n);
            for (int ctas = 1; ctas <= 132 / c.cluster; ++ctas) {
                const StreamKPlan p = plan_stream_k(units, ctas, (K + 127) / 128, kMinStreamKShare);
                const size_t floats = size_t(p.tiles) * c.cluster * p.slots * c.block_m * c.block_n;
                ASSERT_LE(floats * sizeof(float), GemmWorkspace::kDefaultPartialBytes)
                    << M << " " << N << " " << K << " on " << ctas;
                ASSERT_LE(p.tiles * c.cluster, GemmWorkspace::kDefaultCounters)
                    << M << " " << N << " " << K << " on " << ctas;
                ++checked;
            }
        }
    EXPECT_GT(checked, 0);
}
#endif

// cuBLASLt's block-scaled FP8 at prefill sizes where `fanout bench kernels` measured it faster,
// the tile kernel at decode sizes and on the prefill rows where it won (q_b, kv_b, shared down).
TEST(GemmConfig, CublasLtAtPrefillSizesOnly) {
    EXPECT_TRUE(pick_gemm_config(4096, 7168, 16384, 132, true).cublaslt);   // o_proj
    EXPECT_FALSE(pick_gemm_config(4096, 24576, 1536, 132, true).cublaslt);  // q_b
    EXPECT_FALSE(pick_gemm_config(1024, 24576, 1536, 132, true).cublaslt);
    EXPECT_TRUE(pick_gemm_config(256, 24576, 1536, 132, true).cublaslt);
    EXPECT_TRUE(pick_gemm_config(200, 7168, 16384, 132, true).cublaslt);  // o_proj from 129
    EXPECT_FALSE(pick_gemm_config(128, 7168, 16384, 132, true).cublaslt);
    for (int M : {1, 64, 128, 256}) {
        EXPECT_FALSE(pick_gemm_config(M, 2112, 7168, 132, true).cublaslt) << M;  // qkv_a
        EXPECT_FALSE(pick_gemm_config(M, 384, 512, 132, true).cublaslt) << M;    // the rule
    }
    for (int M : {1, 64, 128}) EXPECT_FALSE(pick_gemm_config(M, 7168, 2048, 132, true).cublaslt) << M;  // shared down
    for (int M : {1, 64, 128, 256}) EXPECT_FALSE(pick_gemm_config(M, 4096, 7168, 132, true).cublaslt) << M;  // gate+up
    EXPECT_TRUE(pick_gemm_config(257, 4096, 7168, 132, true).cublaslt);
    EXPECT_TRUE(pick_gemm_config(256, 7168, 2048, 132, true).cublaslt);  // shared down: 129 to 256 only
    EXPECT_FALSE(pick_gemm_config(1024, 7168, 2048, 132, true).cublaslt);
    EXPECT_FALSE(pick_gemm_config(4096, 7168, 2048, 132, true).cublaslt);
    EXPECT_FALSE(pick_gemm_config(64, 24576, 1536, 132, true).cublaslt);  // q_b from M = 129
    EXPECT_TRUE(same(pick_gemm_config(65, 24576, 1536, 132, true), {128, 192, 1, 1}));
    EXPECT_TRUE(pick_gemm_config(129, 24576, 1536, 132, true).cublaslt);
    EXPECT_TRUE(pick_gemm_config(600, 384, 512, 132, true).cublaslt);  // the rule, past M = 256
    // The tile kernel beats cuBLASLt on qkv_a and kv_b at every M; qkv_a past 1024 in 128 × 192 tiles.
    EXPECT_FALSE(pick_gemm_config(1024, 2112, 7168, 132, true).cublaslt);
    EXPECT_TRUE(same(pick_gemm_config(1025, 2112, 7168, 132, true), {128, 192, 1, 1}));
    for (int M : {1, 256, 1024, 4096, 100000}) EXPECT_FALSE(pick_gemm_config(M, 32768, 512, 132, true).cublaslt) << M;
}

// The quantization in front of a dense GEMM writes M-major scales exactly where cuBLASLt will
// read them: where the table runs it and the shape is one cuBLASLt takes.
TEST(GemmConfig, ScaleOrderFollowsTheKernelThatReadsIt) {
    for (auto [M, N, K] : {std::tuple{64, 7168, 16384},
                           {4096, 7168, 16384},
                           {65, 24576, 1536},
                           {64, 24576, 1536},
                           {256, 2112, 7168},
                           {600, 384, 512},
                           {7, 384, 512}}) {
        const bool lt = pick_gemm_config(M, N, K, 132, true).cublaslt;
        EXPECT_EQ(gemm_fp8_scale_order(M, N, K, 132), lt ? ScaleOrder::kMMajor : ScaleOrder::kRowMajor)
            << M << " " << N << " " << K;
    }
    EXPECT_EQ(gemm_fp8_scale_order(4096, 7168, 16384, 132), ScaleOrder::kMMajor);
    EXPECT_EQ(gemm_fp8_scale_order(64, 7168, 16384, 132), ScaleOrder::kRowMajor);
    // K not a multiple of 512 or N not of 8: cuBLASLt cannot run it, so the tile kernel's order.
    EXPECT_TRUE(pick_gemm_config(4096, 384, 640, 132, true).cublaslt);
    EXPECT_EQ(gemm_fp8_scale_order(4096, 384, 640, 132), ScaleOrder::kRowMajor);
    EXPECT_EQ(gemm_fp8_scale_order(4096, 388, 512, 132), ScaleOrder::kRowMajor);
}

TEST(GemmConfig, NoSplitWithoutAWorkspace) {
    EXPECT_EQ(pick_gemm_config(64, 2112, 7168, 132, false).splits, 1);
    EXPECT_EQ(pick_gemm_config(3, 100, 4096, 132, false).splits, 1);
    EXPECT_GT(pick_gemm_config(3, 100, 4096, 132, true).splits, 1);  // 1 tile on 132 SMs: split K
}

TEST(GemmConfig, EveryShapeGetsAKernelThatExists) {
    std::mt19937 rng(5);
    for (int i = 0; i < 2000; ++i) {
        const int M = 1 + int(rng() % 9000), N = 1 + int(rng() % 40000), K = 16 * (1 + int(rng() % 1200));
        const int sms = 1 + int(rng() % 200);
        const GemmConfig c = pick_gemm_config(M, N, K, sms, rng() % 2 == 0);
        EXPECT_TRUE(c.block_m == 64 || c.block_m == 128) << M << " " << N << " " << K;
        EXPECT_TRUE(c.block_n == 64 || c.block_n == 128 || c.block_n == 256) << M << " " << N << " " << K;
        EXPECT_TRUE(c.cluster == 1 || c.cluster == 2);
        EXPECT_GE(c.splits, 1);
        EXPECT_LE(c.splits, (K + 127) / 128) << "more splits than K blocks";
    }
}

// The tile shapes the FP8 kernel is built for, and every row of the table among them.
TEST(GemmConfig, TheTableNamesOnlyTilesThatExist) {
    for (int bm : {64, 128})
        for (int bn : {64, 128, 256}) EXPECT_TRUE(gemm_fp8_tile_exists(bm, bn, false)) << bm << "x" << bn;
    EXPECT_TRUE(gemm_fp8_tile_exists(192, 128, false));
    EXPECT_TRUE(gemm_fp8_tile_exists(128, 192, true));
    EXPECT_FALSE(gemm_fp8_tile_exists(128, 192, false));  // the n192 tile is dense only
    EXPECT_FALSE(gemm_fp8_tile_exists(64, 192, true));
    EXPECT_FALSE(gemm_fp8_tile_exists(192, 256, true));
    EXPECT_FALSE(gemm_fp8_tile_exists(256, 128, true));
    EXPECT_FALSE(gemm_fp8_tile_exists(0, 0, true));
    // The launch's error names the tiles there are, for the layout asked for.
    EXPECT_EQ(gemm_fp8_tile_list(true), "64×64, 64×128, 64×256, 128×64, 128×128, 128×192, 128×256, 192×128");
    EXPECT_EQ(gemm_fp8_tile_list(false), "64×64, 64×128, 64×256, 128×64, 128×128, 128×256, 192×128");
    // The contiguous default: a grouped tile, inside one 128-row expert block, unsplit.
    EXPECT_TRUE(gemm_fp8_tile_exists(kGroupedContiguousConfig.block_m, kGroupedContiguousConfig.block_n, false));
    EXPECT_LE(kGroupedContiguousConfig.block_m, 128);
    EXPECT_EQ(kGroupedContiguousConfig.splits, 1);
    const std::pair<int, int> v3[] = {{2112, 7168}, {24576, 1536}, {32768, 512},  {7168, 16384},
                                      {4096, 7168}, {7168, 2048},  {36864, 7168}, {7168, 18432}};
    for (const auto& [N, K] : v3)
        for (int M : {1, 64, 65, 128, 129, 256, 257, 1024, 1025, 4096})
            for (bool ws : {false, true}) {
                const GemmConfig c = pick_gemm_config(M, N, K, 132, ws);
                EXPECT_TRUE(gemm_fp8_tile_exists(c.block_m, c.block_n, true)) << M << " " << N << " " << K;
                EXPECT_TRUE(!c.stream_k || (ws && c.splits == 1 && gemm_fp8_stream_k_tile(c.block_m, c.block_n)))
                    << M << " " << N << " " << K;
            }
}

constexpr int kSms = 132;

// The masked grouped GEMM's default at the seed's decode points (V3's 256 experts over EP ranks,
// top-8, the gate+up [4096, 7168] and down [7168, 2048] on 132 SMs): 256-wide tiles up to 99 tokens
// per expert; 192-row tiles from 100 tokens while one 192-row block holds the spread (up to 148),
// and for the down projection (too shallow to split) from 100 on; past 148 the gate+up on 192-row
// tiles in pairs while a pair holds the spread (up to 296) and the pairs fit one wave where
// 128-wide tiles would not, else 128-wide — or, where the 256-wide tiles fill a wave and a
// workspace is at hand, 256-wide with the last wave split in K; its pairs in clusters from 1,024
// tokens on; and always a tile the grouped layouts are built for.
TEST(GemmConfig, MaskedGroupedTilesFollowTheExpectedTokens) {
    const auto is = [](GemmConfig c, int bm, int bn, int splits, int cluster) {
        return c.block_m == bm && c.block_n == bn && c.splits == splits && c.cluster == cluster && !c.cublaslt;
    };
    constexpr int kDeep = 2 * kMinTailSplitKb * 128;
    // Tokens per expert at batch (requests × 2 query tokens) on EP ranks, and the local experts;
    // with a workspace unless `ws` is false.
    const auto at = [](int ep, int batch, int N, int K, int sms = kSms, bool ws = true) {
        return pick_grouped_masked_config(batch * 2 * 8 * ep / 256, 256 / ep, N, K, sms, ws);
    };
    // Routing spreads an expert's rows over [0.7, 1.3] × the expected count: 256-wide tiles while
    // 128 rows hold the most (64 tokens: 83), 192-row tiles while one such block holds them
    // (128 tokens: 166), and the down projection (too shallow to split) on 192-row tiles from then
    // on.
    for (auto [N, K] : {std::pair{4096, 7168}, {7168, 2048}}) {
        SCOPED_TRACE(K);
        EXPECT_TRUE(is(at(8, 128, N, K), 128, 256, 1, 1));   // 64 tokens
        EXPECT_TRUE(is(at(16, 128, N, K), 192, 128, 1, 1));  // 128
    }
    EXPECT_TRUE(is(pick_grouped_masked_config(99, 8, 4096, 7168, kSms, true), 128, 256, 1, 1));   // 128 at most
    EXPECT_TRUE(is(pick_grouped_masked_config(100, 8, 4096, 7168, kSms, true), 192, 128, 1, 1));  // 130
    EXPECT_TRUE(is(pick_grouped_masked_config(148, 8, 4096, 7168, kSms, true), 192, 128, 1, 1));  // 192
    EXPECT_TRUE(is(pick_grouped_masked_config(149, 8, 4096, 7168, kSms, true), 128, 256, kMaskedTailSplits, 1));
    for (int ep : {32, 64, 128, 256}) EXPECT_TRUE(is(at(ep, 128, 7168, 2048), 192, 128, 1, 1));
    // From 1,024 tokens the gate+up in pairs: 256-wide with its last wave split, 128-wide without a
    // workspace.
    for (int ep : {128, 256}) {  // 1,024 and 2,048 tokens
        EXPECT_TRUE(is(at(ep, 128, 4096, 7168), 128, 256, kMaskedTailSplits, 2));
        EXPECT_TRUE(is(at(ep, 128, 4096, 7168, kSms, false), 128, 128, 1, 2));
    }
    // Between: the gate+up where 256-wide tiles fill a wave, split.
    EXPECT_TRUE(is(at(32, 128, 4096, 7168), 128, 256, kMaskedTailSplits, 1));  // 8 experts × 2 × 16 tiles
    EXPECT_TRUE(is(at(64, 128, 4096, 7168), 128, 256, kMaskedTailSplits, 1));  // 4 × 4 × 16
    // 149-296 tokens whose pairs of 192-row blocks fit one wave of pairs (66 on 132 SMs) where
    // 128 × 128 tiles for the most rows would not: 192 × 128 in pairs, with or without a workspace.
    EXPECT_TRUE(is(at(128, 32, 4096, 7168), 192, 128, 1, 2));  // 2 experts × 32 pairs; 3 × 64 tiles
    EXPECT_TRUE(is(at(128, 32, 4096, 7168, kSms, false), 192, 128, 1, 2));
    EXPECT_TRUE(is(pick_grouped_masked_config(200, 2, 128 * 33, 7168, kSms, true), 192, 128, 1, 2));  // 66 pairs
    EXPECT_TRUE(is(pick_grouped_masked_config(200, 2, 128 * 33 + 1, 7168, kSms, true), 128, 128, 1, 1));
    EXPECT_TRUE(is(pick_grouped_masked_config(296, 2, 4096, 7168, kSms, true), 192, 128, 1, 2));  // 384 at most
    EXPECT_TRUE(is(pick_grouped_masked_config(297, 2, 4096, 7168, kSms, true), 128, 128, 1, 1));  // 386
    EXPECT_TRUE(is(pick_grouped_masked_config(200, 2, 4096, 2048, kSms, true), 192, 128, 1, 1));  // shallow K
    // Where 128 × 128 tiles fit one wave too they stay: 2 × 2 × 32 = 128 tiles for 193 rows at most
    // (149 tokens), 1 × 3 × 32 = 96 at EP256, batch 16.
    EXPECT_TRUE(is(pick_grouped_masked_config(149, 2, 4096, 7168, kSms, true), 128, 128, 1, 1));
    EXPECT_TRUE(is(pick_grouped_masked_config(197, 2, 4096, 7168, kSms, true), 128, 128, 1, 1));  // 256 at most
    EXPECT_TRUE(is(pick_grouped_masked_config(198, 2, 4096, 7168, kSms, true), 192, 128, 1, 2));  // 257
    EXPECT_TRUE(is(at(256, 16, 4096, 7168), 128, 128, 1, 1));
    EXPECT_TRUE(is(at(128, 32, 4096, 7168, 64), 128, 256, kMaskedTailSplits, 1));  // a wave on 64 SMs
    EXPECT_TRUE(is(at(32, 128, 4096, 7168, kSms, false), 128, 128, 1, 1));         // no workspace
    // The thresholds: K of two minimal splits (in whole 128-blocks: one element past the last one
    // counts), and a wave of 256-wide tiles (200 tokens: 2 row blocks; N of 66 or 65 column tiles).
    EXPECT_TRUE(is(pick_grouped_masked_config(200, 1, 256 * 66, kDeep, kSms, true), 128, 256, kMaskedTailSplits, 1));
    EXPECT_TRUE(
        is(pick_grouped_masked_config(200, 1, 256 * 66, kDeep - 128 + 16, kSms, true), 128, 256, kMaskedTailSplits, 1));
    EXPECT_TRUE(is(pick_grouped_masked_config(200, 1, 256 * 66, kDeep - 128, kSms, true), 192, 128, 1, 1));
    EXPECT_TRUE(is(pick_grouped_masked_config(200, 1, 256 * 65, kDeep, kSms, true), 128, 128, 1, 1));
    EXPECT_TRUE(is(pick_grouped_masked_config(1023, 1, 256 * kSms, kDeep, kSms, true), 128, 256, kMaskedTailSplits, 1));
    // From 1,024 tokens the same: a wave of 256-wide tiles (8 row blocks × 17 or 16 column tiles)
    // and a K deep enough, or 128-wide pairs.
    EXPECT_TRUE(is(pick_grouped_masked_config(1024, 1, 256 * 17, kDeep, kSms, true), 128, 256, kMaskedTailSplits, 2));
    EXPECT_TRUE(is(pick_grouped_masked_config(1024, 1, 256 * 16, kDeep, kSms, true), 128, 128, 1, 2));
    EXPECT_TRUE(is(pick_grouped_masked_config(1024, 1, 256 * 17, kDeep - 128, kSms, true), 192, 128, 1, 1));
    for (int m : {0, 1, 129, 1 << 20})
        for (int K : {16, 2048, 7168})
            for (bool ws : {false, true}) {
                const GemmConfig c = pick_grouped_masked_config(m, 8, 4096, K, kSms, ws);
                EXPECT_TRUE(gemm_fp8_tile_exists(c.block_m, c.block_n, false)) << m << " " << K;
                EXPECT_TRUE(ws || c.splits == 1) << m << " " << K;
            }
}

}  // namespace
}  // namespace fanout::ops

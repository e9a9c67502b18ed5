// The FP8 GEMM's tile table (pick_gemm_config): the measured rows come back for DeepSeek-V3's
// shapes, split-K only when a workspace exists, and every other shape gets a configuration the
// kernel has (so a model with other widths never asks for a tile that does not exist).
#include <gtest/gtest.h>

#include <random>
#include <tuple>
#include <utility>

#include "fanout/ops/gemm.h"

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
    EXPECT_TRUE(same(pick_gemm_config(256, 7168, 18432, 132, false), {128, 256, 1, 2}));  // ... no workspace
}

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
    const std::pair<int, int> v3[] = {{2112, 7168}, {24576, 1536}, {32768, 512},  {7168, 16384},
                                      {4096, 7168}, {7168, 2048},  {36864, 7168}, {7168, 18432}};
    for (const auto& [N, K] : v3)
        for (int M : {1, 64, 65, 128, 129, 256, 257, 1024, 1025, 4096})
            for (bool ws : {false, true}) {
                const GemmConfig c = pick_gemm_config(M, N, K, 132, ws);
                EXPECT_TRUE(gemm_fp8_tile_exists(c.block_m, c.block_n, true)) << M << " " << N << " " << K;
            }
}

// The masked grouped GEMM's default at the seed's decode points (expected tokens per expert at
// batch 128 × query 2, top-8 of 256): 256-wide tiles at EP8/EP16, 128-wide at EP32/EP64, pairs in
// clusters from EP128 on, and always a tile the grouped layouts are built for.
TEST(GemmConfig, MaskedGroupedTilesFollowTheExpectedTokens) {
    const auto is = [](GemmConfig c, int bm, int bn, int cluster) {
        return c.block_m == bm && c.block_n == bn && c.splits == 1 && c.cluster == cluster && !c.cublaslt;
    };
    EXPECT_TRUE(is(pick_grouped_masked_config(64), 128, 256, 1));    // EP8
    EXPECT_TRUE(is(pick_grouped_masked_config(128), 128, 256, 1));   // EP16
    EXPECT_TRUE(is(pick_grouped_masked_config(129), 128, 128, 1));   // just over
    EXPECT_TRUE(is(pick_grouped_masked_config(256), 128, 128, 1));   // EP32
    EXPECT_TRUE(is(pick_grouped_masked_config(512), 128, 128, 1));   // EP64
    EXPECT_TRUE(is(pick_grouped_masked_config(1023), 128, 128, 1));  // just under
    EXPECT_TRUE(is(pick_grouped_masked_config(1024), 128, 128, 2));  // EP128
    EXPECT_TRUE(is(pick_grouped_masked_config(2048), 128, 128, 2));  // EP256
    for (int m : {0, 1, 129, 1 << 20}) {
        const GemmConfig c = pick_grouped_masked_config(m);
        EXPECT_TRUE(gemm_fp8_tile_exists(c.block_m, c.block_n, false)) << m;
    }
}

}  // namespace
}  // namespace fanout::ops

// `fanout bench kernels --config`: the tile configuration's text form, and the errors that name a
// malformed one.
#include <gtest/gtest.h>

#include <array>
#include <numeric>
#include <string>
#include <vector>

#include "kernels_bench.h"
#include "test_util.h"

namespace fanout::bench {
namespace {

TEST(KernelsBenchConfig, ParsesSplitsAndClusters) {
    const ops::GemmConfig a = parse_gemm_config("128x256/1c2");
    EXPECT_EQ(a.block_m, 128);
    EXPECT_EQ(a.block_n, 256);
    EXPECT_EQ(a.splits, 1);
    EXPECT_EQ(a.cluster, 2);
    const ops::GemmConfig b = parse_gemm_config("64x64/4");
    EXPECT_EQ(b.block_m, 64);
    EXPECT_EQ(b.splits, 4);
    EXPECT_EQ(b.cluster, 1);
    EXPECT_FALSE(b.stream_k);
    const ops::GemmConfig c = parse_gemm_config("128x256/skc2");
    EXPECT_TRUE(c.stream_k);
    EXPECT_EQ(c.splits, 1);
    EXPECT_EQ(c.cluster, 2);
    const ops::GemmConfig d = parse_gemm_config("64x128/sk");
    EXPECT_TRUE(d.stream_k);
    EXPECT_EQ(d.block_n, 128);
    EXPECT_EQ(d.cluster, 1);
}

TEST(KernelsBenchConfig, MalformedConfigsAreErrorsThatShowTheForm) {
    for (const char* bad :
         {"", "128", "128x256", "128x256/", "128x256/0", "128x256/-2", "128x256/s", "128x256/1c", "128x256/1x2",
          "128x256/1c2junk", "0x256/1", "abc", "128x256/sk2", "128x256/skx", "128x256/skc"}) {
        const std::string msg = fanout::testing::error_of([&] { parse_gemm_config(bad); });
        EXPECT_NE(msg.find("BMxBN/SPLITS"), std::string::npos) << "'" << bad << "': " << msg;
    }
}

// The grouped points time the DeepGEMM anchors' rows: every count in [0.7, 1.3] × expected and the
// anchor's total (EP16's draw alone gave 1,918 rows against the anchor's 2,090).
TEST(KernelsBenchConfig, GroupedCountsTotalTheAnchorsRows) {
    for (const auto& [E, expected, valid] : std::vector<std::array<int, 3>>{
             {32, 64, 2174},
             {16, 128, 2090},
             {8, 256, 2086},
             {4, 512, 2132},
             {2, 1024, 2417},
             {3, 10, 21},
             // bench layer's emulated dispatch: m · experts rows, from none (its constructor) up
             {32, 0, 0},
             {32, 1, 32},
             {2, 1024, 2048}}) {
        const std::vector<int32_t> c = anchor_counts(E, expected, valid, 7);
        ASSERT_EQ(static_cast<int>(c.size()), E);
        EXPECT_EQ(std::accumulate(c.begin(), c.end(), 0), valid) << E;
        for (const int v : c) {
            EXPECT_GE(v, expected * 7 / 10);
            EXPECT_LE(v, anchor_count_max(expected));
        }
        EXPECT_EQ(anchor_counts(E, expected, valid, 7), c);  // the same rows every run
    }
    EXPECT_NE(fanout::testing::error_of([] { anchor_counts(2, 100, 300, 1); }).find("cannot be"), std::string::npos);
}

}  // namespace
}  // namespace fanout::bench

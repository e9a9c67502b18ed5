// `fanout bench kernels --config`: the tile configuration's text form, and the errors that name a
// malformed one.
#include <gtest/gtest.h>

#include <string>

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
}

TEST(KernelsBenchConfig, MalformedConfigsAreErrorsThatShowTheForm) {
    for (const char* bad : {"", "128", "128x256", "128x256/", "128x256/0", "128x256/-2", "128x256/s", "128x256/1c",
                            "128x256/1x2", "128x256/1c2junk", "0x256/1", "abc"}) {
        const std::string msg = fanout::testing::error_of([&] { parse_gemm_config(bad); });
        EXPECT_NE(msg.find("BMxBN/SPLITS"), std::string::npos) << "'" << bad << "': " << msg;
    }
}

}  // namespace
}  // namespace fanout::bench

// ParallelConfig: each rank's block of routed experts covers them all exactly once, DP/TP ranks
// follow from rank and tp, and a bad split is an Error naming the field.
#include "fanout/core/parallel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_util.h"

namespace fanout {
namespace {

using fanout::testing::error_of;
using ::testing::HasSubstr;

TEST(ParallelConfig, RanksPartitionTheExperts) {
    for (int ep : {1, 2, 4, 8, 32}) {
        std::vector<int> owner(256, -1);
        for (int r = 0; r < ep; ++r) {
            const ParallelConfig p{r, ep, 1};
            const auto mine = p.experts(256);
            EXPECT_EQ(mine.size(), 256 / ep);
            EXPECT_EQ(mine.begin, p.experts_of(r, 256).begin);
            for (int64_t e = mine.begin; e < mine.end; ++e) {
                EXPECT_EQ(owner[size_t(e)], -1) << "expert " << e << " held twice at ep " << ep;
                owner[size_t(e)] = r;
            }
        }
        for (int e = 0; e < 256; ++e) EXPECT_GE(owner[size_t(e)], 0) << "expert " << e << " unheld at ep " << ep;
    }
}

TEST(ParallelConfig, DataAndTensorRanks) {
    const ParallelConfig p{5, 8, 2};
    EXPECT_EQ(p.world(), 8);
    EXPECT_EQ(p.dp(), 4);
    EXPECT_EQ(p.dp_rank(), 2);
    EXPECT_EQ(p.tp_rank(), 1);
}

TEST(ParallelConfig, BadSplitsNameTheField) {
    EXPECT_THAT(error_of([] { validate(ParallelConfig{0, 0, 1}, 8); }), HasSubstr("ep must be >= 1"));
    EXPECT_THAT(error_of([] { validate(ParallelConfig{4, 4, 1}, 8); }), HasSubstr("rank 4 outside [0, 4)"));
    EXPECT_THAT(error_of([] { validate(ParallelConfig{0, 4, 3}, 8); }), HasSubstr("tp=3 must divide ep=4"));
    EXPECT_THAT(error_of([] { validate(ParallelConfig{0, 3, 1}, 8); }), HasSubstr("ep=3 does not divide"));
    EXPECT_NO_THROW(validate(ParallelConfig{1, 2, 1}, 0));  // a dense model: nothing to split
}

}  // namespace
}  // namespace fanout

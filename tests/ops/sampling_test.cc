#include <gtest/gtest.h>

#include <map>

#include "fanout/ops/sampling.h"
#include "test_util.h"

namespace fanout::ops {
namespace {

TEST(Sampling, GreedyIsArgmaxWithLowestIdOnTies) {
    std::vector<float> l = {0.1f, 3.0f, -1.0f, 3.0f};
    Sampler s({});
    EXPECT_EQ(s.sample(l.data(), 4), 1);
}

TEST(Sampling, TopKOneIsGreedyAtAnyTemperature) {
    const auto l = fanout::testing::random_floats(1000, 31, 5.0f);
    Sampler s({1.7f, 1, 1.0f, 9});
    for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(l.data(), 1000), argmax(l.data(), 1000));
}

TEST(Sampling, SameSeedSameTokensOtherSeedOtherTokens) {
    const auto l = fanout::testing::random_floats(500, 32, 2.0f);
    Sampler a({1.0f, 0, 1.0f, 42}), b({1.0f, 0, 1.0f, 42}), c({1.0f, 0, 1.0f, 43});
    std::vector<int32_t> ta, tb, tc;
    for (int i = 0; i < 50; ++i) {
        ta.push_back(a.sample(l.data(), 500));
        tb.push_back(b.sample(l.data(), 500));
        tc.push_back(c.sample(l.data(), 500));
    }
    EXPECT_EQ(ta, tb);
    EXPECT_NE(ta, tc);
}

TEST(Sampling, FrequenciesFollowSoftmaxAndTopPCutsTheTail) {
    // probabilities 0.5, 0.25, 0.125, 0.125 at temperature 1
    std::vector<float> l = {std::log(4.0f), std::log(2.0f), 0.0f, 0.0f};
    Sampler s({1.0f, 0, 1.0f, 7});
    std::map<int, int> counts;
    const int n = 20000;
    for (int i = 0; i < n; ++i) ++counts[s.sample(l.data(), 4)];
    EXPECT_NEAR(counts[0] / double(n), 0.5, 0.02);
    EXPECT_NEAR(counts[1] / double(n), 0.25, 0.02);
    EXPECT_NEAR(counts[3] / double(n), 0.125, 0.02);
    Sampler p({1.0f, 0, 0.7f, 7});  // the smallest set reaching 0.7: ids 0 and 1
    std::map<int, int> pc;
    for (int i = 0; i < 5000; ++i) ++pc[p.sample(l.data(), 4)];
    EXPECT_EQ(pc.count(2) + pc.count(3), 0u);
    EXPECT_NEAR(pc[0] / 5000.0, 2.0 / 3.0, 0.03);
}

TEST(Sampling, RejectsBadParameters) {
    EXPECT_THROW(Sampler({-1.0f, 0, 1.0f, 0}), Error);
    EXPECT_THROW(Sampler({1.0f, -3, 1.0f, 0}), Error);
    EXPECT_THROW(Sampler({1.0f, 0, 0.0f, 0}), Error);
    EXPECT_THROW(Sampler({1.0f, 0, 1.5f, 0}), Error);
    EXPECT_THROW(Sampler({NAN, 0, 1.0f, 0}), Error);
}

}  // namespace
}  // namespace fanout::ops

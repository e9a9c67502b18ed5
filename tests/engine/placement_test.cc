// Where a request runs among targets with their own KV caches (engine/placement.h): the prefix
// policy's cost (blocks still to prefill + weight × load), its override while loads diverge, the
// tie-breaks, round-robin's turn, the index's deltas (what a union of indexes counts), bad configs.
#include "fanout/engine/placement.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "test_util.h"

namespace fanout::engine {
namespace {

using fanout::testing::error_of;
using ::testing::HasSubstr;
using Hashes = std::vector<uint64_t>;

Hashes sorted(Hashes v) {
    std::sort(v.begin(), v.end());
    return v;
}

std::vector<Placer::Target> loads(std::vector<int64_t> requests, std::vector<int64_t> tokens = {}) {
    std::vector<Placer::Target> t(requests.size());
    for (size_t i = 0; i < t.size(); ++i) {
        t[i].requests = requests[i];
        t[i].tokens = i < tokens.size() ? tokens[i] : 0;
    }
    return t;
}

TEST(Placer, PrefixWeighsCachedBlocksAgainstLoad) {
    Placer p({"prefix", 1.0, 8}, 3);
    const std::vector<uint64_t> prompt = {11, 12, 13, 14, 15, 16};
    p.update(1, false, {11, 12, 13, 14}, {});
    p.update(2, false, {11, 99}, {});
    EXPECT_EQ(p.cached_prefix(1, prompt), 4);
    EXPECT_EQ(p.cached_prefix(2, prompt), 1);  // 99 is not the prompt's second block
    // Costs 6 + 0, 2 + 3, 5 + 0: target 1.
    Placer::Choice c = p.choose(prompt, loads({0, 3, 0}));
    EXPECT_EQ(c.target, 1);
    EXPECT_EQ(c.cached_blocks, 4);
    EXPECT_EQ(c.prompt_blocks, 6);
    // 2 + 5 > 5 + 0: target 2.
    EXPECT_EQ(p.choose(prompt, loads({1, 5, 0})).target, 2);
    // Ineligible targets are skipped whatever they hold.
    auto t = loads({0, 0, 0});
    t[1].eligible = false;
    t[2].eligible = false;
    EXPECT_EQ(p.choose(prompt, t).target, 0);
    t[0].eligible = false;
    EXPECT_EQ(p.choose(prompt, t).target, -1);
}

TEST(Placer, DivergingLoadsFallBackToLeastLoadAndTiesGoToFewerTokensThenLowerIndex) {
    Placer p({"prefix", 0.0, 4}, 3);
    p.update(0, false, {1, 2, 3}, {});
    EXPECT_EQ(p.choose({1, 2, 3}, loads({4, 0, 1})).target, 0);  // spread 4: the cache wins (weight 0)
    EXPECT_EQ(p.choose({1, 2, 3}, loads({5, 0, 1})).target, 1);  // spread 5 > slack: least load
    Placer ll({"least-load", 1.0, 8}, 3);
    EXPECT_EQ(ll.choose({}, loads({2, 1, 1}, {0, 50, 40})).target, 2);
    EXPECT_EQ(ll.choose({}, loads({1, 1, 1}, {7, 7, 7})).target, 0);
}

TEST(Placer, RoundRobinTakesTurnsOverEligibleTargetsAndPreviewDoesNotMoveIt) {
    Placer p({"round-robin", 1.0, 8}, 3);
    auto t = loads({9, 0, 0});
    EXPECT_EQ(p.preview({}, t).target, 0);
    EXPECT_EQ(p.preview({}, t).target, 0);
    std::vector<int> order;
    for (int i = 0; i < 4; ++i) order.push_back(p.choose({}, t).target);
    EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 0}));
    t[1].eligible = false;
    EXPECT_EQ(p.choose({}, t).target, 2);  // 1's turn, but it is full
}

TEST(Placer, UpdatesReportWhatChangedAndResetsReplaceTheSet) {
    Placer p({}, 2);
    Placer::Delta d = p.update(0, false, {1, 2, 3}, {});
    EXPECT_EQ(sorted(d.added), (Hashes{1, 2, 3}));
    d = p.update(0, false, {3, 4}, {1, 7});  // 3 known, 7 never held
    EXPECT_EQ(d.added, (Hashes{4}));
    EXPECT_EQ(d.removed, (Hashes{1}));
    d = p.update(0, true, {4, 5}, {});
    EXPECT_EQ(d.added, (Hashes{5}));
    EXPECT_EQ(sorted(d.removed), (Hashes{2, 3}));
    EXPECT_EQ(p.indexed_blocks(0), 2);
    d = p.forget(0);
    EXPECT_EQ(sorted(d.removed), (Hashes{4, 5}));
    EXPECT_EQ(p.indexed_blocks(0), 0);
    EXPECT_THAT(error_of([&] { p.update(2, false, {}, {}); }), HasSubstr("target 2 of 2"));
    EXPECT_THAT(error_of([&] { p.choose({}, loads({0})); }), HasSubstr("1 targets' loads for 2 targets"));
}

TEST(Placer, BadConfigsAreRefusedNamingTheField) {
    EXPECT_THAT(error_of([] { Placer({"random", 1.0, 8}, 2); }), HasSubstr("policy 'random'"));
    EXPECT_THAT(error_of([] { Placer({"prefix", -1.0, 8}, 2); }), HasSubstr("load weight"));
    EXPECT_THAT(error_of([] { Placer({"prefix", 1.0, -2}, 2); }), HasSubstr("balance slack"));
    EXPECT_THAT(error_of([] { Placer({}, 0); }), HasSubstr("0 targets"));
}

}  // namespace
}  // namespace fanout::engine

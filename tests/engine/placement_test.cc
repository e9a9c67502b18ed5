// Where a request runs among targets with their own KV caches (engine/placement.h): the prefix
// policy's cost (blocks still to prefill + weight × load), its override while loads diverge, the
// tie-breaks, round-robin's turn, the index's deltas (what a union of indexes counts), the pending
// blocks a placement leaves on its target until its KV events confirm them (on a clock the tests
// move), bad configs.
#include "fanout/engine/placement.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "test_util.h"

namespace fanout::engine {
namespace {

using namespace std::chrono_literals;
using fanout::testing::error_of;
using ::testing::HasSubstr;
using Hashes = std::vector<uint64_t>;

Hashes sorted(Hashes v) {
    std::sort(v.begin(), v.end());
    return v;
}

// A clock the test moves by hand: pending deadlines without sleeping.
struct FakeClock {
    Placer::TimePoint now = Placer::TimePoint{} + std::chrono::hours(1);
    Placer::Clock fn() {
        return [this] { return now; };
    }
    void advance(std::chrono::milliseconds by) { now += by; }
};

std::vector<Placer::Target> loads(std::vector<int64_t> requests, std::vector<int64_t> tokens = {}) {
    std::vector<Placer::Target> t(requests.size());
    for (size_t i = 0; i < t.size(); ++i) {
        t[i].requests = requests[i];
        t[i].tokens = i < tokens.size() ? tokens[i] : 0;
    }
    return t;
}

TEST(Placer, PrefixWeighsCachedBlocksAgainstLoad) {
    Placer p({"prefix", 1.0, 8, 0.0}, 3);  // the index alone: each choice below leaves no pending blocks
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

// The race KV events lose: a prompt placed, and before its target's events arrive, another sharing
// its prefix. The first one's blocks are pending where it went, so the second goes there too.
TEST(Placer, TwoPromptsSharingAPrefixPlacedBackToBackGoToTheSameTarget) {
    FakeClock clock;
    Placer p({"prefix", 1.0, 8}, 3, clock.fn());
    const Placer::Choice first = p.choose({1, 2, 3, 4}, loads({0, 0, 0}));
    ASSERT_EQ(first.target, 0);
    EXPECT_EQ(first.cached_blocks, 0);
    EXPECT_EQ(p.cached_prefix(0, {1, 2, 3, 9}), 3);
    EXPECT_EQ(p.indexed_blocks(0), 0) << "pending blocks are not in the index proper";
    // Target 0 now runs the first: costs 1 + 1, 4 + 0, 4 + 0 (without the pending blocks, 1 or 2).
    const Placer::Choice second = p.choose({1, 2, 3, 9}, loads({1, 0, 0}));
    EXPECT_EQ(second.target, 0);
    EXPECT_EQ(second.cached_blocks, 3);
    EXPECT_EQ(p.cached_prefix(1, {1, 2, 3, 9}), 0);
    EXPECT_EQ(p.cached_prefix(2, {1, 2, 3, 9}), 0);
}

TEST(Placer, PendingBlocksExpireAfterTheTtlAndEachPlacementRenewsThem) {
    FakeClock clock;
    Placer p({"prefix", 1.0, 8, 2.0}, 3, clock.fn());
    ASSERT_EQ(p.choose({1, 2, 3, 4}, loads({0, 0, 0})).target, 0);
    clock.advance(1500ms);
    EXPECT_EQ(p.cached_prefix(0, {1, 2, 3, 4}), 4);
    // A second placement there renews 1..3 (and adds 8); 4 keeps its first deadline.
    ASSERT_EQ(p.choose({1, 2, 3, 8}, loads({1, 0, 0})).target, 0);
    clock.advance(499ms);  // 1.999 s after the first placement
    EXPECT_EQ(p.cached_prefix(0, {1, 2, 3, 4}), 4);
    clock.advance(1ms);  // 2 s after it
    // Another placement purges what expired (4), not what was renewed since (1..3).
    ASSERT_EQ(p.choose({7}, loads({2, 0, 0})).target, 1);
    EXPECT_EQ(p.cached_prefix(0, {1, 2, 3, 4}), 3);
    EXPECT_EQ(p.cached_prefix(0, {1, 2, 3, 8}), 4);
    clock.advance(1500ms);  // 2 s after the second
    EXPECT_EQ(p.cached_prefix(0, {1, 2, 3, 8}), 0);
    // Unconfirmed and expired: the next prompt with that prefix is placed by load alone.
    EXPECT_EQ(p.choose({1, 2, 3, 8}, loads({1, 0, 0})).target, 1);
}

TEST(Placer, AnEventConfirmingPendingBlocksIndexesThemPastTheTtl) {
    FakeClock clock;
    Placer p({"prefix", 1.0, 8, 2.0}, 2, clock.fn());
    ASSERT_EQ(p.choose({1, 2, 3, 4}, loads({0, 0})).target, 0);
    // The target stored the first two blocks: they are indexed now, and reported as added (the
    // union a DP group publishes counts them from here).
    const Placer::Delta d = p.update(0, false, {1, 2}, {});
    EXPECT_EQ(sorted(d.added), (Hashes{1, 2}));
    EXPECT_EQ(p.indexed_blocks(0), 2);
    clock.advance(10s);
    EXPECT_EQ(p.cached_prefix(0, {1, 2, 3, 4}), 2) << "3 and 4 were never confirmed";
    // A reset listing a pending block confirms it too; one leaving a pending block out lets it be
    // (its request may not have run yet).
    ASSERT_EQ(p.choose({5, 6}, loads({0, 1})).target, 0);
    p.update(0, true, {1, 2, 5}, {});
    clock.advance(1s);
    EXPECT_EQ(p.cached_prefix(0, {5, 6}), 2);
    // Confirmed, 5 is pending no more: a reset without it drops it now, not at its old deadline.
    p.update(0, true, {1, 2}, {});
    EXPECT_EQ(p.cached_prefix(0, {5, 6}), 0);
    EXPECT_EQ(p.cached_prefix(0, {6}), 1);
    clock.advance(1s);
    EXPECT_EQ(p.cached_prefix(0, {6}), 0);
}

TEST(Placer, ARemovalEventDropsAPendingBlock) {
    FakeClock clock;
    Placer p({"prefix", 1.0, 8}, 2, clock.fn());
    ASSERT_EQ(p.choose({1, 2, 3, 4}, loads({0, 0})).target, 0);
    const Placer::Delta d = p.update(0, false, {}, {2});
    EXPECT_TRUE(d.removed.empty()) << "2 was pending, never indexed";
    EXPECT_EQ(p.cached_prefix(0, {1, 2, 3, 4}), 1);
    EXPECT_EQ(p.cached_prefix(0, {1}), 1);
}

TEST(Placer, ForgetDropsPendingBlocks) {
    FakeClock clock;
    Placer p({"prefix", 1.0, 8}, 2, clock.fn());
    p.update(0, false, {1}, {});
    ASSERT_EQ(p.choose({1, 2, 3}, loads({0, 0})).target, 0);
    ASSERT_EQ(p.cached_prefix(0, {1, 2, 3}), 3);
    const Placer::Delta d = p.forget(0);
    EXPECT_EQ(d.removed, (Hashes{1})) << "the index's blocks only";
    EXPECT_EQ(p.cached_prefix(0, {1, 2, 3}), 0);
    // Rebuilt from a reset: only what it lists.
    p.update(0, true, {1}, {});
    EXPECT_EQ(p.cached_prefix(0, {1, 2, 3}), 1);
}

TEST(Placer, PreviewOtherPoliciesAndAZeroTtlAddNoPendingBlocks) {
    FakeClock clock;
    Placer p({"prefix", 1.0, 8}, 2, clock.fn());
    const Placer::Choice c = p.preview({1, 2, 3}, loads({0, 0}));
    ASSERT_EQ(c.target, 0);
    EXPECT_EQ(p.cached_prefix(0, {1, 2, 3}), 0);
    EXPECT_EQ(p.choose({1, 2, 3}, loads({1, 0})).target, 1);
    for (const char* policy : {"least-load", "round-robin"}) {
        Placer q({policy, 1.0, 8}, 2, clock.fn());
        ASSERT_EQ(q.choose({1, 2, 3}, loads({0, 0})).target, 0) << policy;
        EXPECT_EQ(q.cached_prefix(0, {1, 2, 3}), 0) << policy;
    }
    Placer off({"prefix", 1.0, 8, 0.0}, 2, clock.fn());
    ASSERT_EQ(off.choose({1, 2, 3}, loads({0, 0})).target, 0);
    EXPECT_EQ(off.cached_prefix(0, {1, 2, 3}), 0);
}

TEST(Placer, DivergingLoadsStillWinOverAPendingPrefix) {
    FakeClock clock;
    Placer p({"prefix", 0.0, 2}, 3, clock.fn());
    ASSERT_EQ(p.choose({1, 2, 3}, loads({0, 0, 0})).target, 0);
    EXPECT_EQ(p.choose({1, 2, 4}, loads({2, 0, 1})).target, 0);      // spread 2: the pending prefix wins (weight 0)
    const Placer::Choice c = p.choose({1, 2, 5}, loads({3, 0, 1}));  // spread 3 > slack: least load
    EXPECT_EQ(c.target, 1);
    EXPECT_EQ(c.cached_blocks, 0);
}

TEST(Placer, BadConfigsAreRefusedNamingTheField) {
    EXPECT_THAT(error_of([] { Placer({"random", 1.0, 8}, 2); }), HasSubstr("policy 'random'"));
    EXPECT_THAT(error_of([] { Placer({"prefix", -1.0, 8}, 2); }), HasSubstr("load weight"));
    // inf · 0 requests made an idle target's cost NaN, and NaN ties with every cost
    EXPECT_THAT(error_of([] {
                    Placer({"prefix", std::numeric_limits<double>::infinity(), 8}, 2);
                }),
                HasSubstr("finite"));
    EXPECT_THAT(error_of([] { Placer({"prefix", std::nan(""), 8}, 2); }), HasSubstr("load weight"));
    EXPECT_THAT(error_of([] { Placer({"prefix", 1.0, -2}, 2); }), HasSubstr("balance slack"));
    EXPECT_THAT(error_of([] { Placer({"prefix", 1.0, 8, -0.5}, 2); }), HasSubstr("pending TTL"));
    EXPECT_THAT(error_of([] { Placer({"prefix", 1.0, 8, NAN}, 2); }), HasSubstr("pending TTL"));
    EXPECT_THAT(error_of([] { Placer({"prefix", 1.0, 8, 1e9}, 2); }), HasSubstr("pending TTL"));
    EXPECT_THAT(error_of([] { Placer({}, 0); }), HasSubstr("0 targets"));
}

}  // namespace
}  // namespace fanout::engine

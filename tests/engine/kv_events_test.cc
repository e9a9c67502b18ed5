// The engine's prefix-cache changes as a subscriber on another thread sees them (KvEventHub): a
// reset with what is cached, then every block stored and evicted, by the chain hash the router
// computes from a prompt; a subscriber that fell behind the log starts over with a reset.
#include "fanout/engine/kv_events.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <unordered_set>

#include "engine_test_util.h"
#include "fake_rank_runner.h"
#include "fanout/kv/prefix_cache.h"

namespace fanout::engine {
namespace {

TEST(KvEvents, ASubscriberSeesWhatTheEngineCaches) {
    testing::Shared shared(1);
    EngineConfig cfg;
    cfg.num_kv_blocks = 16;
    cfg.scheduler = {4, 64, 64};
    Engine engine(std::make_unique<testing::FakeRankRunner>(shared, 0), nullptr, cfg);
    KvEventHub& hub = *engine.kv_events();
    auto first = hub.next(0, std::chrono::milliseconds(0));
    ASSERT_EQ(first.changes.size(), 1u);
    EXPECT_TRUE(first.changes[0].reset);
    EXPECT_TRUE(first.changes[0].stored.empty());

    RequestParams p;
    for (int i = 0; i < 9; ++i) p.prompt.push_back(i + 1);  // 2 full blocks of 4
    p.max_tokens = 3;
    p.ignore_eos = true;
    engine.start();
    testing::drain(*engine.submit(p));
    std::unordered_set<uint64_t> seen;
    uint64_t last = first.last;
    for (int i = 0; i < 50 && seen.size() < 2; ++i) {
        auto b = hub.next(last, std::chrono::milliseconds(100));
        for (const auto& c : b.changes) {
            EXPECT_FALSE(c.reset);
            seen.insert(c.stored.begin(), c.stored.end());
            for (uint64_t h : c.removed) seen.erase(h);
        }
        last = b.last;
    }
    const auto want = kv::block_hashes(p.prompt, engine.kv_block_size());
    ASSERT_EQ(want.size(), 2u);
    for (uint64_t h : want) EXPECT_TRUE(seen.count(h)) << "the prompt's blocks are cached and published";
    // A late subscriber gets them all at once.
    auto late = hub.next(0, std::chrono::milliseconds(0));
    ASSERT_EQ(late.changes.size(), 1u);
    EXPECT_TRUE(late.changes[0].reset);
    std::unordered_set<uint64_t> snap(late.changes[0].stored.begin(), late.changes[0].stored.end());
    for (uint64_t h : want) EXPECT_TRUE(snap.count(h));
    engine.stop();
}

TEST(KvEvents, ASubscriberBehindTheLogStartsOverAndCloseWakesWaiters) {
    KvEventHub hub(2);
    hub.publish({1}, {});
    hub.publish({2}, {});
    hub.publish({3}, {1});
    auto b = hub.next(1, std::chrono::milliseconds(0));  // change 2 (the first) fell out of the log
    ASSERT_EQ(b.changes.size(), 1u);
    EXPECT_TRUE(b.changes[0].reset);
    std::vector<uint64_t> s = b.changes[0].stored;
    std::sort(s.begin(), s.end());
    EXPECT_EQ(s, (std::vector<uint64_t>{2, 3}));
    EXPECT_EQ(b.last, 4u);
    auto tail = hub.next(3, std::chrono::milliseconds(0));
    ASSERT_EQ(tail.changes.size(), 1u);
    EXPECT_EQ(tail.changes[0].removed, (std::vector<uint64_t>{1}));
    std::thread closer([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        hub.close();
    });
    const auto start = std::chrono::steady_clock::now();
    EXPECT_TRUE(hub.next(4, std::chrono::seconds(30)).changes.empty());
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    closer.join();
}

// Changes trimmed from the log while a subscriber waits are not lost: the wait's answer is a reset
// then. Before, the subscriber got the entries that survived and silently missed the others.
TEST(KvEvents, ChangesTrimmedDuringTheWaitGiveAReset) {
    KvEventHub hub(2);
    hub.publish({1}, {});
    std::thread publisher([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        for (uint64_t h = 2; h <= 11; ++h) hub.publish({h}, {});  // under one lock each: the waiter wakes late
    });
    // Waits after the first change (state 2); when it runs again the log may hold only the last two.
    const KvEventHub::Batch b = hub.next(2, std::chrono::seconds(5));
    publisher.join();
    // Either it woke before the burst was trimmed (every change since 1, in order) or it got a reset.
    if (!b.changes.empty() && !b.changes[0].reset) {
        std::vector<uint64_t> got;
        for (const auto& c : b.changes) got.insert(got.end(), c.stored.begin(), c.stored.end());
        for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], i + 2) << "a change was skipped";
    } else {
        ASSERT_FALSE(b.changes.empty());
        EXPECT_TRUE(b.changes[0].reset);
    }
}

}  // namespace
}  // namespace fanout::engine

#include "fanout/kv/prefix_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <span>

#include "fanout/core/error.h"

namespace fanout::kv {
namespace {

std::vector<int32_t> seq(int n, int start = 0) {
    std::vector<int32_t> v(n);
    std::iota(v.begin(), v.end(), start);
    return v;
}

TEST(PrefixCache, ReusesTheLongestCachedChainOfWholeBlocks) {
    BlockAllocator alloc(8);
    PrefixCache pc(alloc, 4);
    const auto a = seq(10);  // 2 full blocks + 2 tokens
    auto blocks = pc.allocate(3);
    pc.insert(a, blocks);
    EXPECT_EQ(pc.num_cached_blocks(), 2);  // the partial third block is not cached
    std::vector<int32_t> b = seq(9);
    b[6] = 99;  // differs in the second block
    const auto hit = pc.acquire_prefix(b, 10);
    ASSERT_EQ(hit.size(), 1u);
    EXPECT_EQ(hit[0], blocks[0]);
    const auto hit2 = pc.acquire_prefix(seq(12), 10);
    EXPECT_EQ(hit2, (std::vector<int32_t>{blocks[0], blocks[1]}));
    EXPECT_EQ(pc.acquire_prefix(seq(12), 1).size(), 1u);  // max_blocks caps it
    pc.release(blocks);
    pc.release(hit);
    pc.release(hit2);
    pc.release({blocks[0]});
    EXPECT_EQ(pc.num_evictable(), 2);
    EXPECT_EQ(alloc.num_free(), 6);                // the uncached third block went back; the cached two stay held
    EXPECT_THROW(pc.release({blocks[0]}), Error);  // no reference left
}

TEST(PrefixCache, EvictsLeastRecentlyUsedLeavesWhenTheAllocatorRunsDry) {
    BlockAllocator alloc(4);
    PrefixCache pc(alloc, 2);
    auto x = pc.allocate(2);
    pc.insert(seq(4, 0), x);  // chain x0 -> x1
    auto y = pc.allocate(2);
    pc.insert(seq(4, 100), y);  // chain y0 -> y1
    pc.release(x);
    pc.release(y);
    pc.release(pc.acquire_prefix(seq(4, 0), 2));  // x used more recently than y
    EXPECT_TRUE(pc.can_allocate(4));
    EXPECT_FALSE(pc.can_allocate(5));
    auto z = pc.allocate(2);  // evicts y's chain, leaf first
    EXPECT_EQ(pc.acquire_prefix(seq(4, 100), 2).size(), 0u);
    const auto xs = pc.acquire_prefix(seq(4, 0), 2);
    EXPECT_EQ(xs.size(), 2u);
    EXPECT_THROW(pc.allocate(1), Error);  // everything is referenced now
    pc.release(xs);
    pc.release(z);
}

TEST(PrefixCache, DuplicateContentAdoptsTheCachedBlock) {
    BlockAllocator alloc(4);
    PrefixCache pc(alloc, 2);
    auto a = pc.allocate(1), b = pc.allocate(1);
    const int32_t b_own = b[0];
    pc.insert(seq(2), a);
    pc.insert(seq(2), b);  // same content, computed twice: b takes a's block, gives its own back
    EXPECT_EQ(b[0], a[0]);
    EXPECT_NE(b_own, a[0]);
    EXPECT_EQ(pc.num_cached_blocks(), 1);
    EXPECT_EQ(alloc.num_free(), 3);
    pc.release(b);
    pc.release(a);
    EXPECT_EQ(pc.num_evictable(), 1);
    EXPECT_TRUE(pc.can_allocate(4));
    EXPECT_EQ(pc.allocate(4).size(), 4u);  // eviction really delivers what can_allocate promised
}

// The chain hashes the router indexes: the listener hears every block entered (the hashes of the
// prompt's full blocks, computed the same way outside the cache) and every block evicted, and
// cached_hashes() is what is in the tree.
TEST(PrefixCache, PublishesStoredAndEvictedBlocksByChainHash) {
    BlockAllocator alloc(3);
    PrefixCache pc(alloc, 4);
    std::vector<uint64_t> stored, removed;
    pc.set_listener([&](const std::vector<uint64_t>& s, const std::vector<uint64_t>& r) {
        stored.insert(stored.end(), s.begin(), s.end());
        removed.insert(removed.end(), r.begin(), r.end());
    });
    const auto a = seq(9);
    auto blocks = pc.allocate(3);
    pc.insert(a, blocks);
    EXPECT_EQ(stored, block_hashes(a, 4));
    ASSERT_EQ(stored.size(), 2u);
    EXPECT_NE(stored[0], stored[1]);
    EXPECT_EQ(stored[1], block_hash(block_hash(kRootHash, std::span(a).subspan(0, 4)), std::span(a).subspan(4, 4)));
    // The same second block after a different first one is another prefix: another hash.
    std::vector<int32_t> b = a;
    b[0] = 77;
    EXPECT_NE(block_hashes(b, 4)[1], stored[1]);
    auto sorted = pc.cached_hashes();
    std::sort(sorted.begin(), sorted.end());
    auto want = stored;
    std::sort(want.begin(), want.end());
    EXPECT_EQ(sorted, want);
    pc.release(blocks);
    stored.clear();
    auto more = pc.allocate(3);  // needs the two cached blocks: both evicted, leaf first
    EXPECT_EQ(removed, (std::vector<uint64_t>{block_hashes(a, 4)[1], block_hashes(a, 4)[0]}));
    EXPECT_TRUE(pc.cached_hashes().empty());
    pc.release(more);
}

}  // namespace
}  // namespace fanout::kv

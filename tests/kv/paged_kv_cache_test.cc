#include <gtest/gtest.h>

#include <set>

#include "fanout/kv/paged_kv_cache.h"

namespace fanout::kv {
namespace {

TEST(BlockAllocator, AllocatesDistinctBlocksAndReportsExhaustion) {
    BlockAllocator a(5);
    auto x = a.allocate(3);
    auto y = a.allocate(2);
    std::set<int32_t> all(x.begin(), x.end());
    all.insert(y.begin(), y.end());
    EXPECT_EQ(all.size(), 5u);
    EXPECT_EQ(a.num_free(), 0);
    try {
        a.allocate(1);
        FAIL() << "allocation beyond capacity must throw";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("need 1 blocks but only 0 of 5 are free"), std::string::npos) << e.what();
    }
    a.release(x);
    EXPECT_EQ(a.num_free(), 3);
    EXPECT_THROW(a.release(x), Error);  // double free
    EXPECT_THROW(a.release({7}), Error);
}

TEST(PagedKvCache, SlotsFollowTheBlockTable) {
    PagedKvCache cache({2, 5, 4, 6, DType::kF32});
    SequenceBlocks a, b;
    cache.reserve(a, 5);  // 2 blocks
    cache.reserve(b, 4);  // 1 block
    cache.reserve(a, 8);  // still 2
    EXPECT_EQ(a.blocks.size(), 2u);
    EXPECT_EQ(b.blocks.size(), 1u);
    for (int64_t p = 0; p < 8; ++p) EXPECT_EQ(cache.slot(a, p), a.blocks[p / 4] * 4 + p % 4);
    EXPECT_THROW(cache.slot(a, 8), Error);
    EXPECT_THROW(cache.reserve(b, 100), Error);
    EXPECT_NE(cache.layer_data(0), cache.layer_data(1));
    EXPECT_THROW(cache.layer_data(2), Error);
    cache.release(a);
    EXPECT_EQ(cache.allocator().num_free(), 5);
}

}  // namespace
}  // namespace fanout::kv

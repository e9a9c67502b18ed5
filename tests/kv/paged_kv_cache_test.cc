#include "fanout/kv/paged_kv_cache.h"

#include <gtest/gtest.h>

#include <set>

#include "test_util.h"

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

// A position's slot is an int32: a cache past 2^31 positions is refused before anything is
// allocated (past 2^25 blocks of 64 the slots went negative; past 2^26 they wrapped onto other
// sequences' entries).
TEST(PagedKvCache, MoreSlotsThanAnInt32HoldsAreRefused) {
    const std::string msg = fanout::testing::error_of([] {
        PagedKvCache({1, 5, 64, (int64_t{1} << 25) + 1, DType::kF32});
    });
    EXPECT_NE(msg.find("2^31 cache slots"), std::string::npos) << msg;
    PagedKvCache ok({1, 5, 64, 1000, DType::kF32});
    EXPECT_EQ(ok.allocator().num_free(), 1000);
}

// Each dtype's entry bytes, and layers laid out that many bytes per slot apart: f32, bf16, and the
// FP8 entry (e4m3 latent, an f32 scale per 128 values, bf16 rope) — 656 bytes at V3's widths, 57%
// of bf16's 1,152. FP8 widths the entry cannot hold, and unknown names, are refused by name.
TEST(PagedKvCache, EntryBytesPerDtype) {
    const auto bytes = [](int64_t entry_dim, int64_t kv_lora, DType dtype) {
        KvCacheConfig k;
        k.entry_dim = entry_dim;
        k.kv_lora = kv_lora;
        k.dtype = dtype;
        return k.entry_bytes();
    };
    EXPECT_EQ(bytes(576, 512, DType::kF32), 2304);
    EXPECT_EQ(bytes(576, 512, DType::kBF16), 1152);
    EXPECT_EQ(bytes(576, 512, DType::kFP8E4M3), 656);
    EXPECT_EQ(bytes(80, 64, DType::kFP8E4M3), 64 + 4 + 32);  // the tiny model: one group of 64
    EXPECT_NE(fanout::testing::error_of([&] { bytes(80, 62, DType::kFP8E4M3); }).find("kv_lora 62"), std::string::npos);
    EXPECT_NE(fanout::testing::error_of([&] { bytes(80, 64, DType::kI32); }).find("cannot store dtype I32"),
              std::string::npos);
    PagedKvCache fp8({2, 80, 4, 3, DType::kFP8E4M3, 64});
    EXPECT_EQ(static_cast<char*>(fp8.layer_data(1)) - static_cast<char*>(fp8.layer_data(0)), 3 * 4 * 100);
    EXPECT_EQ(kv_dtype_from_name("fp8"), DType::kFP8E4M3);
    EXPECT_EQ(kv_dtype_from_name("bf16"), DType::kBF16);
    EXPECT_NE(fanout::testing::error_of([] { kv_dtype_from_name("fp16"); }).find("choose f32, bf16 or fp8"),
              std::string::npos);
}

}  // namespace
}  // namespace fanout::kv

// The `local` EP backend: `world` threads, random routing and random token counts per rank (zero
// included), several steps through the same endpoints (ep_check.h has the per-rank checks).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <thread>
#include <vector>

#include "ep_check.h"
#include "fanout/comm/local_ep.h"
#include "fanout/core/dtype.h"
#include "test_util.h"

namespace fanout::comm {
namespace {

using testing::run_rank_step;

void run_group(EpConfig cfg, int steps, uint64_t seed) {
    LocalFabric fabric(cfg);
    std::vector<std::unique_ptr<ExpertParallel>> endpoints;
    for (int r = 0; r < cfg.world; ++r) endpoints.push_back(fabric.endpoint(r));
    std::mt19937 rng(seed);
    for (int step = 0; step < steps; ++step) {
        const auto inputs = testing::make_step_inputs(cfg, step, rng);
        std::vector<std::string> failures(cfg.world);
        std::vector<std::thread> threads;
        for (int r = 0; r < cfg.world; ++r)
            threads.emplace_back([&, r] { failures[r] = run_rank_step(*endpoints[r], inputs); });
        for (auto& th : threads) th.join();
        for (const auto& f : failures) EXPECT_TRUE(f.empty()) << "step " << step << ": " << f;
    }
}

TEST(EpLocal, Fp8DispatchBf16CombineAcrossWorldSizes) {
    for (int world : {1, 2, 4}) run_group({0, world, 32, 8, 256, 24, Payload::kFp8, 0}, 4, 7 + world);
}

TEST(EpLocal, Bf16DispatchAndOddShapes) { run_group({0, 3, 12, 3, 130, 9, Payload::kBf16, 0}, 4, 11); }

// The CPU model's exact path: f32 tokens out, f32 expert outputs back, the combine exact.
TEST(EpLocal, F32DispatchAndCombineAreExact) {
    for (int world : {1, 2, 4}) run_group({0, world, 16, 4, 72, 10, Payload::kF32, 0}, 4, 21 + world);
}

TEST(EpLocal, RowsPastMaxMAreDroppedNotMisplaced) {
    // max_m = 2 rows per expert: most choices are dropped; the reference check then only holds for
    // what fits, so run a single rank with few experts and check the counts and the combine.
    EpConfig c{0, 1, 2, 1, 16, 8, Payload::kFp8, 2};
    LocalFabric fabric(c);
    auto ep = fabric.endpoint(0);
    const int32_t T = 5;
    std::vector<uint8_t> tokens(size_t(T) * 16);
    for (int t = 0; t < T; ++t) tokens[size_t(t) * 16] = uint8_t(10 + t);
    std::vector<float> scales(T, 1.0f);
    const std::vector<int32_t> topk = {0, 0, 1, 0, 1};  // expert 0 gets tokens 0, 1, 3; expert 1 gets 2, 4
    ep->dispatch_send({&T, tokens.data(), scales.data(), topk.data()});
    ep->dispatch_recv();
    const ExpertBatch b = ep->recv_batch();
    EXPECT_EQ(b.counts[0], 3);
    EXPECT_EQ(b.counts[1], 2);
    const auto* got = static_cast<const uint8_t*>(b.tokens);
    EXPECT_EQ(got[0], 10);
    EXPECT_EQ(got[16], 11);  // token 3 was dropped, not written over row 1
    std::vector<uint16_t> y(size_t(2) * 2 * 16, f32_to_bf16(1.0f));
    ep->combine_send(y.data());
    std::vector<uint16_t> out(size_t(T) * 16);
    const std::vector<float> w(T, 0.5f);
    ep->combine_recv(w.data(), out.data());
    EXPECT_EQ(bf16_to_f32(out[0]), 0.5f);
    EXPECT_EQ(bf16_to_f32(out[3 * 16]), 0.0f);  // token 3's only choice was dropped
}

// Rows can be dropped exactly when an expert has fewer receive rows than every rank's tokens.
TEST(EpConfig, RowsDroppableWhenMaxMIsBelowWorldTimesTokens) {
    EXPECT_FALSE((EpConfig{0, 2, 4, 2, 16, 8, Payload::kFp8, 0}.rows_droppable()));  // default: 2 · 8
    EXPECT_FALSE((EpConfig{0, 2, 4, 2, 16, 8, Payload::kFp8, 16}.rows_droppable()));
    EXPECT_TRUE((EpConfig{0, 2, 4, 2, 16, 8, Payload::kFp8, 15}.rows_droppable()));
}

// check_received's two modes on a batch the local backend delivered in order: permuted rows of an
// expert pass only when any order is allowed, a changed scale fails either way.
TEST(EpLocal, CheckReceivedTellsAPermutationFromAWrongRow) {
    const EpConfig cfg{0, 1, 2, 1, 16, 8, Payload::kFp8, 0};
    ASSERT_FALSE(cfg.rows_droppable());
    LocalFabric fabric(cfg);
    auto ep = fabric.endpoint(0);
    std::mt19937 rng(5);
    const std::vector<testing::RankInput> inputs = {testing::make_input(cfg, 6, rng)};
    const int32_t T = inputs[0].T;
    ep->dispatch_send({&T, inputs[0].tokens.data(), inputs[0].scales.data(), inputs[0].topk.data()});
    ep->dispatch_recv();
    const ExpertBatch b = ep->recv_batch();
    const int e = b.counts[0] >= 2 ? 0 : 1;
    ASSERT_GE(b.counts[e], 2) << "six tokens over two experts leave one expert at least three";
    const size_t pb = size_t(cfg.payload_bytes()), nb = size_t(cfg.scale_blocks());
    std::vector<uint8_t> tokens(static_cast<const uint8_t*>(b.tokens),
                                static_cast<const uint8_t*>(b.tokens) + 2 * size_t(b.max_m) * pb);
    std::vector<float> scales(b.scales, b.scales + 2 * size_t(b.max_m) * nb);
    const ExpertBatch copy{b.counts, tokens.data(), scales.data(), b.max_m};
    EXPECT_EQ(testing::check_received(cfg, inputs, copy), "");
    const size_t r0 = size_t(e) * b.max_m, r1 = r0 + 1;  // swap the expert's first two rows
    std::swap_ranges(tokens.begin() + r0 * pb, tokens.begin() + r1 * pb, tokens.begin() + r1 * pb);
    std::swap_ranges(scales.begin() + r0 * nb, scales.begin() + r1 * nb, scales.begin() + r1 * nb);
    EXPECT_NE(testing::check_received(cfg, inputs, copy), "");
    EXPECT_EQ(testing::check_received(cfg, inputs, copy, true), "");
    scales[r1 * nb] += 1.0f;
    EXPECT_NE(testing::check_received(cfg, inputs, copy, true).find("wrong payload"), std::string::npos);
}

TEST(EpLocal, BadConfigsAndInputsAreClearErrors) {
    EXPECT_NE(fanout::testing::error_of([] {
                  LocalFabric f({0, 3, 32, 8, 256, 4, Payload::kFp8, 0});
              }).find("32 experts do not divide over 3 ranks"),
              std::string::npos);
    LocalFabric fabric({0, 1, 4, 1, 8, 2, Payload::kFp8, 0});
    auto ep = fabric.endpoint(0);
    const int32_t too_many = 3;
    std::vector<uint8_t> tokens(24);
    std::vector<float> scales(3);
    const std::vector<int32_t> bad_expert = {0, 9};
    EXPECT_NE(fanout::testing::error_of([&] {
                  ep->dispatch_send({&too_many, tokens.data(), scales.data(), nullptr});
              }).find("has 3 tokens, outside [0, 2]"),
              std::string::npos);
    const int32_t two = 2;
    EXPECT_NE(fanout::testing::error_of([&] {
                  ep->dispatch_send({&two, tokens.data(), scales.data(), bad_expert.data()});
              }).find("names expert 9"),
              std::string::npos);
}

}  // namespace
}  // namespace fanout::comm

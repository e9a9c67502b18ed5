// The two-microbatch schedule in the CPU model (StepBatch::microbatch): a step's requests split in
// two whose layers interleave stage by stage — both attentions and dispatch sends, both expert
// halves, both combines — give the logits (and hidden states) of the step run whole, within 1e-5,
// at EP1 and at EP4 with ranks as threads joined by two `local` fabrics (one per microbatch), where
// a rank of one request runs an empty second microbatch and a rank without requests two empty ones.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "fanout/comm/local_ep.h"
#include "fanout/model/ep_group.h"
#include "fanout/model/synthetic.h"
#include "small_models.h"
#include "test_util.h"

namespace fanout::model {
namespace {

using fanout::testing::error_of;
using ::testing::HasSubstr;
using testing::ids;
using testing::kMaxTokens;
using testing::max_diff;

// Requests of these lengths (prefill chunks and decode-sized ones) with their cached prefixes, on
// `cache`: a request of length n starting at position `start`.
struct Req {
    std::vector<int32_t> tokens;
    int64_t start;
};
StepBatch make_batch(kv::PagedKvCache& cache, std::vector<kv::SequenceBlocks>& seqs, const std::vector<Req>& reqs) {
    StepBatchBuilder b(cache);
    seqs.resize(reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
        const int64_t end = reqs[i].start + static_cast<int64_t>(reqs[i].tokens.size());
        if (seqs[i].blocks.empty()) cache.reserve(seqs[i], end);
        b.add(reqs[i].tokens, reqs[i].start, kv::SequenceBlocks{seqs[i].blocks, end},
              i % 2 ? StepBatchBuilder::Logits::kAll : StepBatchBuilder::Logits::kLast);
    }
    StepBatch batch = b.build();
    batch.all_hidden = true;
    return batch;
}

// The bf16 checkpoint of the small models.
class Microbatch : public testing::SmallModels {};

TEST(SplitMicrobatches, BalancesTokensKeepsOrderAndLeavesTheSecondEmptyForOneRequest) {
    kv::PagedKvCache cache(kv::KvCacheConfig{1, 64, 4, 32, DType::kF32});
    std::vector<kv::SequenceBlocks> seqs;
    const StepBatch b = make_batch(cache, seqs, {{ids(5, 1), 0}, {ids(1, 2), 9}, {ids(1, 3), 3}, {ids(6, 4), 0}});
    const auto [m0, m1] = split_microbatches(b);
    // 13 tokens: after 3 requests 7, after 2 requests 6 — both 1 from half; the first such split wins.
    EXPECT_EQ(m0.num_requests(), 2);
    EXPECT_EQ(m1.num_requests(), 2);
    EXPECT_EQ(m0.num_tokens() + m1.num_tokens(), b.num_tokens());
    EXPECT_EQ(m1.query_start, (std::vector<int32_t>{0, 1, 7}));
    EXPECT_EQ(std::vector<int32_t>(b.tokens.begin() + 6, b.tokens.end()), m1.tokens);
    EXPECT_EQ(std::vector<int32_t>(b.slots.begin() + 6, b.slots.end()), m1.slots);
    EXPECT_EQ(m1.kv_len, (std::vector<int32_t>{4, 6}));
    EXPECT_EQ(m1.block_table.size(), 2u * static_cast<size_t>(b.max_blocks));
    // Logit rows: request 0's last (4), request 1's only (5); request 2's last (6 -> 0), request 3's all.
    EXPECT_EQ(m0.logit_rows, (std::vector<int32_t>{4, 5}));
    EXPECT_EQ(m1.logit_rows, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6}));
    EXPECT_TRUE(m0.all_hidden && m1.all_hidden);

    const StepBatch one = make_batch(cache, seqs, {{ids(4, 5), 0}});
    const auto [o0, o1] = split_microbatches(one);
    EXPECT_EQ(o0.num_tokens(), 4);
    EXPECT_EQ(o1.num_tokens(), 0);
    EXPECT_EQ(o1.num_requests(), 0);
    EXPECT_EQ(o1.query_start, (std::vector<int32_t>{0}));

    const auto [e0, e1] = split_microbatches(StepBatchBuilder(cache).build());
    EXPECT_EQ(e0.num_tokens() + e1.num_tokens(), 0);
}

// One process, every expert local: the same step whole and as two microbatches — a prefill step of
// several requests, one of a single request (the second microbatch empty), and a decode-like step
// over what they cached.
TEST_P(Microbatch, LogitsEqualTheStepRunWholeAtEp1) {
    auto m = DeepseekV3::load(dir());
    ThreadPool pool(2);
    const std::vector<std::vector<Req>> steps = {
        {{ids(9, 1), 0}, {ids(3, 2), 0}, {ids(12, 3), 0}, {ids(2, 4), 0}},
        {{ids(7, 5), 0}},
        {{ids(1, 6), 9}, {ids(2, 7), 3}, {ids(1, 8), 12}, {ids(1, 9), 2}},
    };
    for (size_t i = 0; i < steps.size(); ++i) {
        kv::PagedKvCache whole(m->kv_cache_config(32)), split(m->kv_cache_config(32));
        std::vector<kv::SequenceBlocks> sw, ss;
        // The prefixes a decode-like step attends to: the first step's, the same on both caches.
        if (i == 2) {
            const StepBatch pre = make_batch(whole, sw, steps[0]);
            m->forward(pre, whole, {}, Stream{&pool});
            m->forward(make_batch(split, ss, steps[0]), split, {}, Stream{&pool});
        }
        StepBatch a = make_batch(whole, sw, steps[i]);
        StepBatch b = make_batch(split, ss, steps[i]);
        b.microbatch = true;
        const auto ra = m->forward(a, whole, {}, Stream{&pool});
        const auto rb = m->forward(b, split, {}, Stream{&pool});
        EXPECT_LE(max_diff(ra.logits, rb.logits), 1e-5) << "step " << i;
        EXPECT_LE(max_diff(ra.hidden, rb.hidden), 1e-5) << "step " << i;
        // And the KV both wrote: the next step over the same tokens reads it.
        if (i == 0) {
            const StepBatch na = make_batch(whole, sw, steps[2]);
            StepBatch nb = make_batch(split, ss, steps[2]);
            EXPECT_LE(max_diff(m->forward(na, whole, {}, Stream{&pool}).logits,
                               m->forward(nb, split, {}, Stream{&pool}).logits),
                      1e-5);
        }
    }
}

// EP4, ranks as threads, each with its own batch: 4 requests, 1 request (an empty second
// microbatch), none (two empty ones), 2 requests. Every rank's logits with the schedule on equal
// its logits with it off.
TEST_P(Microbatch, LogitsEqualTheStepRunWholeAtEp4WithEmptyRanks) {
    constexpr int kEp = 4;
    std::vector<std::unique_ptr<DeepseekV3>> models;
    for (int r = 0; r < kEp; ++r) models.push_back(DeepseekV3::load(dir(), ParallelConfig{r, kEp, 1}));
    comm::LocalFabric first(models[0]->ep_config(ParallelConfig{0, kEp, 1}, kMaxTokens)),
        second(models[0]->ep_config(ParallelConfig{0, kEp, 1}, kMaxTokens));
    std::vector<std::unique_ptr<comm::ExpertParallel>> ep0, ep1;
    for (int r = 0; r < kEp; ++r) {
        ep0.push_back(first.endpoint(r));
        ep1.push_back(second.endpoint(r));
    }
    const std::vector<std::vector<Req>> per_rank = {
        {{ids(9, 1), 0}, {ids(3, 2), 0}, {ids(12, 3), 0}, {ids(2, 4), 0}},
        {{ids(7, 5), 0}},
        {},
        {{ids(5, 6), 0}, {ids(4, 7), 0}},
    };
    // One lockstep step of every rank with the schedule on or off; each rank's logits.
    const auto step = [&](bool microbatch) {
        std::vector<Tensor> out(kEp);
        std::vector<std::string> errors(kEp);
        std::vector<std::thread> threads;
        for (int r = 0; r < kEp; ++r)
            threads.emplace_back([&, r] {
                try {
                    kv::PagedKvCache cache(models[r]->kv_cache_config(32));
                    std::vector<kv::SequenceBlocks> seqs;
                    StepBatch b = make_batch(cache, seqs, per_rank[r]);
                    b.microbatch = microbatch;
                    ForwardOptions o;
                    o.ep = ep0[r].get();
                    o.microbatch_ep = ep1[r].get();
                    ThreadPool pool(1);
                    out[r] = models[r]->forward(b, cache, o, Stream{&pool}).logits;
                } catch (const std::exception& e) {
                    errors[r] = e.what();
                    first.abort(e.what());
                    second.abort(e.what());
                }
            });
        for (auto& t : threads) t.join();
        for (int r = 0; r < kEp; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
        return out;
    };
    const auto off = step(false), on = step(true);
    for (int r = 0; r < kEp; ++r) EXPECT_LE(max_diff(off[r], on[r]), 1e-5) << "rank " << r;
    EXPECT_EQ(on[2].numel(), 0);

    // Without the second microbatch's endpoint the step says what is missing.
    kv::PagedKvCache cache(models[0]->kv_cache_config(4));
    std::vector<kv::SequenceBlocks> seqs;
    StepBatch b = make_batch(cache, seqs, {{ids(3, 1), 0}});
    b.microbatch = true;
    ForwardOptions o;
    o.ep = ep0[0].get();
    ThreadPool pool(1);
    EXPECT_THAT(error_of([&] { models[0]->forward(b, cache, o, Stream{&pool}); }),
                HasSubstr("needs the second microbatch's EP group"));
}

// EpThreadGroup (score --ep N): the followers' empty steps take rank 0's schedule.
TEST_P(Microbatch, AThreadGroupFollowsRankZerosSchedule) {
    std::vector<std::unique_ptr<DeepseekV3>> models;
    for (int r = 0; r < 4; ++r) models.push_back(DeepseekV3::load(dir(), ParallelConfig{r, 4, 1}));
    EpThreadGroup group(std::move(models), kMaxTokens, {}, 1);
    std::vector<Tensor> got;
    for (const bool microbatch : {false, true, false, true}) {
        kv::PagedKvCache cache(group.lead().kv_cache_config(16));
        std::vector<kv::SequenceBlocks> seqs;
        StepBatch b = make_batch(cache, seqs, {{ids(9, 1), 0}, {ids(4, 2), 0}});
        b.microbatch = microbatch;
        got.push_back(group.forward(b, cache).logits);
    }
    for (size_t i = 1; i < got.size(); ++i) EXPECT_LE(max_diff(got[0], got[i]), 1e-5) << i;
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, Microbatch, ::testing::Values("bf16", "fp8"));

}  // namespace
}  // namespace fanout::model

#include <gtest/gtest.h>

#include <numeric>

#include "fanout/engine/scheduler.h"

namespace fanout::engine {
namespace {

std::shared_ptr<Sequence> make_seq(int64_t id, int prompt, int start = 0) {
    auto s = std::make_shared<Sequence>();
    s->id = id;
    s->tokens.resize(prompt);
    std::iota(s->tokens.begin(), s->tokens.end(), start);
    s->prompt_len = prompt;
    s->max_tokens = 100;
    return s;
}

int64_t scheduled_tokens(const std::vector<ScheduledSeq>& w) {
    int64_t n = 0;
    for (const auto& s : w) n += s.num_tokens;
    return n;
}

// Pretends the step ran: the sequences that asked for logits get one new token.
void run(Scheduler& sched, const std::vector<ScheduledSeq>& w) {
    sched.commit(w);
    for (const auto& s : w)
        if (s.wants_logits) s.seq->tokens.push_back(7);
}

TEST(Scheduler, ChunksPrefillUnderTheTokenBudgetAndMixesDecode) {
    kv::BlockAllocator alloc(64);
    kv::PrefixCache pc(alloc, 4);
    Scheduler sched({8, 10, 6}, pc);  // 8 seqs, 10 tokens a step, 6-token prefill chunks
    auto a = make_seq(1, 3), b = make_seq(2, 14);
    sched.add(a);
    sched.add(b);
    auto w = sched.schedule();
    ASSERT_EQ(w.size(), 2u);
    EXPECT_EQ(w[0].num_tokens, 3);  // a's whole prompt
    EXPECT_TRUE(w[0].wants_logits);
    EXPECT_EQ(w[1].num_tokens, 6);  // b's first chunk
    EXPECT_FALSE(w[1].wants_logits);
    run(sched, w);
    w = sched.schedule();  // a decodes 1, b prefills 6
    EXPECT_EQ(w[0].num_tokens, 1);
    EXPECT_EQ(w[1].start, 6);
    EXPECT_EQ(w[1].num_tokens, 6);
    EXPECT_LE(scheduled_tokens(w), 10);
    run(sched, w);
    w = sched.schedule();
    EXPECT_EQ(w[1].num_tokens, 2);  // b's last 2 prompt tokens, then its first sample
    EXPECT_TRUE(w[1].wants_logits);
}

TEST(Scheduler, AdmitsFirstComeFirstServedUpToTheSequenceCap) {
    kv::BlockAllocator alloc(64);
    kv::PrefixCache pc(alloc, 4);
    Scheduler sched({2, 100, 100}, pc);
    for (int i = 1; i <= 4; ++i) sched.add(make_seq(i, 3));
    auto w = sched.schedule();
    ASSERT_EQ(w.size(), 2u);
    EXPECT_EQ(w[0].seq->id, 1);
    EXPECT_EQ(w[1].seq->id, 2);
    EXPECT_EQ(sched.num_waiting(), 2);
    run(sched, w);
    sched.finish(w[0].seq);
    w = sched.schedule();
    ASSERT_EQ(w.size(), 2u);
    EXPECT_EQ(w[1].seq->id, 3);  // the next in line, not 4
}

TEST(Scheduler, PreemptsTheYoungestByRecomputeWhenBlocksRunOut) {
    kv::BlockAllocator alloc(4);
    kv::PrefixCache pc(alloc, 4);
    Scheduler sched({8, 100, 100}, pc);
    auto a = make_seq(1, 8), b = make_seq(2, 8, 100);  // 2 blocks each: all 4
    sched.add(a);
    sched.add(b);
    auto w = sched.schedule();
    ASSERT_EQ(w.size(), 2u);
    run(sched, w);  // each now has 9 tokens: the next step needs a third block each
    w = sched.schedule();
    ASSERT_EQ(w.size(), 1u);
    EXPECT_EQ(w[0].seq->id, 1);
    EXPECT_EQ(b->num_preemptions, 1);
    EXPECT_EQ(b->num_computed, 0);
    EXPECT_EQ(sched.num_waiting(), 1);
    run(sched, w);
    sched.finish(a.get());
    w = sched.schedule();  // b returns, recomputing prompt + its output; its full blocks came back from the cache
    ASSERT_EQ(w.size(), 1u);
    EXPECT_EQ(w[0].seq->id, 2);
    EXPECT_EQ(w[0].start + w[0].num_tokens, 9);
}

TEST(Scheduler, ReusesCachedPrefixesButAlwaysComputesTheLastToken) {
    kv::BlockAllocator alloc(16);
    kv::PrefixCache pc(alloc, 4);
    Scheduler sched({8, 100, 100}, pc);
    auto a = make_seq(1, 10);
    sched.add(a);
    auto w = sched.schedule();
    run(sched, w);
    sched.finish(a.get());
    auto b = make_seq(2, 12);  // shares a's first 10 tokens: 2 full blocks cached
    sched.add(b);
    w = sched.schedule();
    ASSERT_EQ(w.size(), 1u);
    EXPECT_EQ(w[0].start, 8);
    EXPECT_EQ(b->prefix_hit_tokens, 8);
    auto c = make_seq(3, 8);  // fully cached prompt: the last block is recomputed for its logits
    sched.add(c);
    w = sched.schedule();
    EXPECT_EQ(c->prefix_hit_tokens, 4);
}

}  // namespace
}  // namespace fanout::engine

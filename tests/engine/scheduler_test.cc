#include "fanout/engine/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

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

// A scheduler config that prices every pair at `a` (no long-chunk price).
SchedulerConfig at_price(double a) {
    SchedulerConfig c;
    c.attention_cost_per_pair = a;
    return c;
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

// MTP's lookahead reserves KV slots past a chunk that samples, but never past the context: a
// sequence never holds more blocks than the context needs (the GPU runner refuses such a step).
TEST(Scheduler, DraftLookaheadStopsAtTheContext) {
    kv::BlockAllocator alloc(64);
    kv::PrefixCache pc(alloc, 64);
    SchedulerConfig c{8, 256, 256};
    c.draft_lookahead = 2;
    c.max_context = 128;
    Scheduler sched(c, pc);
    auto a = make_seq(1, 127);  // its sample lands at position 127, the context's last
    sched.add(a);
    auto w = sched.schedule();
    ASSERT_EQ(w.size(), 1u);
    EXPECT_TRUE(w[0].wants_logits);
    EXPECT_EQ(a->blocks.size(), 2u);  // 127 + 2 slots would need 3 blocks of 64
    // Inside the context the lookahead still reserves its slots.
    auto b = make_seq(2, 63);
    sched.add(b);
    w = sched.schedule();
    EXPECT_EQ(b->blocks.size(), 2u);  // 63 tokens + 2 lookahead slots
}

// A step lists its decodes before its prefill chunks (the GPU model runs the two in different
// attention forms), each group in arrival order; budget still goes by arrival.
TEST(Scheduler, ListsDecodesBeforePrefillChunks) {
    kv::BlockAllocator alloc(64);
    kv::PrefixCache pc(alloc, 4);
    Scheduler sched({8, 40, 8}, pc);
    auto a = make_seq(1, 20), b = make_seq(2, 3, 100), c = make_seq(3, 2, 200);
    sched.add(a);
    sched.add(b);
    sched.add(c);
    auto w = sched.schedule();  // a's first chunk, b's and c's whole prompts: no decode yet
    ASSERT_EQ(w.size(), 3u);
    EXPECT_EQ(w[0].seq->id, 1);
    EXPECT_EQ(w[1].seq->id, 2);
    EXPECT_EQ(w[2].seq->id, 3);
    run(sched, w);
    auto d = make_seq(4, 12, 300);
    sched.add(d);
    w = sched.schedule();  // b and c decode; a (arrived first) and d prefill after them
    ASSERT_EQ(w.size(), 4u);
    EXPECT_EQ(w[0].seq->id, 2);
    EXPECT_EQ(w[1].seq->id, 3);
    EXPECT_EQ(w[2].seq->id, 1);
    EXPECT_EQ(w[3].seq->id, 4);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(w[i].is_decode(), i < 2) << i;
    EXPECT_EQ(w[2].start, 8);
    EXPECT_EQ(w[2].num_tokens, 8);
    run(sched, w);
    // A prompt's last token alone counts as a decode too (one query row at the end): under a tight
    // budget e (arrived after f) gets its 9-token prompt 4 tokens a step, then its last token is
    // listed ahead of f's chunk.
    Scheduler tight({8, 12, 8}, pc);
    auto f = make_seq(6, 20, 500), e = make_seq(5, 9, 400);
    tight.add(f);
    tight.add(e);
    bool tail_first = false;
    for (int step = 0; step < 4; ++step) {
        w = tight.schedule();
        for (size_t i = 1; i < w.size(); ++i) EXPECT_FALSE(!w[i - 1].is_decode() && w[i].is_decode()) << step;
        if (w.size() == 2 && w[0].seq->id == 5 && w[0].num_tokens == 1 && !w[1].is_decode()) tail_first = true;
        run(tight, w);
    }
    EXPECT_TRUE(tail_first);
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

// The cost of a chunk in closed form is the sum over its tokens, and tokens_within is the
// largest chunk whose cost fits (checked against a linear search).
TEST(SchedulerCost, ClosedFormAndLargestFittingChunk) {
    std::mt19937_64 rng(3);
    for (const double a : {0.0, 1e-5, 7e-4, 0.01, 0.5}) {
        for (int trial = 0; trial < 200; ++trial) {
            const int64_t start = static_cast<int64_t>(rng() % 200000),
                          max_tokens = 1 + static_cast<int64_t>(rng() % 600);
            double sum = 0;
            for (int64_t i = 0; i < max_tokens; ++i) sum += 1.0 + a * static_cast<double>(start + i + 1);
            EXPECT_NEAR(chunk_cost(at_price(a), start, max_tokens), sum, 1e-9 * sum);
            const double budget = static_cast<double>(rng() % 4096) + 0.25 * static_cast<double>(rng() % 4);
            int64_t want = 0;
            while (want < max_tokens && chunk_cost(at_price(a), start, want + 1) <= budget) ++want;
            EXPECT_EQ(tokens_within(at_price(a), start, max_tokens, budget), want)
                << a << " " << start << " " << budget;
        }
    }
    EXPECT_EQ(tokens_within(at_price(0.0), 5, 100, 37.0), 37);  // cost 0: a token count
    EXPECT_EQ(chunk_cost(at_price(0.0), 1000, 12), 12.0);
}

// Long chunks priced apart (SchedulerConfig::long_chunk_*): chunk_cost takes the long price only
// past long_chunk_tokens and within long_chunk_max_context, and tokens_within is still the largest
// chunk that fits (a linear search over the piecewise price), whichever price is the higher.
TEST(SchedulerCost, LongChunksPricedApart) {
    std::mt19937_64 rng(5);
    for (int trial = 0; trial < 3000; ++trial) {
        SchedulerConfig c;
        c.attention_cost_per_pair = std::vector<double>{0.0, 1e-4, 7e-4, 0.02}[rng() % 4];
        c.long_chunk_cost_per_pair = std::vector<double>{-1.0, 0.0, 2e-5, 2e-4, 0.05}[rng() % 5];
        c.long_chunk_cost_per_key = std::vector<double>{0.0, 0.029, 0.5}[rng() % 3];
        c.long_chunk_tokens = static_cast<int64_t>(rng() % 8);
        const int64_t start = static_cast<int64_t>(rng() % 20000), max_tokens = 1 + static_cast<int64_t>(rng() % 600);
        c.long_chunk_max_context = start + static_cast<int64_t>(rng() % 700) - 50;
        const bool priced = c.long_chunk_cost_per_pair >= 0;
        for (int64_t n : {int64_t{1}, c.long_chunk_tokens, c.long_chunk_tokens + 1, max_tokens}) {
            if (n < 1) continue;
            const bool is_long = priced && n > c.long_chunk_tokens && start + n <= c.long_chunk_max_context;
            const double want = is_long ? static_cast<double>(n) +
                                              c.long_chunk_cost_per_pair * (chunk_cost(at_price(1.0), start, n) - n) +
                                              c.long_chunk_cost_per_key * static_cast<double>(start + n)
                                        : chunk_cost(at_price(c.attention_cost_per_pair), start, n);
            EXPECT_NEAR(chunk_cost(c, start, n), want, 1e-9 * want) << trial << " n " << n;
        }
        const double budget = static_cast<double>(rng() % 6000) + 0.5 * static_cast<double>(rng() % 2);
        int64_t want = 0;
        for (int64_t n = 1; n <= max_tokens; ++n)
            if (chunk_cost(c, start, n) <= budget) want = n;
        EXPECT_EQ(tokens_within(c, start, max_tokens, budget), want)
            << "trial " << trial << " start " << start << " budget " << budget;
    }
}

// A long prompt's chunks under the GPU runner's prices: deep in the prompt, a chunk priced at the
// MHA form's pairs (and one expansion of its context) is half as large again as at the absorbed
// form's (1,489 vs 2,513 tokens at 8,000 in).
TEST(SchedulerCost, CheaperLongChunksGrowTheStep) {
    const auto chunk_at = [](bool long_price) {
        kv::BlockAllocator alloc(4096);
        kv::PrefixCache pc(alloc, 16);
        SchedulerConfig c{8, 4096, 4096, false, 2.3e-4};
        if (long_price) {
            c.long_chunk_cost_per_pair = 6.8e-5;
            c.long_chunk_cost_per_key = 0.029;
            c.long_chunk_max_context = 16384;
        }
        Scheduler sched(c, pc);
        auto a = make_seq(1, 12000);
        sched.add(a);
        int64_t last = 0;
        while (a->num_computed < 8000) {
            auto w = sched.schedule();
            last = w.at(0).num_tokens;
            EXPECT_LE(sched.step_cost(w), 4096.0 + 1e-6);
            run(sched, w);
        }
        return last;
    };
    const int64_t absorbed = chunk_at(false), mha = chunk_at(true);
    EXPECT_GT(mha, absorbed * 3 / 2) << "absorbed-form price " << absorbed << " tokens, MHA-form price " << mha;
}

// With attention_cost_per_pair = 0 the budget is a token count, filled to the last token.
TEST(SchedulerCost, ZeroAttentionCostIsTheTokenBudget) {
    kv::BlockAllocator alloc(64);
    kv::PrefixCache pc(alloc, 4);
    Scheduler sched({8, 10, 6, true, 0.0}, pc);
    auto a = make_seq(1, 14), b = make_seq(2, 14, 100), c = make_seq(3, 3, 200);
    sched.add(a);
    sched.add(b);
    sched.add(c);
    auto w = sched.schedule();
    ASSERT_EQ(w.size(), 2u);  // 6 + 4: c waits
    EXPECT_EQ(w[0].num_tokens, 6);
    EXPECT_EQ(w[1].num_tokens, 4);
    EXPECT_EQ(sched.step_cost(w), 10.0);
    run(sched, w);
    w = sched.schedule();  // a's next 6, b's next 4 (the budget, not its chunk), c still waits
    ASSERT_EQ(w.size(), 2u);
    EXPECT_EQ(w[0].num_tokens, 6);
    EXPECT_EQ(w[1].num_tokens, 4);
    EXPECT_EQ(sched.num_waiting(), 1);
}

struct LongPromptRun {
    int64_t steps = 0;
    int64_t max_context_seen = 0;  // the longest context a chunk of the long prompt started at
};

// A long prompt (arrived first) prefills beside `num_decoders` short requests that decode forever.
// Every step: each decoder gets its token, and the step stays within the budget unless it is the
// single guaranteed token. Returns when the long prompt has its first sample.
LongPromptRun run_long_prompt(double a, int64_t budget, int64_t chunk, int64_t prompt, int num_decoders) {
    kv::BlockAllocator alloc(4096);
    kv::PrefixCache pc(alloc, 16);
    Scheduler sched({64, budget, chunk, true, a}, pc);
    auto long_seq = make_seq(1, static_cast<int>(prompt));
    sched.add(long_seq);
    std::vector<std::shared_ptr<Sequence>> decoders;
    for (int i = 0; i < num_decoders; ++i) {
        decoders.push_back(make_seq(10 + i, 5, 1000000 + 10 * i));
        decoders.back()->max_tokens = 1 << 30;
        sched.add(decoders.back());
    }
    LongPromptRun r;
    while (r.steps++ < 100000) {
        const auto w = sched.schedule();
        EXPECT_FALSE(w.empty());
        const bool guaranteed = w.size() == 1 && w[0].num_tokens == 1;
        EXPECT_TRUE(sched.step_cost(w) <= static_cast<double>(budget) || guaranteed)
            << "step " << r.steps << " costs " << sched.step_cost(w) << " over " << budget;
        bool long_done = false;
        for (const auto& d : decoders) {
            if (d->num_generated() == 0) continue;  // still in its (first-step) prefill
            const auto it = std::find_if(w.begin(), w.end(), [&](const ScheduledSeq& s) { return s.seq == d.get(); });
            EXPECT_TRUE(it != w.end()) << "decoder " << d->id << " skipped at step " << r.steps;
            if (::testing::Test::HasFailure()) return r;
        }
        for (const auto& s : w)
            if (s.seq == long_seq.get()) {
                r.max_context_seen = std::max(r.max_context_seen, s.start);
                long_done = s.wants_logits;
            }
        run(sched, w);
        if (long_done) break;
    }
    EXPECT_EQ(long_seq->num_generated(), 1);
    return r;
}

TEST(SchedulerCost, DecodersKeepMovingBesideALongPrefillWhichStillFinishes) {
    // 20k tokens at 1e-3 token-equivalents a pair: 220k token-equivalents in all, a token at the
    // end of the prompt costs 21.
    const LongPromptRun r = run_long_prompt(1e-3, 256, 128, 20000, 4);
    EXPECT_GT(r.max_context_seen, 19000);
    // The budget is used: about 220k / (256 - the decoders' share) steps, not 20000.
    EXPECT_LT(r.steps, 1400);
    EXPECT_GT(r.steps, 860);
}

TEST(SchedulerCost, ZeroAttentionCostChunksTheLongPromptByTokens) {
    const LongPromptRun r = run_long_prompt(0.0, 256, 128, 20000, 4);
    EXPECT_EQ(r.steps, 20000 / 128 + 1);  // 128 a step; the decoders' first step takes 20 + 128 ≤ 256
}

// Even one token over the budget: the first work of a step still runs, alone.
TEST(SchedulerCost, GuaranteesOneTokenWhenOneTokenIsOverBudget) {
    kv::BlockAllocator alloc(256);
    kv::PrefixCache pc(alloc, 16);
    Scheduler sched({8, 8, 64, true, 0.01}, pc);  // a token at context 1000 costs 11 > 8
    auto a = make_seq(1, 2000);
    sched.add(a);
    auto w = sched.schedule();  // context 0: 8 token-equivalents hold 7 tokens (7 + 0.01 · 28)
    ASSERT_EQ(w.size(), 1u);
    EXPECT_EQ(w[0].num_tokens, 7);
    int64_t steps = 1;
    run(sched, w);
    while (a->num_computed < 1500) {
        w = sched.schedule();
        ASSERT_EQ(w.size(), 1u);
        EXPECT_GE(w[0].num_tokens, 1);
        EXPECT_TRUE(sched.step_cost(w) <= 8.0 || w[0].num_tokens == 1);
        run(sched, w);
        ++steps;
    }
    EXPECT_EQ(w[0].num_tokens, 1);  // deep in the prompt: one token a step
}

// A sequence whose single token exceeds the budget takes turns with the others: it does not hold
// a decode behind it at a standstill (before, the oldest running sequence got the forced token of
// every step and the budget was spent, so the decode behind it ran nothing until it finished).
TEST(SchedulerCost, AnOverBudgetTokenTakesTurnsWithTheSequencesBehindIt) {
    kv::BlockAllocator alloc(512);
    kv::PrefixCache pc(alloc, 16);
    Scheduler sched({8, 8, 64, true, 0.01}, pc);  // a token at context > 700 costs over 8
    auto a = make_seq(1, 2000), b = make_seq(2, 3);
    sched.add(a);
    sched.add(b);
    int64_t steps = 0, b_ran = 0, a_ran = 0;
    while (a->num_computed < 1500) {
        auto w = sched.schedule();
        ASSERT_FALSE(w.empty());
        const bool deep = a->num_computed > 800;  // a's one token is over budget
        for (const auto& s : w) {
            if (deep && s.seq == b.get()) ++b_ran;
            if (deep && s.seq == a.get()) ++a_ran;
        }
        if (deep) ++steps;
        run(sched, w);
        ASSERT_LT(steps, 2000);
    }
    EXPECT_GT(steps, 100);
    EXPECT_GE(b_ran * 2 + 1, steps) << "b runs at least every other step";
    EXPECT_GE(a_ran * 2 + 1, steps) << "a still runs at least every other step";
}

// Decodes with MTP drafts (three tokens each) that together exceed a plain token budget: they take
// turns, and the turns never take a step past the budget (the GPU runner refuses a step of more
// tokens than it was sized for; a turn given after the budget was spent did that).
TEST(Scheduler, DraftTurnsStayWithinATokenBudget) {
    kv::BlockAllocator alloc(256);
    kv::PrefixCache pc(alloc, 4);
    Scheduler sched({8, 6, 6}, pc);  // 8 sequences, 6 tokens a step
    std::vector<std::shared_ptr<Sequence>> seqs;
    for (int i = 0; i < 4; ++i) {
        seqs.push_back(make_seq(i + 1, 2, 10 * i));
        sched.add(seqs.back());
    }
    std::vector<int> idle(seqs.size(), 0);
    int turns = 0;  // steps where a sequence ran after being passed over
    for (int step = 0; step < 40; ++step) {
        for (auto& q : seqs)  // a decode checks two drafts: three tokens
            if (q->state == SeqState::kRunning && q->num_computed == q->total_len() - 1) q->draft = {1, 2};
        auto w = sched.schedule();
        ASSERT_LE(scheduled_tokens(w), 6) << "step " << step;
        for (size_t k = 0; k < seqs.size(); ++k) {
            const bool ran =
                std::any_of(w.begin(), w.end(), [&](const ScheduledSeq& x) { return x.seq == seqs[k].get(); });
            if (ran && idle[k] > 0) ++turns;
            idle[k] = ran || seqs[k]->state != SeqState::kRunning ? 0 : idle[k] + 1;  // admission is FCFS
            EXPECT_LE(idle[k], 2) << "sequence " << k << " at step " << step;
        }
        sched.commit(w);
        for (const auto& x : w) {  // every draft rejected: the checked token is the next one
            Sequence* q = x.seq;
            q->draft.clear();
            q->num_computed = std::min(q->num_computed, q->total_len());
            if (x.wants_logits) q->tokens.push_back(7);
        }
    }
    EXPECT_GT(turns, 10) << "the decodes did not outgrow the budget: the test checks nothing";
}

// A request arriving while a long prompt is deep in its prefill gets its whole (short) prompt in
// the next step: a chunk first takes at most prefill_chunk token-equivalents, leaving it room.
TEST(SchedulerCost, NewRequestIsAdmittedBesideADeepLongPrefill) {
    kv::BlockAllocator alloc(4096);
    kv::PrefixCache pc(alloc, 16);
    const double a = 1e-3;
    Scheduler sched({64, 1024, 256, true, a}, pc);
    auto long_seq = make_seq(1, 40000);
    sched.add(long_seq);
    while (long_seq->num_computed < 30000) run(sched, sched.schedule());
    auto w = sched.schedule();  // alone: it grows into the whole budget
    ASSERT_EQ(w.size(), 1u);
    EXPECT_GT(sched.step_cost(w), 1024 - 40);
    EXPECT_LE(sched.step_cost(w), 1024);
    run(sched, w);
    auto fresh = make_seq(2, 200, 500000);
    sched.add(fresh);
    w = sched.schedule();
    ASSERT_EQ(w.size(), 2u);
    EXPECT_EQ(w[1].seq, fresh.get());
    EXPECT_EQ(w[1].num_tokens, 200);  // cost 200 + 20.1
    EXPECT_TRUE(w[1].wants_logits);
    EXPECT_LE(sched.step_cost(w), 1024);
    EXPECT_GT(sched.step_cost(w), 1024 - 40);  // the long prompt took the rest
}

TEST(SchedulerCost, RejectsANegativeOrNonFiniteCost) {
    kv::BlockAllocator alloc(4);
    kv::PrefixCache pc(alloc, 4);
    EXPECT_THROW(Scheduler({8, 10, 6, true, -1e-3}, pc), Error);
    EXPECT_THROW(Scheduler({8, 10, 6, true, NAN}, pc), Error);
}

}  // namespace
}  // namespace fanout::engine

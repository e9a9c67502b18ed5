// Expert parallelism inside the CPU model: EP ranks as threads over the `local` backend (f32
// payload), each holding its block of routed experts, stepping in lockstep — a rank without
// requests runs an empty step and still takes part in every MoE layer's dispatch and combine. The
// logits of a request equal the model that holds every expert (within 1e-5: the same arithmetic
// except the order of the final sums) and are bit-identical across EP sizes; greedy generations
// are identical; ranks run different requests at the same time (data-parallel attention).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "fanout/comm/local_ep.h"
#include "fanout/model/ep_group.h"
#include "fanout/model/generate.h"
#include "fanout/model/synthetic.h"
#include "small_models.h"
#include "test_util.h"

namespace fanout::model {
namespace {

using fanout::testing::error_of;
using ::testing::HasSubstr;
using testing::kMaxTokens;
using testing::max_diff;
using testing::small_config;

// One rank: its model (its experts), cache and EP endpoint.
struct Rank {
    std::unique_ptr<DeepseekV3> model;
    std::unique_ptr<kv::PagedKvCache> cache;
    std::unique_ptr<comm::ExpertParallel> ep;
    kv::SequenceBlocks seq;
};

// `ep` ranks of the model at `dir`, as threads would hold them.
class Group {
  public:
    Group(const std::string& dir, int ep) {
        for (int r = 0; r < ep; ++r) {
            Rank k;
            k.model = DeepseekV3::load(dir, ParallelConfig{r, ep, 1});
            k.cache = std::make_unique<kv::PagedKvCache>(k.model->kv_cache_config(16));
            ranks_.push_back(std::move(k));
        }
        fabric_ = std::make_unique<comm::LocalFabric>(ranks_[0].model->ep_config(ParallelConfig{0, ep, 1}, kMaxTokens));
        for (int r = 0; r < ep; ++r) ranks_[r].ep = fabric_->endpoint(r);
    }
    int size() const { return static_cast<int>(ranks_.size()); }
    Rank& rank(int r) { return ranks_[static_cast<size_t>(r)]; }

    // One lockstep step: rank r runs `tokens[r]` (empty: no request this step) appended to its
    // sequence at `start[r]`; returns each rank's logits (every position's).
    std::vector<Tensor> step(const std::vector<std::vector<int32_t>>& tokens, const std::vector<int64_t>& start) {
        std::vector<Tensor> logits(ranks_.size());
        std::vector<std::string> errors(ranks_.size());
        std::vector<std::thread> threads;
        for (int r = 0; r < size(); ++r)
            threads.emplace_back([&, r] {
                try {
                    Rank& k = rank(r);
                    StepBatchBuilder b(*k.cache);
                    if (!tokens[r].empty()) {
                        k.cache->reserve(k.seq, start[r] + static_cast<int64_t>(tokens[r].size()));
                        b.add(tokens[r], start[r], k.seq, StepBatchBuilder::Logits::kAll);
                    }
                    ForwardOptions o;
                    o.ep = k.ep.get();
                    ThreadPool pool(1);
                    logits[r] = k.model->forward(b.build(), *k.cache, o, Stream{&pool}).logits;
                } catch (const std::exception& e) {
                    errors[r] = e.what();
                    fabric_->abort("rank " + std::to_string(r) + " failed: " + e.what());
                }
            });
        for (auto& t : threads) t.join();
        last_errors_ = errors;
        if (expect_ok_)
            for (int r = 0; r < size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
        return logits;
    }
    void expect_failures() { expect_ok_ = false; }
    const std::vector<std::string>& last_errors() const { return last_errors_; }

  private:
    std::vector<Rank> ranks_;
    std::unique_ptr<comm::LocalFabric> fabric_;
    bool expect_ok_ = true;
    std::vector<std::string> last_errors_;
};

// The model holding every expert, no EP group: the reference.
Tensor reference_logits(const std::string& dir, const std::vector<int32_t>& ids) {
    auto m = DeepseekV3::load(dir);
    kv::PagedKvCache cache(m->kv_cache_config(16));
    kv::SequenceBlocks seq;
    cache.reserve(seq, static_cast<int64_t>(ids.size()));
    ThreadPool pool(1);
    return m
        ->forward(StepBatchBuilder(cache).add(ids, 0, seq, StepBatchBuilder::Logits::kAll).build(), cache, {},
                  Stream{&pool})
        .logits;
}

class EpModelTest : public testing::SmallModels {};

const std::vector<int32_t> kPrompt = {5, 17, 300, 2, 999, 41, 7, 7, 123, 64, 1, 500, 88, 3, 250, 600, 12};

TEST_P(EpModelTest, LogitsEqualTheModelHoldingEveryExpert) {
    const Tensor ref = reference_logits(dir(), kPrompt);
    Tensor ep1;
    for (int ep : {1, 2, 4}) {
        Group g(dir(), ep);
        std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(ep));
        tokens[0] = kPrompt;  // the other ranks have no request: empty steps
        const Tensor got = g.step(tokens, std::vector<int64_t>(static_cast<size_t>(ep), 0))[0];
        EXPECT_LE(max_diff(got, ref), 1e-5) << "EP" << ep;
        if (ep == 1)
            ep1 = got;
        else
            EXPECT_EQ(max_diff(got, ep1), 0.0) << "EP" << ep << " vs EP1: the same sums in the same order";
    }
}

TEST_P(EpModelTest, RanksServeTheirOwnRequestsInLockstep) {
    // Rank 0 and rank 2 of EP4 each prefill a different prompt in the same steps (ranks 1 and 3 idle);
    // each equals its prompt run alone on the full model.
    const std::vector<int32_t> other = {9, 8, 7, 6, 5, 4, 3, 2, 1};
    Group g(dir(), 4);
    std::vector<std::vector<int32_t>> tokens(4);
    tokens[0] = kPrompt;
    tokens[2] = other;
    const auto got = g.step(tokens, {0, 0, 0, 0});
    EXPECT_LE(max_diff(got[0], reference_logits(dir(), kPrompt)), 1e-5);
    EXPECT_LE(max_diff(got[2], reference_logits(dir(), other)), 1e-5);
    EXPECT_EQ(got[1].numel(), 0);
}

TEST_P(EpModelTest, GreedyGenerationIsTheSame) {
    // Rank 1 of EP2 generates 8 tokens greedily (prefill, then one token a step) while rank 0 idles;
    // the tokens equal the full model's greedy tokens.
    auto full = DeepseekV3::load(dir());
    kv::PagedKvCache cache(full->kv_cache_config(16));
    GenerateRequest req;
    req.prompt = kPrompt;
    req.max_tokens = 8;
    req.ignore_eos = true;
    ThreadPool pool(1);
    const std::vector<int32_t> want = generate(*full, cache, req, {}, Stream{&pool}).tokens;

    Group g(dir(), 2);
    std::vector<int32_t> seq = kPrompt, got;
    int64_t start = 0;
    std::vector<int32_t> next = kPrompt;
    for (int i = 0; i < 8; ++i) {
        const auto logits = g.step({{}, next}, {0, start});
        const Tensor& l = logits[1];
        const int64_t V = l.dim(1), last = l.dim(0) - 1;
        const float* row = l.data_as<float>() + last * V;
        const int32_t tok = static_cast<int32_t>(std::max_element(row, row + V) - row);
        got.push_back(tok);
        start += static_cast<int64_t>(next.size());
        next = {tok};
    }
    EXPECT_EQ(got, want);
}

TEST_P(EpModelTest, ARankThatFailsStopsTheGroupNamingIt) {
    // Rank 2 of EP4 gets a token id past the vocabulary and throws before its first MoE layer;
    // ranks 0, 1 and 3, waiting for it in dispatch, stop with its error instead of hanging.
    Group g(dir(), 4);
    g.expect_failures();
    std::vector<std::vector<int32_t>> tokens(4);
    tokens[0] = kPrompt;
    tokens[2] = {1, 2, 5000};
    const auto t0 = std::chrono::steady_clock::now();
    g.step(tokens, {0, 0, 0, 0});
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
    EXPECT_THAT(g.last_errors()[2], HasSubstr("token id 5000"));
    for (int r : {0, 1, 3}) EXPECT_THAT(g.last_errors()[r], HasSubstr("rank 2 failed")) << "rank " << r;
}

TEST_P(EpModelTest, AThreadGroupStepsAsOneAndStopsOnAFailure) {
    // EpThreadGroup (the CLI's --ep): rank 0's steps, the others following with empty steps.
    std::vector<std::unique_ptr<DeepseekV3>> models;
    for (int r = 0; r < 4; ++r) models.push_back(DeepseekV3::load(dir(), ParallelConfig{r, 4, 1}));
    EpThreadGroup group(std::move(models), kMaxTokens, {}, 1);
    kv::PagedKvCache cache(group.lead().kv_cache_config(16));
    kv::SequenceBlocks seq;
    cache.reserve(seq, static_cast<int64_t>(kPrompt.size()));
    for (int i = 0; i < 2; ++i) {  // twice: the followers keep in step
        kv::PagedKvCache c2(group.lead().kv_cache_config(16));
        kv::SequenceBlocks s2;
        c2.reserve(s2, static_cast<int64_t>(kPrompt.size()));
        const Tensor got =
            group.forward(StepBatchBuilder(c2).add(kPrompt, 0, s2, StepBatchBuilder::Logits::kAll).build(), c2).logits;
        EXPECT_LE(max_diff(got, reference_logits(dir(), kPrompt)), 1e-5);
    }
    const std::vector<int32_t> bad = {1, 5000};
    EXPECT_THAT(error_of([&] { group.forward(StepBatchBuilder(cache).add(bad, 0, seq).build(), cache); }),
                HasSubstr("EP rank 0 of 4 failed: token id 5000"));
    EXPECT_THAT(error_of([&] { group.forward(StepBatchBuilder(cache).add(kPrompt, 0, seq).build(), cache); }),
                HasSubstr("EP rank 0 of 4 failed"));  // the group stays stopped
}

TEST(EpLocalFabric, ARankThatNeverArrivesIsATimeoutNamingIt) {
    comm::LocalFabric fabric({0, 2, 4, 1, 8, 4, comm::Payload::kF32, 0}, std::chrono::milliseconds(200));
    auto ep = fabric.endpoint(0);
    const int32_t T = 0;
    ep->dispatch_send({&T, nullptr, nullptr, nullptr});
    EXPECT_THAT(error_of([&] { ep->dispatch_recv(); }), HasSubstr("rank 0 waited 200 ms at dispatch for rank(s) 1"));
}

TEST_P(EpModelTest, AMismatchedGroupIsAClearError) {
    // A rank's model loaded for EP2 but given an EP4 endpoint: refused, naming both.
    auto m = DeepseekV3::load(dir(), ParallelConfig{0, 2, 1});
    comm::LocalFabric fabric(m->ep_config(ParallelConfig{0, 4, 1}, kMaxTokens));
    auto ep = fabric.endpoint(0);
    kv::PagedKvCache cache(m->kv_cache_config(4));
    kv::SequenceBlocks seq;
    cache.reserve(seq, 3);
    ForwardOptions o;
    o.ep = ep.get();
    ThreadPool pool(1);
    const std::string msg = error_of([&] {
        m->forward(StepBatchBuilder(cache).add(std::vector<int32_t>{1, 2, 3}, 0, seq).build(), cache, o, Stream{&pool});
    });
    EXPECT_THAT(msg, HasSubstr("does not match the experts this model holds"));
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, EpModelTest, ::testing::Values("bf16", "fp8"));

}  // namespace
}  // namespace fanout::model

// Tensor-parallel attention in the CPU model (ForwardOptions::tp): a DP group's tp ranks, threads
// joined by a TP group and the `local` EP fabric, each compute their share of the heads (q_b,
// kv_b, o_proj sliced per head at load) and the MoE half on their slice of the tokens. TP2 (one DP
// group of two ranks) and TP2 × DP2 (EP4: two groups, different requests) give the logits of the
// model holding every head and expert, within 1e-5, with the bf16 and the FP8 checkpoint, as two
// microbatches too; the weights hold exactly the rank's heads; a model of another TP rank is a clear
// error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "fanout/comm/local_ep.h"
#include "fanout/comm/tensor_parallel.h"
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

// Requests (tokens from position 0) as one step on `cache`, every row's logits.
StepBatch prefill(kv::PagedKvCache& cache, std::vector<kv::SequenceBlocks>& seqs,
                  const std::vector<std::vector<int32_t>>& reqs) {
    StepBatchBuilder b(cache);
    seqs.resize(reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
        cache.reserve(seqs[i], static_cast<int64_t>(reqs[i].size()));
        b.add(reqs[i], 0, seqs[i], StepBatchBuilder::Logits::kAll);
    }
    return b.build();
}

class TpModel : public testing::SmallModels {
  protected:
    // The logits of `reqs` from the model holding everything.
    Tensor reference(const std::vector<std::vector<int32_t>>& reqs) {
        auto m = DeepseekV3::load(dir());
        kv::PagedKvCache cache(m->kv_cache_config(16));
        std::vector<kv::SequenceBlocks> seqs;
        ThreadPool pool(1);
        return m->forward(prefill(cache, seqs, reqs), cache, {}, Stream{&pool}).logits;
    }

    // One step of EP `ep` ranks in TP groups of `tp`: DP group d runs per_group[d]; each rank's logits.
    std::vector<Tensor> run(int ep, int tp, const std::vector<std::vector<std::vector<int32_t>>>& per_group,
                            bool microbatch) {
        std::vector<std::unique_ptr<DeepseekV3>> models;
        for (int r = 0; r < ep; ++r) models.push_back(DeepseekV3::load(dir(), ParallelConfig{r, ep, tp}));
        comm::LocalFabric fabric(models[0]->ep_config(ParallelConfig{0, ep, 1}, kMaxTokens)),
            second(models[0]->ep_config(ParallelConfig{0, ep, 1}, kMaxTokens));
        std::vector<std::unique_ptr<comm::LocalTpGroup>> groups;
        for (int d = 0; d < ep / tp; ++d) groups.push_back(std::make_unique<comm::LocalTpGroup>(tp));
        std::vector<Tensor> out(static_cast<size_t>(ep));
        std::vector<std::string> errors(static_cast<size_t>(ep));
        std::vector<std::unique_ptr<comm::ExpertParallel>> eps, eps2;
        std::vector<std::unique_ptr<comm::TensorParallel>> tps;
        for (int r = 0; r < ep; ++r) {
            eps.push_back(fabric.endpoint(r));
            eps2.push_back(second.endpoint(r));
            tps.push_back(groups[r / tp]->endpoint(r % tp));
        }
        std::vector<std::thread> threads;
        for (int r = 0; r < ep; ++r)
            threads.emplace_back([&, r] {
                try {
                    kv::PagedKvCache cache(models[r]->kv_cache_config(16));
                    std::vector<kv::SequenceBlocks> seqs;
                    StepBatch b = prefill(cache, seqs, per_group[r / tp]);
                    b.microbatch = microbatch;
                    ForwardOptions o;
                    o.ep = eps[r].get();
                    o.microbatch_ep = eps2[r].get();
                    o.tp = tps[r].get();
                    ThreadPool pool(1);
                    out[r] = models[r]->forward(b, cache, o, Stream{&pool}).logits;
                } catch (const std::exception& e) {
                    errors[r] = e.what();
                    fabric.abort(e.what());
                    second.abort(e.what());
                    for (auto& g : groups) g->abort(e.what());
                }
            });
        for (auto& t : threads) t.join();
        for (int r = 0; r < ep; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
        return out;
    }
};

TEST_P(TpModel, WeightsHoldTheRanksHeads) {
    auto full = DeepseekV3::load(dir());
    auto r1 = DeepseekV3::load(dir(), ParallelConfig{1, 2, 2});
    const io::ModelConfig& c = full->config();
    EXPECT_EQ(r1->heads(), c.num_attention_heads / 2);
    const AttentionWeights& a = r1->weights().layers[0].attn;
    const AttentionWeights& f = full->weights().layers[0].attn;
    ASSERT_EQ(a.q_b.out_features, c.num_attention_heads / 2 * c.qk_head_dim());
    ASSERT_EQ(a.o.in_features, c.num_attention_heads / 2 * c.v_head_dim);
    // Rank 1's first q_b row is the full model's first row of head H/2; its o_proj's first column
    // the full model's column of head H/2's first value.
    std::vector<float> got(static_cast<size_t>(a.q_b.in_features)), want(got.size());
    a.q_b.row_f32(0, got.data());
    f.q_b.row_f32(c.num_attention_heads / 2 * c.qk_head_dim(), want.data());
    EXPECT_EQ(got, want);
    std::vector<float> orow(static_cast<size_t>(a.o.in_features)), frow(static_cast<size_t>(f.o.in_features));
    a.o.row_f32(3, orow.data());
    f.o.row_f32(3, frow.data());
    EXPECT_EQ(orow[0], frow[static_cast<size_t>(c.num_attention_heads / 2 * c.v_head_dim)]);
}

TEST_P(TpModel, Tp2EqualsTheModelHoldingEveryHead) {
    const std::vector<std::vector<int32_t>> reqs = {ids(9, 1), ids(4, 2), ids(13, 3)};
    const Tensor ref = reference(reqs);
    for (const bool microbatch : {false, true}) {
        const auto out = run(2, 2, {reqs}, microbatch);
        for (int r = 0; r < 2; ++r) EXPECT_LE(max_diff(out[r], ref), 1e-5) << "rank " << r << " mb " << microbatch;
    }
}

TEST_P(TpModel, Tp2TimesDp2EqualsEp1) {
    const std::vector<std::vector<int32_t>> a = {ids(9, 1), ids(4, 2)}, b = {ids(1, 4)};  // b: one token, two ranks
    const Tensor ref_a = reference(a), ref_b = reference(b);
    const auto out = run(4, 2, {a, b}, false);
    for (int r : {0, 1}) EXPECT_LE(max_diff(out[r], ref_a), 1e-5) << "rank " << r;
    for (int r : {2, 3}) EXPECT_LE(max_diff(out[r], ref_b), 1e-5) << "rank " << r;
    // A DP group without requests: its TP ranks run empty steps together.
    const auto idle = run(4, 2, {a, {}}, false);
    for (int r : {0, 1}) EXPECT_LE(max_diff(idle[r], ref_a), 1e-5) << "rank " << r;
}

TEST_P(TpModel, AThreadGroupRunsRankZerosStepOnItsTpGroup) {
    const std::vector<std::vector<int32_t>> reqs = {ids(7, 5), ids(3, 6)};
    const Tensor ref = reference(reqs);
    std::vector<std::unique_ptr<DeepseekV3>> models;
    for (int r = 0; r < 4; ++r) models.push_back(DeepseekV3::load(dir(), ParallelConfig{r, 4, 2}));
    EpThreadGroup group(std::move(models), kMaxTokens, {}, 1);
    for (int i = 0; i < 2; ++i) {
        kv::PagedKvCache cache(group.lead().kv_cache_config(16));
        std::vector<kv::SequenceBlocks> seqs;
        EXPECT_LE(max_diff(group.forward(prefill(cache, seqs, reqs), cache).logits, ref), 1e-5) << i;
    }
}

TEST_P(TpModel, AStepWithoutItsTpGroupIsAClearError) {
    auto m = DeepseekV3::load(dir(), ParallelConfig{1, 2, 2});
    kv::PagedKvCache cache(m->kv_cache_config(4));
    std::vector<kv::SequenceBlocks> seqs;
    ThreadPool pool(1);
    EXPECT_THAT(error_of([&] { m->forward(prefill(cache, seqs, {ids(3, 1)}), cache, {}, Stream{&pool}); }),
                HasSubstr("TP rank 1 of 2's heads"));
    EXPECT_THAT(error_of([&] { DeepseekV3::load(dir(), ParallelConfig{0, 8, 8}); }), HasSubstr("do not split evenly"));
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, TpModel, ::testing::Values("bf16", "fp8"));

}  // namespace
}  // namespace fanout::model

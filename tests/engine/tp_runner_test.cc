// A TP group whose ranks past 0 run as processes of their own (DeepseekRunner's channel
// constructor and run_tp_follower), here over the `local` transports in threads — the same bytes the
// `mpi` ones carry between processes (tests/e2e/cli_test.sh runs them under mpirun). EP2 as one DP
// rank of TP2: the leader's forward passes (prefill, decode, as two microbatches) and MTP drafts
// equal the runner whose TP followers are threads; destroying the runner stops the follower; a
// malformed step message is a clear error naming what is wrong, aborting the group.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "../model/small_models.h"
#include "fanout/comm/control_plane.h"
#include "fanout/comm/local_ep.h"
#include "fanout/comm/tensor_parallel.h"
#include "fanout/engine/engine.h"

namespace fanout::engine {
namespace {

using model::testing::ids;
using model::testing::kMaxTokens;
using model::testing::max_diff;
using ::testing::HasSubstr;

class TpRunner : public model::testing::SmallModels {
  protected:
    // The steps every runner is put through, on its cache: a prefill of two requests (every row's
    // logits, hidden states kept), a draft pass over them, then a decode step as two microbatches.
    struct Outputs {
        Tensor prefill, decode;
        std::vector<int32_t> drafts;
    };
    static Outputs steps(ModelRunner& runner) {
        kv::PagedKvCache cache(runner.kv_cache_config(16));
        std::vector<kv::SequenceBlocks> seqs(2);
        const std::vector<std::vector<int32_t>> reqs = {ids(9, 1), ids(4, 2)};
        model::StepBatchBuilder b(cache);
        for (size_t i = 0; i < reqs.size(); ++i) {
            cache.reserve(seqs[i], static_cast<int64_t>(reqs[i].size()) + 2);
            b.add(reqs[i], 0, seqs[i], model::StepBatchBuilder::Logits::kAll);
        }
        model::StepBatch pre = b.build();
        pre.all_hidden = true;
        Outputs out;
        out.prefill = runner.forward(pre, cache);
        // The MTP layer over the last token of each request, reading its kept hidden state.
        model::StepBatchBuilder d(cache);
        std::vector<int32_t> rows;
        for (size_t i = 0; i < reqs.size(); ++i) {
            const int32_t last = reqs[i].back();
            d.add(std::span(&last, 1), static_cast<int64_t>(reqs[i].size()) - 1, seqs[i]);
            rows.push_back(pre.query_start[i + 1] - 1);
        }
        out.drafts = runner.draft_mtp(d.build(), rows, false, cache);
        model::StepBatchBuilder n(cache);
        for (size_t i = 0; i < reqs.size(); ++i) {
            const int32_t next = static_cast<int32_t>(7 + i);
            n.add(std::span(&next, 1), static_cast<int64_t>(reqs[i].size()), seqs[i]);
        }
        model::StepBatch dec = n.build();
        dec.microbatch = true;
        out.decode = runner.forward(dec, cache);
        return out;
    }
};

TEST_P(TpRunner, FollowersAsProcessesComputeWhatThreadsDo) {
    const ParallelConfig r0{0, 2, 2}, r1{1, 2, 2};
    Outputs want;
    {
        comm::LocalFabric fabric(model::DeepseekV3::load(dir())->ep_config(r0, kMaxTokens)),
            second(model::DeepseekV3::load(dir())->ep_config(r0, kMaxTokens));
        std::vector<std::unique_ptr<model::DeepseekV3>> models;
        std::vector<model::ForwardOptions> opts(2);
        std::vector<std::unique_ptr<comm::ExpertParallel>> eps;
        for (int r = 0; r < 2; ++r) {
            models.push_back(model::DeepseekV3::load(dir(), r ? r1 : r0));
            eps.push_back(fabric.endpoint(r));
            eps.push_back(second.endpoint(r));
            opts[r].ep = eps[2 * r].get();
            opts[r].microbatch_ep = eps[2 * r + 1].get();
        }
        DeepseekRunner threads(std::move(models), opts, 1);
        ASSERT_EQ(threads.enable_mtp(1), "");
        want = steps(threads);
    }
    comm::LocalFabric fabric(model::DeepseekV3::load(dir())->ep_config(r0, kMaxTokens)),
        second(model::DeepseekV3::load(dir())->ep_config(r0, kMaxTokens));
    comm::LocalTpGroup tp(2);
    comm::LocalControlHub hub(2);
    auto ep0 = fabric.endpoint(0), ep1 = fabric.endpoint(1), mb0 = second.endpoint(0), mb1 = second.endpoint(1);
    auto channel1 = hub.endpoint(1);
    std::string follower_error = "(running)";
    std::thread follower([&] {
        model::ForwardOptions o;
        o.ep = ep1.get();
        o.microbatch_ep = mb1.get();
        try {
            run_tp_follower(model::DeepseekV3::load(dir(), r1), o, 1, DType::kF32, tp.endpoint(1), *channel1);
            follower_error = "";
        } catch (const std::exception& e) {
            follower_error = e.what();
        }
    });
    {
        model::ForwardOptions o;
        o.ep = ep0.get();
        o.microbatch_ep = mb0.get();
        DeepseekRunner leader(model::DeepseekV3::load(dir(), r0), o, 1, DType::kF32, tp.endpoint(0), hub.endpoint(0));
        ASSERT_EQ(leader.enable_mtp(1), "");
        const Outputs got = steps(leader);
        EXPECT_LE(max_diff(got.prefill, want.prefill), 0.0) << "prefill";
        EXPECT_LE(max_diff(got.decode, want.decode), 0.0) << "decode (two microbatches)";
        EXPECT_EQ(got.drafts, want.drafts);
    }  // the runner stops its follower
    follower.join();
    EXPECT_EQ(follower_error, "");
}

TEST_P(TpRunner, AMalformedStepMessageIsAClearErrorThatStopsTheGroup) {
    // Too short for the magic word; the wrong magic; a valid head whose first array claims more
    // values than the message holds.
    std::vector<uint8_t> huge = {0x46, 0x54, 0x50, 0x4a};
    for (int i = 0; i < 4; ++i) huge.insert(huge.end(), 8, 0);      // kind, flags, max_blocks, num_blocks
    huge.insert(huge.end(), 8, 0);                                  // absorbed_max_query
    huge.insert(huge.end(), {0xff, 0xff, 0xff, 0x0f, 0, 0, 0, 0});  // tokens: 268M values
    const std::vector<std::pair<std::vector<uint8_t>, std::string>> cases = {
        {{1, 2, 3}, "truncated at the magic word"}, {std::vector<uint8_t>(4, 0), "magic 0x0"}, {huge, "tokens claims"}};
    for (const auto& [bad, want] : cases) {
        comm::LocalTpGroup tp(2);
        comm::LocalControlHub hub(2);
        auto leader = hub.endpoint(0), channel1 = hub.endpoint(1);
        std::string error;
        std::thread follower([&] {
            error = fanout::testing::error_of([&] {
                run_tp_follower(model::DeepseekV3::load(dir(), ParallelConfig{1, 2, 2}), {}, 1, DType::kF32,
                                tp.endpoint(1), *channel1);
            });
        });
        leader->broadcast(bad);
        follower.join();
        EXPECT_THAT(error, HasSubstr(want)) << error;
        EXPECT_THAT(hub.abort_reason(), HasSubstr("TP rank 1 of 2 failed")) << "the group is stopped, naming the rank";
    }
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, TpRunner, ::testing::Values("bf16", "fp8"));

}  // namespace
}  // namespace fanout::engine

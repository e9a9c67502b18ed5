// The engine on the GPU runner (`fanout serve --device cuda`): concurrent requests batched into
// one step, decode steps replayed from CUDA graphs, tokens sampled on the device. Labelled `gpu`;
// skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "../model/oracle_fixtures.h"
#include "../model/pinned_routing.h"
#include "cuda_test_util.h"
#include "engine_test_util.h"
#include "fanout/engine/cuda_runner.h"
#include "test_util.h"

namespace fanout::engine {
namespace {

constexpr int kRequests = 6;

// Six requests of different lengths, greedy and seeded (odd ones), through the GPU engine: all
// submitted before the engine starts, so the schedule is the same every run.
std::vector<RequestParams> make_requests() {
    std::vector<RequestParams> params;
    for (int i = 0; i < kRequests; ++i) {
        RequestParams p;
        for (int k = 0; k < 5 + 7 * i; ++k) p.prompt.push_back((i * 37 + k * 11 + 3) % 512);
        p.max_tokens = 12 + i;
        p.ignore_eos = true;
        if (i % 2) p.sampling = {0.9f, 20, 0.95f, static_cast<uint64_t>(100 + i)};
        params.push_back(p);
    }
    return params;
}

std::vector<std::vector<int32_t>> run_engine(const model::DeepseekV3& m, const std::vector<RequestParams>& params,
                                             int mtp = 0, EngineStats* stats = nullptr, bool microbatch = false) {
    model::CudaModelOptions o;
    o.microbatch = microbatch;
    o.num_kv_blocks = 32;
    o.max_requests = 8;
    o.max_step_tokens = 64;
    o.max_context = 256;
    o.mtp_draft_tokens = mtp;
    EngineConfig cfg;
    cfg.num_kv_blocks = 32;
    cfg.scheduler = {8, 64, 16};
    cfg.mtp_draft_tokens = mtp;
    cfg.microbatch = microbatch ? EngineConfig::Microbatch::kOn : EngineConfig::Microbatch::kOff;
    Engine engine(std::make_unique<CudaRunner>(m, o), nullptr, cfg);
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (const auto& p : params) handles.push_back(engine.submit(p));
    engine.start();
    std::vector<std::vector<int32_t>> out;
    for (auto& h : handles) out.push_back(testing::drain(*h));
    engine.stop();
    if (stats) *stats = engine.stats();
    return out;
}

// Where a greedy run left the reference run at token j of `request`: the reference's own top-2
// margin there (a fresh one-request GPU model over the prompt and the first j reference tokens)
// must be within the bf16 difference between the two paths — 4% of the largest |logit|.
void expect_near_tie(const model::DeepseekV3& m, const RequestParams& request, const std::vector<int32_t>& reference,
                     size_t j, const std::string& what) {
    model::CudaModelOptions so;
    so.max_requests = 1;
    so.max_context = 128;
    so.max_step_tokens = 64;
    model::CudaModel gpu(m, so);
    kv::PagedKvCache blocks = gpu.make_block_allocator();
    std::vector<int32_t> seq = request.prompt;
    seq.insert(seq.end(), reference.begin(), reference.begin() + static_cast<std::ptrdiff_t>(j));
    kv::SequenceBlocks sb;
    blocks.reserve(sb, static_cast<int64_t>(seq.size()));
    const Tensor logits = gpu.forward_logits(model::StepBatchBuilder(blocks).add(seq, 0, sb).build());
    const int64_t V = m.config().vocab_size;
    std::vector<float> row(logits.data_as<float>(), logits.data_as<float>() + V);
    const float max_abs = std::max(std::abs(*std::max_element(row.begin(), row.end())),
                                   std::abs(*std::min_element(row.begin(), row.end())));
    std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
    EXPECT_LE(row[0] - row[1], 0.04f * max_abs)
        << what << " token " << j << " differs where the top-2 margin is " << row[0] - row[1];
}

// Batched in one engine (decode steps from CUDA graphs, several requests per step, absorbed-form
// prefill) against each request alone through generate_cuda (MHA-form prefill), on the dense
// fixture: greedy outputs agree until a step where the single run's own top-2 margin is within
// the two paths' bf16 difference (4% of the largest |logit|, as in model_cuda_test); the same
// requests through a fresh engine give the same tokens, sampled ones included (the device
// sampler draws from each request's generator; tests/ops/glue_cuda_test.cc checks it exactly).
TEST(EngineCuda, BatchedRequestsMatchSingleRequestsAndRepeat) {
    REQUIRE_GPU();
    const std::string dir = (fanout::testing::oracle_dir() / "dense_only").string();
    auto m = model::DeepseekV3::load(dir);
    const auto params = make_requests();
    const auto batched = run_engine(*m, params);
    EXPECT_EQ(run_engine(*m, params), batched) << "a second engine run gave other tokens";
    for (int i = 0; i < kRequests; i += 2) {
        model::CudaModelOptions so;
        so.max_requests = 1;
        so.max_context = 64;
        so.max_step_tokens = 64;
        model::CudaModel gpu(*m, so);
        kv::PagedKvCache blocks = gpu.make_block_allocator();
        model::GenerateRequest req;
        req.prompt = params[i].prompt;
        req.max_tokens = params[i].max_tokens;
        req.ignore_eos = true;
        const auto single = model::generate_cuda(gpu, blocks, req).tokens;
        ASSERT_EQ(single.size(), batched[i].size()) << "request " << i;
        size_t j = 0;
        while (j < single.size() && single[j] == batched[i][j]) ++j;
        std::printf("request %d: batched follows the single run for %zu of %zu tokens\n", i, j, single.size());
        if (j < single.size()) expect_near_tie(*m, params[i], single, j, fmt::format("request {}", i));
    }
}

// logit_bias on the GPU runner, through the engine: +100 forces a token (greedy and sampled), −100
// on every token a request produced makes it produce none of them, a request without biases is
// unchanged, and decode steps whose rows bring more biases than the device array first holds
// (1024) grow it and recapture their graphs (the forced tokens hold on every step after).
TEST(EngineCuda, LogitBiasForcesBansAndGrows) {
    REQUIRE_GPU();
    const std::string dir = (fanout::testing::oracle_dir() / "dense_only").string();
    auto m = model::DeepseekV3::load(dir);
    const int32_t V = static_cast<int32_t>(m->config().vocab_size);
    const auto before = run_engine(*m, make_requests());
    auto params = make_requests();
    params[0].sampling.logit_bias = {{V - 1, 100.0f}};         // greedy, forced to the last id
    params[1].sampling.logit_bias = {{0, 5.0f}, {7, 100.0f}};  // sampled, forced
    for (int32_t t : before[2]) params[2].sampling.logit_bias.push_back({t, -100.0f});
    std::sort(params[2].sampling.logit_bias.begin(), params[2].sampling.logit_bias.end());
    params[2].sampling.logit_bias.erase(
        std::unique(params[2].sampling.logit_bias.begin(), params[2].sampling.logit_bias.end(),
                    [](const auto& x, const auto& y) { return x.first == y.first; }),
        params[2].sampling.logit_bias.end());
    for (int i : {3, 5})  // every id, small biases: 2 × V entries in each decode step of all six
        for (int32_t id = 0; id < V; ++id) params[i].sampling.logit_bias.push_back({id, 0.01f * (id % 7)});
    size_t entries = 0;
    for (const auto& p : params) entries += p.sampling.logit_bias.size();
    ASSERT_GT(entries, 1024u);
    const auto got = run_engine(*m, params);
    EXPECT_EQ(got[0], std::vector<int32_t>(got[0].size(), V - 1));
    EXPECT_EQ(got[1], std::vector<int32_t>(got[1].size(), 7));
    for (int32_t t : got[2]) EXPECT_EQ(std::count(before[2].begin(), before[2].end(), t), 0) << t;
    EXPECT_EQ(got[4], before[4]);  // no biases: the same tokens
    EXPECT_EQ(run_engine(*m, params), got) << "a second engine run gave other tokens";
}

// MTP speculative decoding on the GPU runner (the tiny model with its MTP layer, routing pinned):
// drafts checked on the device, the MTP layer over hidden states that never leave it, verification
// steps of 1 + k rows replayed from graphs. Greedy requests give plain greedy's tokens for k = 1..3
// until a step where plain's own top-2 margin is within the bf16 difference between a 1-row and
// a (1 + k)-row step (4% of the largest |logit|); seeded sampled requests repeat exactly in a
// second engine; drafts are made and (random weights) some accepted or none — the counters add up.
TEST(EngineCuda, MtpGreedyFollowsPlainAndRepeats) {
    REQUIRE_GPU();
    const std::string dir = testing::write_tiny_model("engine_cuda_mtp", 512);
    auto m = model::DeepseekV3::load(dir);
    fanout::testing::pin_routing(*m);
    const auto params = make_requests();
    const auto plain = run_engine(*m, params);
    for (int k = 1; k <= 3; ++k) {
        EngineStats st;
        const auto spec = run_engine(*m, params, k, &st);
        EXPECT_EQ(run_engine(*m, params, k), spec) << "k " << k << ": a second engine run gave other tokens";
        EXPECT_GT(st.draft_tokens, 0) << "k " << k;
        EXPECT_LE(st.accepted_draft_tokens, st.draft_tokens);
        std::printf("k %d: %lld of %lld drafts accepted\n", k, static_cast<long long>(st.accepted_draft_tokens),
                    static_cast<long long>(st.draft_tokens));
        for (int i = 0; i < kRequests; i += 2) {  // the greedy ones
            ASSERT_EQ(spec[i].size(), plain[i].size()) << "k " << k << " request " << i;
            size_t j = 0;
            while (j < plain[i].size() && plain[i][j] == spec[i][j]) ++j;
            std::printf("k %d request %d: follows plain greedy for %zu of %zu tokens\n", k, i, j, plain[i].size());
            if (j < plain[i].size()) expect_near_tie(*m, params[i], plain[i], j, fmt::format("k {} request {}", k, i));
        }
    }
    // More drafts than the GPU model was made for is refused, naming both.
    model::CudaModelOptions o;
    o.max_context = 256;
    o.num_kv_blocks = 16;
    o.mtp_draft_tokens = 1;
    EngineConfig cfg;
    cfg.num_kv_blocks = 16;
    cfg.mtp_draft_tokens = 2;
    try {
        Engine engine(std::make_unique<CudaRunner>(*m, o), nullptr, cfg);
        ADD_FAILURE() << "an engine with 2 drafts on a runner made for 1 was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("made for 1 draft"), std::string::npos) << e.what();
    }
    std::filesystem::remove_all(dir);
}

// `--microbatch on` on the GPU: every step as two microbatches (prefill chunks, mixed steps,
// decode graphs of both schedules), without and with MTP. Greedy requests follow the one-batch
// engine's tokens until a step where its own top-2 margin is within the bf16 difference (the
// split changes the GEMMs' row counts); seeded sampled requests repeat exactly in a second
// engine; every step counted as microbatched. An engine asking for the schedule from a runner
// made without it is refused, naming the option.
TEST(EngineCuda, MicrobatchFollowsOneBatchAndRepeats) {
    REQUIRE_GPU();
    const std::string dir = testing::write_tiny_model("engine_cuda_microbatch", 512);
    auto m = model::DeepseekV3::load(dir);
    fanout::testing::pin_routing(*m);
    const auto params = make_requests();
    for (const int mtp : {0, 1}) {
        const auto plain = run_engine(*m, params, mtp);
        EngineStats st;
        const auto two = run_engine(*m, params, mtp, &st, true);
        EXPECT_EQ(run_engine(*m, params, mtp, nullptr, true), two) << "mtp " << mtp << ": a second run differs";
        EXPECT_GT(st.steps, 0);
        EXPECT_EQ(st.microbatch_steps, st.steps) << "mtp " << mtp;
        // Every prompt's first chunk (5 or more tokens) runs the MHA form, in either microbatch.
        EXPECT_GT(st.mha_steps, 0) << "mtp " << mtp;
        EXPECT_GE(st.mha_requests, kRequests) << "mtp " << mtp;
        for (int i = 0; i < kRequests; i += 2) {  // the greedy ones
            ASSERT_EQ(two[i].size(), plain[i].size()) << "mtp " << mtp << " request " << i;
            size_t j = 0;
            while (j < plain[i].size() && plain[i][j] == two[i][j]) ++j;
            std::printf("mtp %d request %d: two microbatches follow one batch for %zu of %zu tokens\n", mtp, i, j,
                        plain[i].size());
            if (j < plain[i].size())
                expect_near_tie(*m, params[i], plain[i], j, fmt::format("mtp {} request {}", mtp, i));
        }
    }
    model::CudaModelOptions o;
    o.max_context = 256;
    o.num_kv_blocks = 16;
    EngineConfig cfg;
    cfg.num_kv_blocks = 16;
    cfg.microbatch = EngineConfig::Microbatch::kOn;
    try {
        Engine engine(std::make_unique<CudaRunner>(*m, o), nullptr, cfg);
        ADD_FAILURE() << "--microbatch on over a runner without the schedule was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("CudaModelOptions::microbatch"), std::string::npos) << e.what();
    }
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fanout::engine

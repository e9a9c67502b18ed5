// The engine on the GPU runner (`fanout serve --device cuda`): concurrent requests batched into
// one step, decode steps replayed from CUDA graphs, tokens sampled on the device. Labelled `gpu`;
// skipped without a GPU.
#include <gtest/gtest.h>

#include "../model/oracle_fixtures.h"
#include "cuda_test_util.h"
#include "fanout/engine/cuda_runner.h"
#include "test_util.h"

namespace fanout::engine {
namespace {

std::vector<int32_t> drain(RequestHandle& h) {
    std::vector<int32_t> toks;
    RequestEvent ev;
    while (h.next(&ev, std::chrono::seconds(60))) {
        toks.insert(toks.end(), ev.tokens.begin(), ev.tokens.end());
        if (ev.finished) return toks;
    }
    ADD_FAILURE() << "request did not finish";
    return toks;
}

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

std::vector<std::vector<int32_t>> run_engine(const model::DeepseekV3& m, const std::vector<RequestParams>& params) {
    model::CudaModelOptions o;
    o.num_kv_blocks = 32;
    o.max_requests = 8;
    o.max_step_tokens = 64;
    o.max_context = 256;
    EngineConfig cfg;
    cfg.num_kv_blocks = 32;
    cfg.scheduler = {8, 64, 16};
    Engine engine(std::make_unique<CudaRunner>(m, o), nullptr, cfg);
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (const auto& p : params) handles.push_back(engine.submit(p));
    engine.start();
    std::vector<std::vector<int32_t>> out;
    for (auto& h : handles) out.push_back(drain(*h));
    engine.stop();
    return out;
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
    const int64_t V = m->config().vocab_size;
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
        if (j == single.size()) continue;
        std::vector<int32_t> seq = req.prompt;
        seq.insert(seq.end(), single.begin(), single.begin() + j);
        kv::SequenceBlocks sb;
        blocks.reserve(sb, static_cast<int64_t>(seq.size()));
        const Tensor logits = gpu.forward_logits(model::StepBatchBuilder(blocks).add(seq, 0, sb).build());
        std::vector<float> row(logits.data_as<float>(), logits.data_as<float>() + V);
        const float max_abs = std::max(std::abs(*std::max_element(row.begin(), row.end())),
                                       std::abs(*std::min_element(row.begin(), row.end())));
        std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
        EXPECT_LE(row[0] - row[1], 0.04f * max_abs)
            << "request " << i << " token " << j << " differs where the top-2 margin is " << row[0] - row[1];
    }
}

}  // namespace
}  // namespace fanout::engine

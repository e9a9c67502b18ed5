// The engine with a deterministic fake model (exact outputs under concurrency, preemption,
// cancellation, stop strings) and with a real synthetic DeepSeek-V3 (batched, prefix-cached,
// preempted outputs equal single-request generation).
#include "fanout/engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <limits>

#include "engine_test_util.h"
#include "fanout/model/generate.h"
#include "fanout/model/synthetic.h"
#include "test_util.h"

namespace fanout::engine {
namespace {

// Next token = (7 * last + position + 3) mod V, as a one-hot logit.
class FakeRunner : public ModelRunner {
  public:
    static constexpr int64_t kVocab = 50;
    int64_t vocab_size() const override { return kVocab; }
    int64_t max_context() const override { return 4096; }
    std::vector<int64_t> eos_ids() const override { return {49}; }
    kv::KvCacheConfig kv_cache_config(int64_t num_blocks) const override { return {1, 1, 4, num_blocks, DType::kF32}; }
    Tensor forward(const model::StepBatch& b, kv::PagedKvCache&) override {
        Tensor logits = Tensor::zeros({static_cast<int64_t>(b.logit_rows.size()), kVocab}, DType::kF32);
        for (size_t i = 0; i < b.logit_rows.size(); ++i) {
            const int32_t r = b.logit_rows[i];
            logits.data_as<float>()[i * kVocab + next(b.tokens[r], b.positions[r])] = 1.0f;
        }
        ++steps;
        return logits;
    }
    static int32_t next(int32_t last, int64_t pos) { return static_cast<int32_t>((7 * last + pos + 3) % kVocab); }
    int steps = 0;
};

std::vector<int32_t> expected(const std::vector<int32_t>& prompt, int64_t max_tokens, bool stop_at_eos) {
    std::vector<int32_t> out;
    int32_t last = prompt.back();
    for (int64_t pos = static_cast<int64_t>(prompt.size()) - 1; static_cast<int64_t>(out.size()) < max_tokens; ++pos) {
        last = FakeRunner::next(last, pos);
        out.push_back(last);
        if (stop_at_eos && last == 49) break;
    }
    return out;
}

// Each engine event within 20 s (the host runner is fast).
std::vector<int32_t> drain(RequestHandle& h, std::string* reason = nullptr, RequestEvent* last = nullptr) {
    return testing::drain(h, reason, last, std::chrono::seconds(20));
}

TEST(Engine, ManyConcurrentRequestsUnderPreemptionGetExactOutputs) {
    EngineConfig cfg;
    cfg.num_kv_blocks = 24;  // 96 token slots for 40 requests of up to 30 tokens: constant preemption
    cfg.scheduler = {16, 32, 8};
    Engine engine(std::make_unique<FakeRunner>(), nullptr, cfg);
    std::vector<std::shared_ptr<RequestHandle>> handles;
    std::vector<RequestParams> params;
    for (int i = 0; i < 40; ++i) {
        // Half queued before the engine runs (so preemption happens however fast it drains), half
        // submitted while it runs.
        if (i == 20) engine.start();
        RequestParams p;
        for (int k = 0; k < 3 + i % 11; ++k) p.prompt.push_back((i * 13 + k) % 49);
        p.max_tokens = 1 + i % 17;
        p.ignore_eos = i % 2 == 0;
        params.push_back(p);
        handles.push_back(engine.submit(p));
    }
    for (size_t i = 0; i < handles.size(); ++i) {
        std::string reason;
        RequestEvent last;
        const auto got = drain(*handles[i], &reason, &last);
        const auto want = expected(params[i].prompt, params[i].max_tokens, !params[i].ignore_eos);
        EXPECT_EQ(got, want) << "request " << i;
        EXPECT_EQ(reason, want.size() < static_cast<size_t>(params[i].max_tokens) ? "stop" : "length");
        EXPECT_EQ(last.completion_tokens, static_cast<int64_t>(want.size()));
    }
    engine.stop();
    const EngineStats s = engine.stats();
    EXPECT_EQ(s.requests_finished, 40);
    EXPECT_GT(s.preemptions, 0);
    EXPECT_EQ(s.kv_blocks_used - s.kv_blocks_cached, 0);  // nothing leaked: only cached blocks remain held
}

// The runner's MHA-form requests (ModelRunner::mha_requests) are counted per forward: a runner
// that reports its batch's chunks of more than 4 tokens, as the GPU runner runs them.
TEST(Engine, CountsTheRunnersMhaFormRequests) {
    struct MhaRunner : FakeRunner {
        Tensor forward(const model::StepBatch& b, kv::PagedKvCache& c) override {
            last = 0;
            for (size_t r = 0; r + 1 < b.query_start.size(); ++r) last += b.query_start[r + 1] - b.query_start[r] > 4;
            chunks += last;
            steps_with += last > 0;
            return FakeRunner::forward(b, c);
        }
        int64_t mha_requests() const override { return last; }
        int64_t last = 0, chunks = 0, steps_with = 0;
    };
    auto runner = std::make_unique<MhaRunner>();
    const MhaRunner& seen = *runner;
    EngineConfig cfg;
    cfg.num_kv_blocks = 64;
    cfg.scheduler = {8, 24, 8};
    Engine engine(std::move(runner), nullptr, cfg);
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (int i = 0; i < 6; ++i) {
        RequestParams p;
        for (int k = 0; k < 3 + 5 * i; ++k) p.prompt.push_back((i * 7 + k) % 49);
        p.max_tokens = 4;
        p.ignore_eos = true;
        handles.push_back(engine.submit(p));
    }
    engine.start();
    for (auto& h : handles) drain(*h);
    engine.stop();
    const EngineStats s = engine.stats();
    EXPECT_GT(seen.chunks, 0);
    EXPECT_EQ(s.mha_requests, seen.chunks);
    EXPECT_EQ(s.mha_steps, seen.steps_with);
    EXPECT_LT(s.mha_steps, s.steps);  // the decode-only steps report none
}

TEST(Engine, CancelledRequestsFreeTheirBlocks) {
    EngineConfig cfg;
    cfg.num_kv_blocks = 64;
    Engine engine(std::make_unique<FakeRunner>(), nullptr, cfg);
    RequestParams p;
    p.prompt = {1, 2, 3};
    p.max_tokens = 200;
    p.ignore_eos = true;
    auto h = engine.submit(p);
    for (int i = 0; i < 5; ++i) engine.step();
    h->cancel();
    engine.step();
    std::string reason;
    drain(*h, &reason);
    EXPECT_EQ(reason, "abort");
    const EngineStats s = engine.stats();
    EXPECT_EQ(s.requests_aborted, 1);
    EXPECT_EQ(s.running, 0);
    EXPECT_EQ(s.kv_blocks_used - s.kv_blocks_cached, 0);
}

// A good request ({1, 2, 3}) and a bad one ({7, 8, 13}: the only prompt ending in token 13, whose
// row `runner` spoils) through `runner`: the bad one finishes with "error", the good one as usual.
void expect_only_the_bad_request_fails(std::unique_ptr<ModelRunner> runner) {
    EngineConfig cfg;
    cfg.num_kv_blocks = 64;
    Engine engine(std::move(runner), nullptr, cfg);
    RequestParams good, bad;
    good.prompt = {1, 2, 3};
    good.max_tokens = 12;
    good.ignore_eos = true;
    bad.prompt = {7, 8, 13};
    bad.max_tokens = 12;
    bad.ignore_eos = true;
    auto hg = engine.submit(good), hb = engine.submit(bad);
    engine.start();
    std::string reason_good, reason_bad;
    const std::vector<int32_t> out = drain(*hg, &reason_good);
    drain(*hb, &reason_bad);
    engine.stop();
    EXPECT_EQ(reason_bad, "error");
    EXPECT_EQ(out, expected(good.prompt, 12, false));
    EXPECT_EQ(reason_good, "length");
    const EngineStats s = engine.stats();
    EXPECT_EQ(s.requests_failed, 1);
    EXPECT_EQ(s.running, 0);
}

// A row the sampler refuses (NaN logits: a model gone wrong) fails its own request with "error";
// the step's other requests and later steps go on. Before, the sampler's error left the step and
// failed every request in flight (and, in a DP group, stopped the deployment).
TEST(Engine, ARequestWhoseLogitsAreNotFiniteFailsAlone) {
    struct NanRunner : FakeRunner {
        Tensor forward(const model::StepBatch& b, kv::PagedKvCache& cache) override {
            Tensor logits = FakeRunner::forward(b, cache);
            for (size_t i = 0; i < b.logit_rows.size(); ++i)  // a row read at token 13 (only the bad prompt's last)
                if (b.tokens[static_cast<size_t>(b.logit_rows[i])] == 13)
                    logits.data_as<float>()[i * kVocab + 5] = std::numeric_limits<float>::quiet_NaN();
            return logits;
        }
    };
    expect_only_the_bad_request_fails(std::make_unique<NanRunner>());
}

TEST(Engine, RejectsBadRequestsWithClearErrors) {
    EngineConfig cfg;
    cfg.num_kv_blocks = 8;  // 32 tokens of context
    Engine engine(std::make_unique<FakeRunner>(), nullptr, cfg);
    RequestParams p;
    EXPECT_THROW(engine.submit(p), Error);  // empty prompt
    p.prompt = {1, 2};
    p.max_tokens = 31;
    EXPECT_THROW(engine.submit(p), Error);  // 33 > 32
    p.max_tokens = 0;
    EXPECT_THROW(engine.submit(p), Error);
    p.max_tokens = 4;
    p.prompt = {1, 50};
    EXPECT_THROW(engine.submit(p), Error);  // past the vocabulary
    p.prompt = {1};
    p.max_tokens = INT64_MAX;  // must not overflow the context check
    EXPECT_THROW(engine.submit(p), Error);
    p.max_tokens = 4;
    p.sampling.top_p = 2.0f;
    EXPECT_THROW(engine.submit(p), Error);
    p.sampling.top_p = 1.0f;
    p.stop = {"x"};
    EXPECT_THROW(engine.submit(p), Error);  // stop strings need a tokenizer
}

// Two requests with the same block-aligned prompt: the second recomputes the last block, finds its
// content cached, and must adopt the cached block (was: a step that threw and aborted everyone).
TEST(Engine, RecomputedCachedBlocksDoNotStarveTheAllocator) {
    EngineConfig cfg;
    cfg.num_kv_blocks = 4;  // 16 token slots, block size 4
    Engine engine(std::make_unique<FakeRunner>(), nullptr, cfg);
    RequestParams a, b;
    a.prompt = b.prompt = {1, 2, 3, 4, 5, 6, 7, 8};
    a.max_tokens = 1;
    b.max_tokens = 8;
    a.ignore_eos = b.ignore_eos = true;
    auto ha = engine.submit(a);
    for (int i = 0; i < 3; ++i) engine.step();
    auto hb = engine.submit(b);
    for (int i = 0; i < 20; ++i) EXPECT_NO_THROW(engine.step());
    EXPECT_EQ(drain(*ha), expected(a.prompt, 1, false));
    EXPECT_EQ(drain(*hb), expected(b.prompt, 8, false));
}

// The real model: requests with shared prefixes, batched together through a KV cache small enough
// to force preemption, give exactly the tokens each gets alone through generate(). With an
// attention cost the step budget cuts chunks at other, odd places: the tokens are the same.
void expect_batched_equal_single(double attention_cost_per_pair) {
    const std::string dir = testing::write_tiny_model("engine_model", 1000);
    auto alone = model::DeepseekV3::load(dir);
    std::vector<model::GenerateRequest> reqs;
    for (int i = 0; i < 6; ++i) {
        model::GenerateRequest r;
        for (int k = 0; k < 70; ++k) r.prompt.push_back((k * 31) % 997);  // a shared 64-token block and more
        for (int k = 0; k < 3 + i; ++k) r.prompt.push_back((i * 101 + k * 7) % 997);
        r.max_tokens = 8 + i;
        r.ignore_eos = true;
        reqs.push_back(r);
    }
    std::vector<std::vector<int32_t>> want;
    ThreadPool pool(2);
    for (const auto& r : reqs) {
        kv::PagedKvCache cache(alone->kv_cache_config(4));
        want.push_back(model::generate(*alone, cache, r, {}, Stream{&pool}).tokens);
    }
    EngineConfig cfg;
    cfg.num_kv_blocks = 4;  // 256 slots for 6 x ~85 tokens sharing a 64-token block: preemption, and reuse
    cfg.scheduler = {8, 96, 40, true, attention_cost_per_pair};
    Engine engine(std::make_unique<DeepseekRunner>(model::DeepseekV3::load(dir), model::ForwardOptions{}, 2), nullptr,
                  cfg);
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (const auto& r : reqs) {
        RequestParams p;
        p.prompt = r.prompt;
        p.max_tokens = r.max_tokens;
        p.ignore_eos = true;
        handles.push_back(engine.submit(p));
    }
    engine.start();
    int64_t cached = 0;
    for (size_t i = 0; i < handles.size(); ++i) {
        RequestEvent last;
        EXPECT_EQ(drain(*handles[i], nullptr, &last), want[i]) << "request " << i;
        cached += last.cached_tokens;
    }
    engine.stop();
    EXPECT_GT(cached, 0) << "the shared 64-token prefix should have been reused";
    EXPECT_GT(engine.stats().preemptions, 0);
    // Steps with a prefill chunk of more than one token ran the CPU model's MHA form, the rest (decode) not.
    EXPECT_GT(engine.stats().mha_steps, 0);
    EXPECT_LT(engine.stats().mha_steps, engine.stats().steps);
    std::filesystem::remove_all(dir);
}

TEST(Engine, BatchedPrefixCachedGreedyOutputsEqualSingleRequestGeneration) { expect_batched_equal_single(0.0); }

// 0.05 token-equivalents a pair: a token at context 80 costs 5, so prefill chunks shrink to a
// few tokens and mix with decodes differently.
TEST(Engine, CostBudgetedStepsGiveTheSameOutputs) { expect_batched_equal_single(0.05); }

// The FakeRunner, sampling "on the device": each row rebuilt into SamplingParams from the row and
// its slice of the step's logit biases, then the host rule — what a GPU runner must compute.
class FakeDeviceRunner : public FakeRunner {
  public:
    bool samples_on_device() const override { return true; }
    std::vector<int32_t> forward_sample(const model::StepBatch& b, kv::PagedKvCache& cache,
                                        std::span<const ops::SamplingRow> rows,
                                        std::span<const ops::LogitBias> logit_bias) override {
        const Tensor logits = forward(b, cache);
        EXPECT_EQ(rows.size(), b.logit_rows.size());
        std::vector<int32_t> out;
        std::vector<std::pair<float, int32_t>> scratch;
        for (size_t r = 0; r < rows.size(); ++r) {
            ops::SamplingParams p{rows[r].temperature, rows[r].top_k, rows[r].top_p, 0};
            for (int32_t j = rows[r].bias_begin; j < rows[r].bias_begin + rows[r].bias_count; ++j)
                p.logit_bias.push_back({logit_bias[j].id, logit_bias[j].bias});
            out.push_back(
                ops::sample_with_uniform(logits.data_as<float>() + r * kVocab, kVocab, p, rows[r].uniform, scratch));
        }
        return out;
    }
};

// A runner sampling on the device writes ops::kNotFinite for a row it refuses (sampling_cuda.h):
// that request fails alone with "error", as with the host sampler's refusal above.
TEST(Engine, ARowTheDeviceSamplerRefusesFailsItsRequestAlone) {
    struct RefusingRunner : FakeDeviceRunner {
        std::vector<int32_t> forward_sample(const model::StepBatch& b, kv::PagedKvCache& cache,
                                            std::span<const ops::SamplingRow> rows,
                                            std::span<const ops::LogitBias> logit_bias) override {
            std::vector<int32_t> out = FakeDeviceRunner::forward_sample(b, cache, rows, logit_bias);
            for (size_t i = 0; i < out.size(); ++i)  // a row read at token 13 (only the bad prompt's last)
                if (b.tokens[static_cast<size_t>(b.logit_rows[i])] == 13) out[i] = ops::kNotFinite;
            return out;
        }
    };
    expect_only_the_bad_request_fails(std::make_unique<RefusingRunner>());
}

std::vector<std::vector<int32_t>> run_all(std::unique_ptr<ModelRunner> runner,
                                          const std::vector<RequestParams>& params) {
    EngineConfig cfg;
    cfg.num_kv_blocks = 64;
    cfg.scheduler = {8, 16, 4};
    return testing::run_engine(std::move(runner), cfg, params);
}

// logit_bias through the engine: +100 forces a token, -100 bans the model's pick, and the rows a
// device-sampling runner gets carry each request's own biases (the same tokens as host sampling).
TEST(Engine, LogitBiasReachesTheSamplerOnTheHostAndInDeviceRows) {
    std::vector<RequestParams> params;
    for (int i = 0; i < 8; ++i) {
        RequestParams p;
        p.prompt = {1 + i, 2 + 3 * i, 3};
        p.max_tokens = 6 + i;
        p.ignore_eos = true;
        if (i % 2) p.sampling = {1.0f, i % 3 ? 0 : 10, i % 4 == 1 ? 0.9f : 1.0f, static_cast<uint64_t>(i)};
        for (int id = i; id < FakeRunner::kVocab; id += 7)
            p.sampling.logit_bias.push_back({id, 0.5f * (id % 5) - 1.0f});
        params.push_back(p);
    }
    params[0].sampling.logit_bias = {{17, 100.0f}};                          // greedy, forced
    params[1].sampling.logit_bias = {{3, 2.0f}, {23, 100.0f}, {40, -5.0f}};  // sampled, forced
    params[2].sampling.logit_bias.clear();
    const auto host = run_all(std::make_unique<FakeRunner>(), params);
    EXPECT_EQ(host[0], std::vector<int32_t>(6, 17));
    EXPECT_EQ(host[1], std::vector<int32_t>(7, 23));
    EXPECT_EQ(host[2], expected(params[2].prompt, params[2].max_tokens, false));
    RequestParams banned = params[2];  // -100 on each token the model would pick: it picks id 0 (all tie at 0)
    for (int32_t t : host[2]) banned.sampling.logit_bias.push_back({t, -100.0f});
    std::sort(banned.sampling.logit_bias.begin(), banned.sampling.logit_bias.end());
    banned.sampling.logit_bias.erase(std::unique(banned.sampling.logit_bias.begin(), banned.sampling.logit_bias.end()),
                                     banned.sampling.logit_bias.end());
    const auto without = run_all(std::make_unique<FakeRunner>(), {banned});
    for (int32_t t : without[0]) EXPECT_EQ(std::count(host[2].begin(), host[2].end(), t), 0) << t;
    EXPECT_EQ(run_all(std::make_unique<FakeDeviceRunner>(), params), host);
}

TEST(Engine, RejectsLogitBiasOutsideTheVocabulary) {
    EngineConfig cfg;
    cfg.num_kv_blocks = 8;
    Engine engine(std::make_unique<FakeRunner>(), nullptr, cfg);
    RequestParams p;
    p.prompt = {1, 2};
    p.sampling.logit_bias = {{3, 1.0f}, {50, 1.0f}};
    const std::string msg = fanout::testing::error_of([&] { engine.submit(p); });
    EXPECT_NE(msg.find("token id 50"), std::string::npos) << msg;
    p.sampling.logit_bias = {{3, 101.0f}};
    EXPECT_THROW(engine.submit(p), Error);
    p.sampling.logit_bias = {{49, -100.0f}};
    EXPECT_NO_THROW(engine.submit(p));
}

// --microbatch auto's calibration over bucket sizes: on for every step past the last size where the
// two-microbatch schedule lost (a step of 17..32 tokens replays the 32 bucket), so the choice is the
// faster schedule at each bucket wherever the crossover is single; losing at the largest size (or
// nothing measured) is never; a win below a loss does not count; a win within the 2% margin is not
// a win; bad timings are named.
TEST(Engine, MicrobatchThresholdFromMeasuredStepTimes) {
    constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
    EXPECT_EQ(microbatch_min_tokens_from({}), kNever);
    // One GPU: nothing to hide, the split only costs.
    EXPECT_EQ(microbatch_min_tokens_from({{1, 100, 190}, {8, 120, 200}, {64, 300, 380}, {128, 500, 690}}), kNever);
    // A crossover between 16 and 32 tokens, sizes given in any order.
    const std::vector<MicrobatchTiming> cross = {{64, 400, 330}, {8, 200, 260}, {32, 300, 290}, {16, 250, 270}};
    const int64_t from = microbatch_min_tokens_from(cross);
    EXPECT_EQ(from, 17);
    for (const MicrobatchTiming& t : cross)  // auto picks the faster schedule at every bucket measured
        EXPECT_EQ(t.tokens >= from, t.microbatch_us < t.one_batch_us) << t.tokens << " tokens";
    // A win at 8 below a loss at 16 is noise, not a second crossover: on past 16.
    EXPECT_EQ(microbatch_min_tokens_from({{8, 200, 150}, {16, 250, 270}, {32, 300, 280}}), 17);
    // Winning everywhere: on for every step; losing only at the largest, or winning by under 2%: never.
    EXPECT_EQ(microbatch_min_tokens_from({{2, 10, 9}, {4, 20, 18}}), 1);
    EXPECT_EQ(microbatch_min_tokens_from({{2, 10, 9}, {4, 20, 21}}), kNever);
    EXPECT_EQ(microbatch_min_tokens_from({{2, 10, 9}, {4, 20, 19.8}}), kNever);
    const std::string err = fanout::testing::error_of([] { microbatch_min_tokens_from({{4, 20, 0}}); });
    EXPECT_NE(err.find("4 tokens"), std::string::npos) << err;
}

}  // namespace
}  // namespace fanout::engine

// MTP speculative decoding in the engine (EngineConfig::mtp_draft_tokens): a fake model whose MTP
// layer drafts right every time (every draft accepted: the same tokens in fewer steps), wrong
// every time (none accepted: the same tokens), or right and wrong by turns; and the tiny model,
// whose drafts are checked against its own forward: greedy output with 1, 2 or 3 drafts equals
// plain greedy, many requests at once, with prefix-cache hits; bad configurations are refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <limits>

#include "engine_test_util.h"
#include "fake_rank_runner.h"
#include "fanout/engine/dp_group.h"
#include "fanout/engine/engine.h"
#include "fanout/model/synthetic.h"
#include "test_util.h"

namespace fanout::engine {
namespace {

using fanout::testing::error_of;
using testing::drain;
using testing::expected;
using testing::FakeRankRunner;
using ::testing::HasSubstr;
using testing::request;

// FakeRankRunner's rule with an MTP layer: at position p it reads the token at p + 1 and drafts
// the one at p + 2 — right (kRight), off by one (kWrong), or right only at even positions.
class FakeMtpRunner : public ModelRunner {
  public:
    enum class Drafts { kRight, kWrong, kAlternate };
    explicit FakeMtpRunner(Drafts d) : drafts_(d) {}
    static constexpr int64_t V = FakeRankRunner::kVocab;
    int64_t vocab_size() const override { return V; }
    int64_t max_context() const override { return 4096; }
    std::vector<int64_t> eos_ids() const override { return {49}; }
    kv::KvCacheConfig kv_cache_config(int64_t num_blocks) const override { return {1, 1, 4, num_blocks, DType::kF32}; }
    Tensor forward(const model::StepBatch& b, kv::PagedKvCache&) override {
        ++forwards;
        if (b.all_hidden) kept_ = b.num_tokens();
        return one_hot(b, [&](size_t r) { return FakeRankRunner::next(b.tokens[r], b.positions[r]); });
    }
    std::string enable_mtp(int) override { return ""; }
    std::vector<int32_t> draft_mtp(const model::StepBatch& b, std::span<const int32_t> hidden_rows, bool chained,
                                   kv::PagedKvCache&) override {
        EXPECT_EQ(static_cast<int64_t>(hidden_rows.size()), b.num_tokens());
        for (int32_t r : hidden_rows) EXPECT_LT(r, chained ? kept_mtp_ : kept_) << (chained ? "chained" : "first");
        kept_mtp_ = static_cast<int64_t>(b.logit_rows.size());
        ++mtp_forwards;
        std::vector<int32_t> drafts;
        for (int32_t row : b.logit_rows) {
            const size_t r = static_cast<size_t>(row);
            const int32_t right = FakeRankRunner::next(b.tokens[r], b.positions[r] + 1);
            const bool ok = drafts_ == Drafts::kRight || (drafts_ == Drafts::kAlternate && b.positions[r] % 2 == 0);
            drafts.push_back(ok ? right : static_cast<int32_t>((right + 1) % V));
        }
        return drafts;
    }
    int forwards = 0, mtp_forwards = 0;

  private:
    template <typename F>
    Tensor one_hot(const model::StepBatch& b, F token) {
        const int64_t R = static_cast<int64_t>(b.logit_rows.size());
        Tensor logits = Tensor::zeros({R, V}, DType::kF32);
        for (int64_t i = 0; i < R; ++i)
            logits.data_as<float>()[i * V + token(static_cast<size_t>(b.logit_rows[static_cast<size_t>(i)]))] = 1.0f;
        return logits;
    }
    int64_t kept_ = 0, kept_mtp_ = 0;
    Drafts drafts_;
};

struct SpecRun {
    std::vector<std::vector<int32_t>> outputs;
    EngineStats stats;
    int forwards = 0;
};

SpecRun run_fake(FakeMtpRunner::Drafts d, int k, const std::vector<RequestParams>& params) {
    EngineConfig cfg;
    cfg.num_kv_blocks = 256;
    cfg.scheduler = {8, 64, 16};
    cfg.mtp_draft_tokens = k;
    auto runner = std::make_unique<FakeMtpRunner>(d);
    FakeMtpRunner* r = runner.get();
    Engine engine(std::move(runner), nullptr, cfg);
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (const auto& p : params) handles.push_back(engine.submit(p));
    engine.start();
    SpecRun out;
    for (auto& h : handles) out.outputs.push_back(drain(*h));
    engine.stop();
    out.stats = engine.stats();
    out.forwards = r->forwards;
    return out;
}

TEST(Speculative, RightDraftsAreAllAcceptedAndTheSameTokensComeInFewerSteps) {
    const std::vector<RequestParams> one = {request(3, 40)};
    const SpecRun plain = run_fake(FakeMtpRunner::Drafts::kRight, 0, one);
    for (int k = 1; k <= 3; ++k) {
        const SpecRun spec = run_fake(FakeMtpRunner::Drafts::kRight, k, one);
        EXPECT_EQ(spec.outputs, plain.outputs) << "k " << k;
        EXPECT_EQ(spec.outputs[0], expected(one[0].prompt, 40));
        EXPECT_GT(spec.stats.draft_tokens, 0);
        EXPECT_EQ(spec.stats.accepted_draft_tokens, spec.stats.draft_tokens) << "k " << k;
        // 40 tokens: one from the prefill, then k + 1 per step.
        EXPECT_LE(spec.forwards, 1 + (39 + k) / (k + 1)) << "k " << k;
        EXPECT_EQ(spec.stats.generation_tokens, 40);
    }
}

TEST(Speculative, WrongDraftsAreRejectedAndAlternatingOnesHalfAccepted) {
    std::vector<RequestParams> many;
    for (int i = 0; i < 12; ++i) many.push_back(request(i, 5 + (i * 7) % 23));
    const SpecRun plain = run_fake(FakeMtpRunner::Drafts::kRight, 0, many);
    for (int k = 1; k <= 3; ++k) {
        const SpecRun wrong = run_fake(FakeMtpRunner::Drafts::kWrong, k, many);
        EXPECT_EQ(wrong.outputs, plain.outputs) << "k " << k;
        EXPECT_GT(wrong.stats.draft_tokens, 0);
        EXPECT_EQ(wrong.stats.accepted_draft_tokens, 0);
        const SpecRun alt = run_fake(FakeMtpRunner::Drafts::kAlternate, k, many);
        EXPECT_EQ(alt.outputs, plain.outputs) << "k " << k;
        EXPECT_GT(alt.stats.accepted_draft_tokens, 0);
        EXPECT_LT(alt.stats.accepted_draft_tokens, alt.stats.draft_tokens);
    }
}

// The tiny model (random weights, so its MTP drafts are mostly rejected): greedy with drafts
// equals greedy without, for requests of different lengths running together and sharing prefixes
// — a rejected draft's KV must never be read as the sequence's.
TEST(Speculative, TinyModelGreedyWithDraftsEqualsPlainGreedy) {
    const std::string dir = testing::write_tiny_model("speculative_model", 300);
    std::vector<RequestParams> params;
    for (int i = 0; i < 8; ++i) {
        RequestParams p;
        for (int t = 0; t < 70; ++t) p.prompt.push_back(t * 13 % 297);  // a shared 64-token block
        for (int t = 0; t < 3 + i * 5; ++t) p.prompt.push_back((i * 31 + t * 7) % 297);
        p.max_tokens = 6 + i * 3;
        p.ignore_eos = true;
        params.push_back(p);
    }
    EngineConfig cfg;
    cfg.num_kv_blocks = 64;
    cfg.scheduler = {4, 96, 48};
    const auto runner = [&] {
        return std::make_unique<DeepseekRunner>(model::DeepseekV3::load(dir), model::ForwardOptions{}, 1);
    };
    const auto want = testing::run_engine(runner(), cfg, params);
    for (int k = 1; k <= 3; ++k) {
        EngineConfig spec = cfg;
        spec.mtp_draft_tokens = k;
        Engine engine(runner(), nullptr, spec);
        std::vector<std::shared_ptr<RequestHandle>> handles;
        for (const auto& p : params) handles.push_back(engine.submit(p));
        engine.start();
        for (size_t i = 0; i < handles.size(); ++i)
            EXPECT_EQ(drain(*handles[i]), want[i]) << "k " << k << " request " << i;
        engine.stop();
        const EngineStats s = engine.stats();
        EXPECT_GT(s.draft_tokens, 0) << "k " << k;
        EXPECT_GT(s.cached_prompt_tokens, 0) << "the shared block should be a prefix-cache hit";
    }
    std::filesystem::remove_all(dir);
}

// Lockstep DP ranks (the tiny model's experts over 2 ranks as threads): every rank runs the MTP
// layer K times a step, drafting or not (its MoE layer is a collective); greedy output with drafts
// equals one engine's without.
TEST(Speculative, DpRanksDraftInLockstepAndGreedyIsUnchanged) {
    const std::string dir = testing::write_tiny_model("speculative_dp_model", 300);
    std::vector<RequestParams> params;
    for (int i = 0; i < 5; ++i) {
        RequestParams p;
        for (int t = 0; t < 4 + i * 9; ++t) p.prompt.push_back((i * 17 + t * 5) % 297);
        p.max_tokens = 5 + i * 2;
        p.ignore_eos = true;
        params.push_back(p);
    }
    EngineConfig cfg;
    cfg.num_kv_blocks = 32;
    cfg.scheduler = {4, 64, 32};
    const auto want = testing::run_engine(
        std::make_unique<DeepseekRunner>(model::DeepseekV3::load(dir), model::ForwardOptions{}, 1), cfg, params);
    cfg.mtp_draft_tokens = 2;
    std::vector<std::unique_ptr<model::DeepseekV3>> models;
    for (int r = 0; r < 2; ++r) models.push_back(model::DeepseekV3::load(dir, ParallelConfig{r, 2, 1}));
    auto group = make_cpu_dp_threads(std::move(models), cfg, model::ForwardOptions{}, 1, DType::kF32, nullptr);
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (const auto& p : params) handles.push_back(group->lead().submit(p));
    group->start();
    for (size_t i = 0; i < handles.size(); ++i) EXPECT_EQ(drain(*handles[i]), want[i]) << "request " << i;
    EXPECT_GT(group->lead().stats().draft_tokens, 0);
    group->stop();
    EXPECT_EQ(group->failure(), "");
    std::filesystem::remove_all(dir);
}

// Under MTP on the host, a request whose logits the sampler refuses (NaN) fails alone: the other
// requests' tokens, drafts and acceptance are those of a run without it.
TEST(Speculative, ARequestWhoseLogitsAreNotFiniteFailsAlone) {
    struct NanMtpRunner : FakeMtpRunner {
        NanMtpRunner() : FakeMtpRunner(Drafts::kAlternate) {}
        Tensor forward(const model::StepBatch& b, kv::PagedKvCache& cache) override {
            Tensor logits = FakeMtpRunner::forward(b, cache);
            for (size_t i = 0; i < b.logit_rows.size(); ++i) {  // the bad prompt's rows: 48 at positions 0..2
                const size_t r = static_cast<size_t>(b.logit_rows[i]);
                if (b.tokens[r] == 48 && b.positions[r] <= 2)
                    logits.data_as<float>()[i * V + 7] = std::numeric_limits<float>::quiet_NaN();
            }
            return logits;
        }
    };
    const std::vector<RequestParams> good = {request(3, 30), request(4, 25)};
    const SpecRun alone = run_fake(FakeMtpRunner::Drafts::kAlternate, 2, good);
    EngineConfig cfg;
    cfg.num_kv_blocks = 256;
    cfg.scheduler = {8, 64, 16};
    cfg.mtp_draft_tokens = 2;
    Engine engine(std::make_unique<NanMtpRunner>(), nullptr, cfg);
    RequestParams bad = request(0, 20);
    bad.prompt = {48, 48, 48};
    auto h0 = engine.submit(good[0]), hb = engine.submit(bad), h1 = engine.submit(good[1]);
    engine.start();
    std::string reason;
    const std::vector<int32_t> out0 = drain(*h0);
    drain(*hb, &reason);
    const std::vector<int32_t> out1 = drain(*h1);
    engine.stop();
    EXPECT_EQ(reason, "error");
    EXPECT_EQ(out0, alone.outputs[0]);
    EXPECT_EQ(out1, alone.outputs[1]);
    EXPECT_EQ(engine.stats().requests_failed, 1);
    EXPECT_GT(engine.stats().accepted_draft_tokens, 0);
}

// The same with a runner that samples on the device, which writes ops::kNotFinite for a row it
// refuses (sampling_cuda.h) and may refuse an MTP draft. A request refused at its prefill, and one
// refused at a verification row of a decode step (the last row of the batch's second request, with
// another after it: each request's rows counted right, or the wrong one fails), fail alone: each
// other request's tokens are a run without them, the second one's tokens before its failure a
// prefix of its own. A refused draft only ends that sequence's drafts for the step, and never
// reaches the model as a token.
TEST(Speculative, RowsAndDraftsTheDeviceRefusesFailOnlyTheirOwn) {
    struct DeviceMtpRunner : FakeMtpRunner {
        DeviceMtpRunner() : FakeMtpRunner(Drafts::kAlternate) {}
        bool samples_on_device() const override { return true; }
        Tensor forward(const model::StepBatch& b, kv::PagedKvCache& cache) override {
            for (int32_t t : b.tokens) EXPECT_GE(t, 0) << "a refused token reached the model";
            return FakeMtpRunner::forward(b, cache);
        }
        std::vector<int32_t> forward_sample(const model::StepBatch& b, kv::PagedKvCache& cache,
                                            std::span<const ops::SamplingRow> rows,
                                            std::span<const ops::LogitBias>) override {
            const Tensor logits = forward(b, cache);
            std::vector<int32_t> out;
            std::vector<size_t> second;  // the rows of the batch's second request
            std::vector<std::pair<float, int32_t>> scratch;
            for (size_t i = 0; i < rows.size(); ++i) {
                const size_t r = static_cast<size_t>(b.logit_rows[i]);
                if (b.query_start.size() > 2 && b.logit_rows[i] >= b.query_start[1] &&
                    b.logit_rows[i] < b.query_start[2])
                    second.push_back(i);
                const float* l = logits.data_as<float>() + static_cast<int64_t>(i) * V;
                const ops::SamplingParams p{rows[i].temperature, rows[i].top_k, rows[i].top_p, 0};
                if (b.tokens[r] == 48 && b.positions[r] <= 2)  // the bad prompt's rows
                    out.push_back(ops::kNotFinite);
                else if (rows[i].draft >= 0)
                    out.push_back(ops::check_draft_with_uniforms(l, V, p, rows[i].draft, rows[i].uniform,
                                                                 rows[i].uniform_residual, scratch)
                                      .token);
                else
                    out.push_back(ops::sample_with_uniform(l, V, p, rows[i].uniform, scratch));
            }
            if (!refused_decode && b.num_requests() >= 3 && second.size() >= 2) {  // it checks drafts
                out[second.back()] = ops::kNotFinite;
                refused_decode = true;
            }
            return out;
        }
        std::vector<int32_t> draft_mtp(const model::StepBatch& b, std::span<const int32_t> hidden_rows, bool chained,
                                       kv::PagedKvCache& cache) override {
            for (int32_t t : b.tokens) EXPECT_GE(t, 0) << "a refused draft reached the MTP layer";
            std::vector<int32_t> drafts = FakeMtpRunner::draft_mtp(b, hidden_rows, chained, cache);
            for (size_t i = 0; i < drafts.size(); ++i)  // every few positions, first drafts and chained ones
                if (b.positions[static_cast<size_t>(b.logit_rows[i])] % 5 == (chained ? 1 : 3)) {
                    drafts[i] = ops::kNotFinite;
                    ++refused_drafts;
                }
            return drafts;
        }
        int refused_drafts = 0;
        bool refused_decode = false;
    };
    const std::vector<RequestParams> good = {request(3, 30), request(4, 25), request(5, 28)};
    const SpecRun alone = run_fake(FakeMtpRunner::Drafts::kAlternate, 2, good);
    EngineConfig cfg;
    cfg.num_kv_blocks = 256;
    cfg.scheduler = {8, 64, 16};
    cfg.mtp_draft_tokens = 2;
    auto runner = std::make_unique<DeviceMtpRunner>();
    const DeviceMtpRunner* r = runner.get();
    Engine engine(std::move(runner), nullptr, cfg);
    RequestParams bad = request(0, 20);
    bad.prompt = {48, 48, 48};
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (const RequestParams& p : good) handles.push_back(engine.submit(p));
    auto hb = engine.submit(bad);
    engine.start();
    std::vector<std::vector<int32_t>> out;
    std::vector<std::string> reasons(good.size());
    for (size_t i = 0; i < good.size(); ++i) out.push_back(drain(*handles[i], &reasons[i]));
    std::string reason_bad;
    drain(*hb, &reason_bad);
    engine.stop();
    EXPECT_EQ(reason_bad, "error");
    ASSERT_TRUE(r->refused_decode);
    EXPECT_EQ(std::count(reasons.begin(), reasons.end(), "error"), 1);
    for (size_t i = 0; i < good.size(); ++i) {
        SCOPED_TRACE("request " + std::to_string(i) + ", " + reasons[i]);
        if (reasons[i] != "error") {
            EXPECT_EQ(out[i], alone.outputs[i]);
        } else {
            ASSERT_LT(out[i].size(), alone.outputs[i].size());
            EXPECT_TRUE(std::equal(out[i].begin(), out[i].end(), alone.outputs[i].begin()));
        }
    }
    EXPECT_EQ(engine.stats().requests_failed, 2);
    EXPECT_GT(r->refused_drafts, 0);
    EXPECT_GT(engine.stats().accepted_draft_tokens, 0);
    EXPECT_LT(engine.stats().draft_tokens, alone.stats.draft_tokens);
}

TEST(Speculative, BadConfigurationsAreRefusedNamingWhy) {
    EngineConfig cfg;
    cfg.mtp_draft_tokens = 9;
    EXPECT_THAT(error_of([&] { Engine(std::make_unique<FakeMtpRunner>(FakeMtpRunner::Drafts::kRight), nullptr, cfg); }),
                HasSubstr("--mtp 9: draft tokens must be in 0..7"));
    cfg.mtp_draft_tokens = 2;
    testing::Shared shared(1);
    EXPECT_THAT(error_of([&] { Engine(std::make_unique<FakeRankRunner>(shared, 0), nullptr, cfg); }),
                HasSubstr("does not draft with MTP"));
}

}  // namespace
}  // namespace fanout::engine

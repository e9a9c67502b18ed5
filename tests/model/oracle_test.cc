// The model against HF transformers' DeepseekV3ForCausalLM: logits over 48 tokens and a greedy
// continuation, for the tiny random models in tests/fixtures/oracle (made on the GPU machine by
// scripts/make_oracle_fixtures.py; see docs/hf_oracle_notes.md).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fanout/model/ep_group.h"
#include "fanout/model/generate.h"
#include "oracle_fixtures.h"
#include "test_util.h"

namespace fanout::model {
namespace {

namespace fs = std::filesystem;

using fanout::testing::fixture_names;
using fanout::testing::oracle_dir;

struct Fixture {
    std::string dir;
    nlohmann::json oracle;
    std::vector<float> logits;
};

Fixture load_fixture(const std::string& name) {
    Fixture f;
    f.dir = (oracle_dir() / name).string();
    std::ifstream j(f.dir + "/oracle.json");
    f.oracle = nlohmann::json::parse(j);
    std::ifstream l(f.dir + "/logits.f32", std::ios::binary);
    const size_t n = f.oracle["input_ids"].size() * f.oracle["vocab_size"].get<size_t>();
    f.logits.resize(n);
    l.read(reinterpret_cast<char*>(f.logits.data()), static_cast<std::streamsize>(n * sizeof(float)));
    EXPECT_TRUE(l.good()) << "logits.f32 of " << name << " is shorter than [T, vocab]";
    return f;
}

class Oracle : public ::testing::TestWithParam<std::string> {};

TEST(OracleFixtures, ArePresent) { EXPECT_GE(fixture_names().size(), 5u); }

// Full-sequence logits (MHA-form prefill) and token-by-token decode (absorbed form), both against HF.
TEST_P(Oracle, LogitsMatchTransformers) {
    const Fixture f = load_fixture(GetParam());
    auto model = DeepseekV3::load(f.dir);
    const auto ids = f.oracle["input_ids"].get<std::vector<int32_t>>();
    const int64_t T = static_cast<int64_t>(ids.size()), V = model->config().vocab_size;
    const double tol = 1e-3 * f.oracle["max_abs_logit"].get<double>();
    ThreadPool pool(2);
    for (AttentionForm form : {AttentionForm::kMha, AttentionForm::kAbsorbed}) {
        kv::PagedKvCache cache(model->kv_cache_config(4));
        kv::SequenceBlocks seq;
        cache.reserve(seq, T);
        ForwardOptions opts;
        opts.attention = form;
        auto batch = StepBatchBuilder(cache).add(ids, 0, seq, StepBatchBuilder::Logits::kAll).build();
        auto out = model->forward(batch, cache, opts, Stream{&pool});
        ASSERT_EQ(out.logits.numel(), T * V);
        const double diff =
            fanout::testing::max_abs_diff(out.logits.data_as<float>(), f.logits.data(), f.logits.size());
        std::printf("%s %s: max |dlogit| %.3g (bound %.3g)\n", GetParam().c_str(),
                    form == AttentionForm::kMha ? "MHA form" : "absorbed form", diff, tol);
        EXPECT_LE(diff, tol) << GetParam() << (form == AttentionForm::kMha ? " MHA form" : " absorbed form");
    }
    // Incremental decode, one token a step, reproduces every row.
    kv::PagedKvCache cache(model->kv_cache_config(4));
    kv::SequenceBlocks seq;
    cache.reserve(seq, T);
    double worst = 0;
    for (int64_t t = 0; t < T; ++t) {
        auto batch = StepBatchBuilder(cache).add(std::span(ids).subspan(t, 1), t, seq).build();
        auto out = model->forward(batch, cache, {}, Stream{&pool});
        worst = std::max(worst, fanout::testing::max_abs_diff(out.logits.data_as<float>(), f.logits.data() + t * V,
                                                              static_cast<size_t>(V)));
    }
    std::printf("%s incremental decode: max |dlogit| %.3g\n", GetParam().c_str(), worst);
    EXPECT_LE(worst, tol) << GetParam() << " incremental decode";
}

// The same logits with the routed experts split over 4 ranks (threads, the `local` EP backend):
// rank 0 runs the sequence, the others serve their experts with empty steps.
TEST_P(Oracle, LogitsMatchTransformersAtEp4) {
    const Fixture f = load_fixture(GetParam());
    const io::ModelConfig c = io::load_model_config(f.dir);
    constexpr int kEp = 4;
    if (c.n_routed_experts == 0 || c.n_routed_experts % kEp != 0)
        GTEST_SKIP() << GetParam() << " has " << c.n_routed_experts << " routed experts: nothing to split 4 ways";
    const auto ids = f.oracle["input_ids"].get<std::vector<int32_t>>();
    const int64_t T = static_cast<int64_t>(ids.size());
    std::vector<std::unique_ptr<DeepseekV3>> ranks;
    for (int r = 0; r < kEp; ++r) ranks.push_back(DeepseekV3::load(f.dir, ParallelConfig{r, kEp, 1}));
    EpThreadGroup group(std::move(ranks), T, {}, 1);
    kv::PagedKvCache cache(group.lead().kv_cache_config(4));
    kv::SequenceBlocks seq;
    cache.reserve(seq, T);
    const Tensor logits =
        group.forward(StepBatchBuilder(cache).add(ids, 0, seq, StepBatchBuilder::Logits::kAll).build(), cache).logits;
    ASSERT_EQ(logits.numel(), static_cast<int64_t>(f.logits.size()));
    const double diff = fanout::testing::max_abs_diff(logits.data_as<float>(), f.logits.data(), f.logits.size());
    const double tol = 1e-3 * f.oracle["max_abs_logit"].get<double>();
    std::printf("%s at EP4: max |dlogit| %.3g (bound %.3g)\n", GetParam().c_str(), diff, tol);
    EXPECT_LE(diff, tol) << GetParam() << " at EP4";
}

TEST_P(Oracle, GreedyContinuationMatchesTransformers) {
    const Fixture f = load_fixture(GetParam());
    auto model = DeepseekV3::load(f.dir);
    const auto ids = f.oracle["input_ids"].get<std::vector<int32_t>>();
    const auto expected = f.oracle["greedy_tokens"].get<std::vector<int32_t>>();
    GenerateRequest req;
    req.prompt.assign(ids.begin(), ids.begin() + f.oracle["prompt_len"].get<int64_t>());
    req.max_tokens = static_cast<int64_t>(expected.size());
    req.ignore_eos = true;
    kv::PagedKvCache cache(model->kv_cache_config(2));
    ThreadPool pool(2);
    const auto res = generate(*model, cache, req, {}, Stream{&pool});
    EXPECT_EQ(res.tokens, expected) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Oracle, ::testing::ValuesIn(fixture_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace fanout::model

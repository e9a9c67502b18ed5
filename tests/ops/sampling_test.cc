#include "fanout/ops/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "test_util.h"

namespace fanout::ops {
namespace {

TEST(Sampling, GreedyIsArgmaxWithLowestIdOnTies) {
    std::vector<float> l = {0.1f, 3.0f, -1.0f, 3.0f};
    Sampler s({});
    EXPECT_EQ(s.sample(l.data(), 4), 1);
}

TEST(Sampling, TopKOneIsGreedyAtAnyTemperature) {
    const auto l = fanout::testing::random_floats(1000, 31, 5.0f);
    Sampler s({1.7f, 1, 1.0f, 9});
    for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(l.data(), 1000), argmax(l.data(), 1000));
}

TEST(Sampling, SameSeedSameTokensOtherSeedOtherTokens) {
    const auto l = fanout::testing::random_floats(500, 32, 2.0f);
    Sampler a({1.0f, 0, 1.0f, 42}), b({1.0f, 0, 1.0f, 42}), c({1.0f, 0, 1.0f, 43});
    std::vector<int32_t> ta, tb, tc;
    for (int i = 0; i < 50; ++i) {
        ta.push_back(a.sample(l.data(), 500));
        tb.push_back(b.sample(l.data(), 500));
        tc.push_back(c.sample(l.data(), 500));
    }
    EXPECT_EQ(ta, tb);
    EXPECT_NE(ta, tc);
}

TEST(Sampling, FrequenciesFollowSoftmaxAndTopPCutsTheTail) {
    // probabilities 0.5, 0.25, 0.125, 0.125 at temperature 1
    std::vector<float> l = {std::log(4.0f), std::log(2.0f), 0.0f, 0.0f};
    Sampler s({1.0f, 0, 1.0f, 7});
    std::map<int, int> counts;
    const int n = 20000;
    for (int i = 0; i < n; ++i) ++counts[s.sample(l.data(), 4)];
    EXPECT_NEAR(counts[0] / double(n), 0.5, 0.02);
    EXPECT_NEAR(counts[1] / double(n), 0.25, 0.02);
    EXPECT_NEAR(counts[3] / double(n), 0.125, 0.02);
    Sampler p({1.0f, 0, 0.7f, 7});  // the smallest set reaching 0.7: ids 0 and 1
    std::map<int, int> pc;
    for (int i = 0; i < 5000; ++i) ++pc[p.sample(l.data(), 4)];
    EXPECT_EQ(pc.count(2) + pc.count(3), 0u);
    EXPECT_NEAR(pc[0] / 5000.0, 2.0 / 3.0, 0.03);
}

// Speculative decoding's check of a greedy draft: whatever the draft, the emitted tokens follow
// the request's distribution — a chi-squared test over many draws (fixed seeds) against p for a
// draft the target likes, one it does not, one top-k removed, with top-p, and with logit_bias;
// greedy emits the argmax of the biased logits and accepts only it.
TEST(Sampling, DraftChecksEmitTheTargetDistribution) {
    const std::vector<float> l = {1.2f, 0.3f, -0.4f, 2.0f, 0.0f, -1.5f};
    const int V = static_cast<int>(l.size());
    struct Case {
        SamplingParams params;
        int32_t draft;
    };
    // The last two with logit_bias: one that lifts the draft from the middle to the top, and one
    // that lowers the argmax and lifts a token top-k would have cut back into the kept set.
    const std::vector<Case> cases = {{{0.8f, 0, 1.0f, 11}, 3},
                                     {{0.8f, 0, 1.0f, 12}, 5},
                                     {{1.3f, 3, 1.0f, 13}, 1},
                                     {{1.0f, 0, 0.8f, 14}, 0},
                                     {{0.9f, 0, 1.0f, 15, {{1, 2.5f}, {3, -1.0f}}}, 1},
                                     {{1.1f, 3, 0.9f, 16, {{3, -2.0f}, {5, 3.0f}}}, 5}};
    for (const Case& c : cases) {
        // The target: biased logits / T, top-k, top-p, renormalised (sampling.h's rule).
        std::vector<float> biased_l = l;
        for (const auto& [id, b] : c.params.logit_bias) biased_l[static_cast<size_t>(id)] += b;
        std::vector<std::pair<double, int>> order;
        for (int i = 0; i < V; ++i) order.push_back({biased_l[static_cast<size_t>(i)] / c.params.temperature, i});
        std::sort(order.begin(), order.end(), [](auto a, auto b) { return a.first > b.first; });
        std::vector<double> p(static_cast<size_t>(V), 0.0);
        const size_t keep = c.params.top_k > 0 ? static_cast<size_t>(c.params.top_k) : order.size();
        double total = 0;
        for (size_t i = 0; i < keep; ++i) total += std::exp(order[i].first - order[0].first);
        double cum = 0;
        for (size_t i = 0; i < keep; ++i) {
            const double w = std::exp(order[i].first - order[0].first);
            p[static_cast<size_t>(order[i].second)] = w;
            cum += w;
            if (cum >= c.params.top_p * total) break;
        }
        double kept = 0;
        for (double w : p) kept += w;
        for (double& w : p) w /= kept;
        Sampler s(c.params);
        const int n = 40000;
        std::vector<int> counts(static_cast<size_t>(V), 0);
        int accepted = 0;
        for (int i = 0; i < n; ++i) {
            const DraftCheck d = s.check_draft(l.data(), V, c.draft);
            ASSERT_GE(d.token, 0);
            ASSERT_LT(d.token, V);
            EXPECT_EQ(d.accepted, d.token == c.draft);
            ++counts[static_cast<size_t>(d.token)];
            accepted += d.accepted ? 1 : 0;
        }
        double chi2 = 0;
        int df = -1;
        for (int i = 0; i < V; ++i) {
            if (p[static_cast<size_t>(i)] == 0) {
                EXPECT_EQ(counts[static_cast<size_t>(i)], 0) << "token " << i << " is outside the kept set";
                continue;
            }
            const double e = n * p[static_cast<size_t>(i)];
            chi2 += (counts[static_cast<size_t>(i)] - e) * (counts[static_cast<size_t>(i)] - e) / e;
            ++df;
        }
        // The 0.1% critical values of chi-squared for 1..5 degrees of freedom.
        const double critical[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52};
        EXPECT_LT(chi2, critical[df]) << "draft " << c.draft << ", " << df << " degrees of freedom";
        EXPECT_NEAR(accepted / double(n), p[static_cast<size_t>(c.draft)], 0.015) << "draft " << c.draft;
    }
    Sampler greedy({});
    EXPECT_TRUE(greedy.check_draft(l.data(), V, 3).accepted);
    const DraftCheck miss = greedy.check_draft(l.data(), V, 0);
    EXPECT_FALSE(miss.accepted);
    EXPECT_EQ(miss.token, 3);
    // Greedy over the biased logits: +1 makes token 0 (2.2) the argmax over token 3 (2.0).
    Sampler greedy_biased({0.0f, 0, 1.0f, 0, {{0, 1.0f}}});
    EXPECT_TRUE(greedy_biased.check_draft(l.data(), V, 0).accepted);
    const DraftCheck biased_miss = greedy_biased.check_draft(l.data(), V, 3);
    EXPECT_FALSE(biased_miss.accepted);
    EXPECT_EQ(biased_miss.token, 0);
}

// A temperature under kGreedyTemperature is greedy: dividing by 1e-38 overflowed every logit to
// ±inf, the weights became NaN and the draw fell through to the least likely token (3 here).
TEST(Sampling, ATemperatureTooSmallToDivideByIsGreedy) {
    const std::vector<float> logits = {10.0f, 0.0f, -5.0f, -10.0f};
    for (const float t : {1e-38f, 1e-30f, 1e-6f}) {
        Sampler s({t, 0, 1.0f, 7});
        for (int i = 0; i < 50; ++i) EXPECT_EQ(s.sample(logits.data(), 4), 0) << "temperature " << t;
        EXPECT_EQ(s.next_uniform(), 0.0) << "greedy rows draw nothing";
        EXPECT_EQ(s.check_draft(logits.data(), 4, 3).token, 0);
        SamplingParams top_p{t, 0, 0.5f, 1};
        std::vector<std::pair<float, int32_t>> scratch;
        EXPECT_EQ(sample_with_uniform(logits.data(), 4, top_p, 0.99, scratch), 0);
    }
    Sampler above({2e-5f, 0, 1.0f, 7});  // sampled, and as good as greedy at these gaps
    EXPECT_EQ(above.sample(logits.data(), 4), 0);
    EXPECT_NE(above.next_uniform(), 0.0);
}

// NaN or +inf logits (a model gone wrong) are an error naming the token, greedy or sampled, as is
// a row with no finite logit; -inf entries beside finite ones are fine.
TEST(Sampling, NonFiniteLogitsAreAnError) {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<std::pair<float, int32_t>> scratch;
    for (const float t : {0.0f, 1.0f}) {
        const SamplingParams p{t, 0, 1.0f, 1};
        const std::vector<float> plus_inf = {-inf, 5.0f, inf}, with_nan = {1.0f, nan, 2.0f}, none = {-inf, -inf};
        EXPECT_NE(fanout::testing::error_of([&] {
                      sample_with_uniform(plus_inf.data(), 3, p, 0.5, scratch);
                  }).find("logit of token 2 is inf"),
                  std::string::npos);
        EXPECT_NE(fanout::testing::error_of([&] {
                      sample_with_uniform(with_nan.data(), 3, p, 0.5, scratch);
                  }).find("logit of token 1 is nan"),
                  std::string::npos);
        EXPECT_NE(fanout::testing::error_of([&] {
                      sample_with_uniform(none.data(), 2, p, 0.5, scratch);
                  }).find("every logit"),
                  std::string::npos);
        EXPECT_NE(fanout::testing::error_of([&] {
                      check_draft_with_uniforms(with_nan.data(), 3, p, 0, 0.5, 0.5, scratch);
                  }).find("logit of token 1 is nan"),
                  std::string::npos);
        const std::vector<float> masked = {-inf, 1.0f, -inf, 0.5f};
        const int32_t got = sample_with_uniform(masked.data(), 4, p, 0.3, scratch);
        EXPECT_TRUE(got == 1 || got == 3) << got;
    }
}

TEST(Sampling, RejectsBadParameters) {
    EXPECT_THROW(Sampler({-1.0f, 0, 1.0f, 0}), Error);
    EXPECT_THROW(Sampler({1.0f, -3, 1.0f, 0}), Error);
    EXPECT_THROW(Sampler({1.0f, 0, 0.0f, 0}), Error);
    EXPECT_THROW(Sampler({1.0f, 0, 1.5f, 0}), Error);
    EXPECT_THROW(Sampler({NAN, 0, 1.0f, 0}), Error);
}

// Random biases: `count` distinct ids in [0, vocab) sorted, each bias uniform in [-scale, scale].
std::vector<std::pair<int32_t, float>> random_bias(std::mt19937_64& rng, int64_t vocab, int count, float scale) {
    std::vector<int32_t> ids(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) ids[i] = static_cast<int32_t>(i);
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(static_cast<size_t>(std::min<int64_t>(count, vocab)));
    std::sort(ids.begin(), ids.end());
    std::uniform_real_distribution<float> dist(-scale, scale);
    std::vector<std::pair<int32_t, float>> bias;
    for (int32_t id : ids) bias.push_back({id, dist(rng)});
    return bias;
}

// The logits with the biases added, as the rule defines them.
std::vector<float> biased(const std::vector<float>& l, const std::vector<std::pair<int32_t, float>>& bias) {
    std::vector<float> out = l;
    for (const auto& [id, b] : bias) out[id] = l[id] + b;
    return out;
}

TEST(Sampling, PlusHundredLogitBiasForcesATokenGreedyOrSampled) {
    const int V = 1001;
    const auto l = fanout::testing::random_floats(V, 33, 5.0f);
    const SamplingParams kinds[] = {{0.0f, 0, 1.0f, 1}, {1.0f, 0, 1.0f, 2}, {1.5f, 40, 0.9f, 3}, {0.7f, 1, 1.0f, 4}};
    for (SamplingParams p : kinds) {
        p.logit_bias = {{0, -3.0f}, {123, 100.0f}, {1000, 2.0f}};
        Sampler s(p);
        for (int i = 0; i < 200; ++i) ASSERT_EQ(s.sample(l.data(), V), 123) << p.temperature;
    }
}

TEST(Sampling, MinusHundredLogitBiasRemovesAToken) {
    const int V = 500;
    auto l = fanout::testing::random_floats(V, 34, 1.0f);
    l[0] = 8.0f;    // the favourite by far at id 0 (the first id: the merge's edge),
    l[499] = 7.0f;  // then the last id
    SamplingParams greedy;
    greedy.logit_bias = {{0, -100.0f}};
    EXPECT_EQ(Sampler(greedy).sample(l.data(), V), 499);
    greedy.logit_bias = {{0, -100.0f}, {499, -100.0f}};
    EXPECT_EQ(Sampler(greedy).sample(l.data(), V), argmax(biased(l, greedy.logit_bias).data(), V));
    SamplingParams hot{1.0f, 0, 1.0f, 9};
    Sampler plain(hot);
    int zeros = 0;
    for (int i = 0; i < 2000; ++i) zeros += plain.sample(l.data(), V) == 0;
    EXPECT_GT(zeros, 1000);  // without the bias id 0 has most of the mass
    hot.logit_bias = {{0, -100.0f}};
    Sampler banned(hot);
    for (int i = 0; i < 2000; ++i) ASSERT_NE(banned.sample(l.data(), V), 0);
}

// The rule with biases picks what it picks on a copy of the logits with the biases added, for
// every kind of parameters and any draw; with no biases (or zero ones) it picks what it picked
// before logit_bias existed.
TEST(Sampling, LogitBiasEqualsSamplingTheBiasedLogits) {
    std::mt19937_64 rng(35);
    std::vector<std::pair<float, int32_t>> scratch;
    const SamplingParams kinds[] = {{0.0f, 0, 1.0f, 0},  {1.0f, 0, 1.0f, 0}, {0.7f, 50, 1.0f, 0},  {1.3f, 0, 0.9f, 0},
                                    {0.9f, 20, 0.5f, 0}, {1.0f, 1, 1.0f, 0}, {2.0f, 300, 0.95f, 0}};
    for (int trial = 0; trial < 140; ++trial) {
        const int64_t V = 1 + static_cast<int64_t>(rng() % 3001);
        const auto l = fanout::testing::random_floats(static_cast<size_t>(V), rng(), 4.0f);
        SamplingParams p = kinds[trial % 7];
        p.logit_bias = random_bias(rng, V, static_cast<int>(rng() % 60), trial % 2 ? 100.0f : 3.0f);
        const auto ref_logits = biased(l, p.logit_bias);
        SamplingParams plain = p;
        plain.logit_bias.clear();
        for (int d = 0; d < 20; ++d) {
            const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
            ASSERT_EQ(sample_with_uniform(l.data(), V, p, u, scratch),
                      sample_with_uniform(ref_logits.data(), V, plain, u, scratch))
                << "trial " << trial << " V " << V;
        }
        SamplingParams zero = plain;  // zero biases change nothing
        for (const auto& [id, b] : p.logit_bias) zero.logit_bias.push_back({id, 0.0f});
        Sampler a(plain), b(zero);
        for (int d = 0; d < 20; ++d) ASSERT_EQ(a.sample(l.data(), V), b.sample(l.data(), V));
    }
}

TEST(Sampling, RejectsBadLogitBias) {
    const auto with = [](std::vector<std::pair<int32_t, float>> bias) {
        SamplingParams p;
        p.logit_bias = std::move(bias);
        return p;
    };
    EXPECT_NO_THROW(validate_sampling_params(with({{0, -100.0f}, {7, 100.0f}})));
    EXPECT_THROW(validate_sampling_params(with({{3, 100.5f}})), Error);
    EXPECT_THROW(validate_sampling_params(with({{3, -101.0f}})), Error);
    EXPECT_THROW(validate_sampling_params(with({{3, NAN}})), Error);
    EXPECT_THROW(validate_sampling_params(with({{3, INFINITY}})), Error);
    EXPECT_THROW(validate_sampling_params(with({{-1, 1.0f}})), Error);
    EXPECT_THROW(validate_sampling_params(with({{5, 1.0f}, {2, 1.0f}})), Error);  // not sorted
    EXPECT_THROW(validate_sampling_params(with({{5, 1.0f}, {5, 2.0f}})), Error);  // twice
    const std::string msg = fanout::testing::error_of([&] { validate_sampling_params(with({{42, 250.0f}})); });
    EXPECT_NE(msg.find("42"), std::string::npos) << msg;
}

}  // namespace
}  // namespace fanout::ops

// moe_route against a brute-force reading of DeepSeek-V3's routing rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "fanout/ops/moe_router.h"
#include "test_util.h"

namespace fanout::ops {
namespace {

// Brute force: the experts of the best topk_group groups (group score = top-2 sum of biased
// scores), then the top_k of those by biased score.
std::set<int> reference_choice(const float* logits, const float* bias, const RouterParams& p) {
    const int per = p.num_experts / p.n_group;
    std::vector<double> choice(p.num_experts);
    for (int e = 0; e < p.num_experts; ++e) choice[e] = 1 / (1 + std::exp(-double(logits[e]))) + bias[e];
    std::vector<std::pair<double, int>> groups;
    for (int g = 0; g < p.n_group; ++g) {
        std::vector<double> v(choice.begin() + g * per, choice.begin() + (g + 1) * per);
        std::sort(v.rbegin(), v.rend());
        groups.push_back({v[0] + (per > 1 ? v[1] : 0.0), g});
    }
    std::sort(groups.begin(), groups.end(), [](auto a, auto b) { return a.first > b.first; });
    std::vector<std::pair<double, int>> cand;
    for (int i = 0; i < p.topk_group; ++i)
        for (int j = 0; j < per; ++j) cand.push_back({choice[groups[i].second * per + j], groups[i].second * per + j});
    std::sort(cand.begin(), cand.end(), [](auto a, auto b) { return a.first > b.first; });
    std::set<int> out;
    for (int k = 0; k < p.top_k; ++k) out.insert(cand[k].second);
    return out;
}

TEST(MoeRoute, MatchesBruteForceOnRandomInputs) {
    ThreadPool pool(2);
    for (const RouterParams p : {RouterParams{256, 8, 8, 4, true, 2.5f}, RouterParams{16, 4, 4, 2, false, 1.5f},
                                 RouterParams{12, 3, 1, 1, true, 1.0f}, RouterParams{24, 5, 6, 3, true, 2.0f}}) {
        const int T = 37;
        Tensor logits = fanout::testing::random_tensor({T, p.num_experts}, 21, 3.0f);
        const auto bias = fanout::testing::random_floats(size_t(p.num_experts), 22, 0.5f);  // negative too
        Tensor idx = Tensor::zeros({T, p.top_k}, DType::kI32), w = Tensor::zeros({T, p.top_k}, DType::kF32);
        moe_route(logits, bias.data(), p, idx, w, Stream{&pool});
        for (int t = 0; t < T; ++t) {
            const float* lt = logits.data_as<float>() + t * p.num_experts;
            std::set<int> got(idx.data_as<int32_t>() + t * p.top_k, idx.data_as<int32_t>() + (t + 1) * p.top_k);
            EXPECT_EQ(got, reference_choice(lt, bias.data(), p)) << "token " << t;
            double sum = 0;
            for (int e : got) sum += 1 / (1 + std::exp(-double(lt[e])));
            for (int k = 0; k < p.top_k; ++k) {
                const int e = idx.data_as<int32_t>()[t * p.top_k + k];
                const double s = 1 / (1 + std::exp(-double(lt[e])));  // unbiased score
                const double expect = (p.norm_topk_prob ? s / sum : s) * p.routed_scaling_factor;
                EXPECT_NEAR(w.data_as<float>()[t * p.top_k + k], expect, 1e-5);
            }
        }
    }
}

// With negative biased scores, masking the dropped groups to 0 (not -inf) would let their experts
// win over kept experts whose biased scores are below 0. DeepSeek masks with -inf.
TEST(MoeRoute, MasksDroppedGroupsWithMinusInfinity) {
    const RouterParams p{8, 2, 2, 1, true, 1.0f};
    // Group 0 (experts 0-3) wins on its top-2 sum; all its biased scores are negative.
    std::vector<float> logits(8, 0.0f);
    std::vector<float> bias = {-0.6f, -0.7f, -0.9f, -0.95f, -2.0f, -2.0f, -2.0f, -0.1f};
    // scores are 0.5 for all: biased = -0.1, -0.2, -0.4, -0.45 | -1.5, -1.5, -1.5, 0.4
    // group sums: g0 = -0.3, g1 = -1.1 -> keep g0 only; expert 7 (biased 0.4) must NOT be chosen.
    Tensor lt = Tensor::view(logits.data(), DType::kF32, {1, 8});
    Tensor idx = Tensor::zeros({1, 2}, DType::kI32), w = Tensor::zeros({1, 2}, DType::kF32);
    moe_route(lt, bias.data(), p, idx, w, Stream{});
    EXPECT_EQ(idx.data_as<int32_t>()[0], 0);
    EXPECT_EQ(idx.data_as<int32_t>()[1], 1);
    EXPECT_FLOAT_EQ(w.data_as<float>()[0], 0.5f);
}

TEST(MoeRoute, RejectsBadParameters) {
    Tensor logits = Tensor::zeros({2, 10}, DType::kF32);
    Tensor idx = Tensor::zeros({2, 3}, DType::kI32), w = Tensor::zeros({2, 3}, DType::kF32);
    EXPECT_THROW(moe_route(logits, nullptr, RouterParams{10, 3, 3, 1, true, 1}, idx, w, Stream{}), Error);  // 10 % 3
    EXPECT_THROW(moe_route(logits, nullptr, RouterParams{10, 3, 5, 1, true, 1}, idx, w, Stream{}), Error);  // 3 > 2
}

}  // namespace
}  // namespace fanout::ops

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "fanout/ops/moe_router.h"

namespace fanout::ops {
namespace {

// Indices of the k largest values, largest first, ties to the lower index.
void top_indices(const float* v, int n, int k, int* out) {
    std::vector<int> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
        return v[a] > v[b] || (v[a] == v[b] && a < b);
    });
    std::copy(idx.begin(), idx.begin() + k, out);
}

}  // namespace

void moe_route(const Tensor& logits, const float* bias, const RouterParams& p, Tensor& topk_idx,
               Tensor& topk_weight, const Stream& s) {
    const int E = p.num_experts, K = p.top_k, G = p.n_group;
    check_tensor(logits, "moe_route logits", DType::kF32, {-1, E});
    const int64_t T = logits.dim(0);
    check_tensor(topk_idx, "moe_route topk_idx", DType::kI32, {T, K});
    check_tensor(topk_weight, "moe_route topk_weight", DType::kF32, {T, K});
    FANOUT_CHECK(G > 0 && E % G == 0 && p.topk_group >= 1 && p.topk_group <= G && K >= 1,
                 "moe_route: bad params experts={} n_group={} topk_group={} top_k={}", E, G, p.topk_group, K);
    const int per_group = E / G;
    FANOUT_CHECK(K <= p.topk_group * per_group, "moe_route: top_k={} exceeds the {} experts in the kept groups", K,
                 p.topk_group * per_group);
    const float* lp = logits.data_as<float>();
    int32_t* ip = topk_idx.data_as<int32_t>();
    float* wp = topk_weight.data_as<float>();
    parallel_for(s, T, 16, [&](int64_t t0, int64_t t1) {
        std::vector<float> score(E), choice(E), group_score(G);
        std::vector<int> groups(p.topk_group), chosen(K);
        for (int64_t t = t0; t < t1; ++t) {
            for (int e = 0; e < E; ++e) {
                score[e] = 1.0f / (1.0f + std::exp(-lp[t * E + e]));
                choice[e] = score[e] + (bias ? bias[e] : 0.0f);
            }
            if (G > 1) {
                for (int g = 0; g < G; ++g) {
                    const float* c = choice.data() + g * per_group;
                    float a = -std::numeric_limits<float>::infinity(), b = a;  // top two
                    for (int j = 0; j < per_group; ++j) {
                        if (c[j] > a) {
                            b = a;
                            a = c[j];
                        } else if (c[j] > b) {
                            b = c[j];
                        }
                    }
                    group_score[g] = a + b;
                }
                top_indices(group_score.data(), G, p.topk_group, groups.data());
                std::vector<bool> keep(G, false);
                for (int g : groups) keep[g] = true;
                for (int e = 0; e < E; ++e)
                    if (!keep[e / per_group]) choice[e] = -std::numeric_limits<float>::infinity();
            }
            top_indices(choice.data(), E, K, chosen.data());
            float sum = 0.0f;
            for (int k = 0; k < K; ++k) sum += score[chosen[k]];
            const float norm = p.norm_topk_prob ? 1.0f / (sum + 1e-20f) : 1.0f;
            for (int k = 0; k < K; ++k) {
                ip[t * K + k] = chosen[k];
                wp[t * K + k] = score[chosen[k]] * norm * p.routed_scaling_factor;
            }
        }
    });
}

}  // namespace fanout::ops

// The MoE router on the GPU (moe_router.h's rule), a CTA per token and a thread per expert: an
// expert's place in an order is the count of those ahead of it (a larger value, or an equal one
// with a lower index — the CPU's order), read from shared memory. Three short passes: each
// expert's rank in its group (a group's score is its ranks 0 and 1); each group's rank among the
// group scores (kept below topk_group); then only the candidates — an expert can be among the
// top_k only if it is among its group's top_k — are ranked against each other, and ranks
// 0..top_k-1 are written in that order, their weights normalised by a sum in that order.
// Only fmt-free headers here.
#include <cuda_runtime.h>

#include <string>

#include "fanout/core/cuda_check.h"
#include "fanout/ops/moe_router_cuda.h"
#include "fanout/ops/pdl.cuh"

namespace fanout::ops {
namespace {

constexpr int kMaxExperts = 512, kMaxK = 32, kMaxGroups = 32;

// How many of values[0, n) come before (v, i): larger, or equal with a lower index.
__device__ __forceinline__ int rank_in(const float* values, int n, int base, float v, int i) {
    int r = 0;
    for (int j = 0; j < n; ++j) {
        const float c = values[base + j];
        r += (c > v || (c == v && base + j < i)) ? 1 : 0;
    }
    return r;
}

__global__ void __launch_bounds__(kMaxExperts)
    moe_route_kernel(const float* __restrict__ logits, const float* __restrict__ bias, RouterParams p,
                     int* __restrict__ topk_idx, float* __restrict__ topk_weight) {
    pdl_enter();
    __shared__ float choices[kMaxExperts];
    __shared__ float top1[kMaxGroups], top2[kMaxGroups], group_score[kMaxGroups];
    __shared__ float cand_value[kMaxGroups * kMaxK];
    __shared__ int cand_index[kMaxGroups * kMaxK];
    __shared__ float chosen_score[kMaxK];
    __shared__ int chosen[kMaxK];
    const int t = blockIdx.x, e = threadIdx.x;
    const int E = p.num_experts, G = p.n_group, per_group = E / G, K = p.top_k;
    const int per_slot = min(K, per_group), slots = p.topk_group * per_slot;
    const float kNegInf = -__int_as_float(0x7f800000);
    const bool mine = e < E;
    float score = 0.0f, choice = kNegInf;
    if (mine) {
        score = 1.0f / (1.0f + expf(-logits[static_cast<size_t>(t) * E + e]));
        choice = score + (bias != nullptr ? bias[e] : 0.0f);
        choices[e] = choice;
    }
    if (e < G) top1[e] = top2[e] = kNegInf;  // a group of one expert has no second (-inf, as the CPU's)
    if (e < K) {                             // in range even if NaN logits leave a rank unclaimed
        chosen[e] = 0;
        chosen_score[e] = 0.0f;
    }
    for (int j = e; j < slots; j += blockDim.x) {
        cand_value[j] = kNegInf;
        cand_index[j] = 1 << 30;
    }
    __syncthreads();
    const int g = mine ? e / per_group : 0;
    const int in_group = mine ? rank_in(choices, per_group, g * per_group, choice, e) : 1 << 30;
    int group_rank = 0;
    if (G > 1) {
        if (in_group == 0) top1[g] = choice;
        if (in_group == 1) top2[g] = choice;
        __syncthreads();
        if (e < G) group_score[e] = top1[e] + top2[e];
        __syncthreads();
        group_rank = rank_in(group_score, G, 0, group_score[g], g);
    }
    const bool candidate = mine && group_rank < p.topk_group && in_group < per_slot;
    if (candidate) {
        cand_value[group_rank * per_slot + in_group] = choice;
        cand_index[group_rank * per_slot + in_group] = e;
    }
    __syncthreads();
    if (candidate) {
        int r = 0;
        for (int j = 0; j < slots; ++j) {
            const float c = cand_value[j];
            r += (c > choice || (c == choice && cand_index[j] < e)) ? 1 : 0;
        }
        if (r < K) {
            chosen[r] = e;
            chosen_score[r] = score;
        }
    }
    __syncthreads();
    if (e < K) {
        float sum = 0.0f;  // in the chosen order, as the CPU sums
        for (int k = 0; k < K; ++k) sum += chosen_score[k];
        const float norm = p.norm_topk_prob ? 1.0f / (sum + 1e-20f) : 1.0f;
        topk_idx[static_cast<size_t>(t) * K + e] = chosen[e];
        topk_weight[static_cast<size_t>(t) * K + e] = chosen_score[e] * norm * p.routed_scaling_factor;
    }
}

}  // namespace

void launch_moe_route(const float* logits, const float* bias, const RouterParams& p, int T, int* topk_idx,
                      float* topk_weight, void* cuda_stream) {
    const int E = p.num_experts, G = p.n_group, K = p.top_k;
    FANOUT_DEVICE_REQUIRE(E > 0 && E <= kMaxExperts && G > 0 && G <= kMaxGroups && E % G == 0 && p.topk_group >= 1 &&
                              p.topk_group <= G && K >= 1 && K <= kMaxK && K <= p.topk_group * (E / G),
                          "moe_route: unsupported params experts=" + std::to_string(E) +
                              " n_group=" + std::to_string(G) + " topk_group=" + std::to_string(p.topk_group) +
                              " top_k=" + std::to_string(K) + " (GPU: experts <= 512, groups <= 32, top_k <= 32)");
    if (T <= 0) return;
    const int threads = (E + 31) / 32 * 32;
    launch_pdl(moe_route_kernel, T, threads, 0, static_cast<cudaStream_t>(cuda_stream), logits, bias, p, topk_idx,
               topk_weight);
}

}  // namespace fanout::ops

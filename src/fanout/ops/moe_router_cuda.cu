// The MoE router on the GPU (moe_router.h's rule), one warp per token, everything in registers and
// warp shuffles but the group scores: lane l holds experts l, l + 32, ... (sigmoid score and the
// biased choice value); each group's top-two sum is computed by one lane from a shared-memory copy
// of the choices; the kept groups and then the top_k experts come from repeated warp-wide
// arg-max (value first, lower index on ties — the CPU's order). Only fmt-free headers here.
#include <cuda_runtime.h>

#include <string>

#include "fanout/core/cuda_check.h"
#include "fanout/ops/moe_router_cuda.h"

namespace fanout::ops {
namespace {

constexpr int kMaxPerLane = 16, kMaxExperts = 32 * kMaxPerLane, kMaxK = 32, kWarps = 4;

// The warp's arg-max of (v, i): the larger v, the lower i on ties.
__device__ __forceinline__ void warp_argmax(float& v, int& i) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
    }
}

__global__ void __launch_bounds__(kWarps * 32)
    moe_route_kernel(const float* __restrict__ logits, const float* __restrict__ bias, RouterParams p, int T,
                     int* __restrict__ topk_idx, float* __restrict__ topk_weight) {
    __shared__ float choices[kWarps][kMaxExperts];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int t = blockIdx.x * kWarps + warp;
    if (t >= T) return;
    const int E = p.num_experts, G = p.n_group, per_group = E / G;
    const float kNegInf = -__int_as_float(0x7f800000);
    float score[kMaxPerLane], choice[kMaxPerLane];
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
        const int e = lane + 32 * j;
        score[j] = 0.0f;
        choice[j] = kNegInf;
        if (e < E) {
            score[j] = 1.0f / (1.0f + expf(-logits[static_cast<size_t>(t) * E + e]));
            choice[j] = score[j] + (bias != nullptr ? bias[e] : 0.0f);
            choices[warp][e] = choice[j];
        }
    }
    if (G > 1) {
        __syncwarp();
        // Lane g: the sum of its group's top two choice values (-inf-initialised like the CPU's).
        float gs = kNegInf;
        if (lane < G) {
            float a = kNegInf, b = kNegInf;
            for (int j = 0; j < per_group; ++j) {
                const float c = choices[warp][lane * per_group + j];
                if (c > a) {
                    b = a;
                    a = c;
                } else if (c > b) {
                    b = c;
                }
            }
            gs = a + b;
        }
        bool keep = false;  // lane g: group g is among the topk_group best
        for (int r = 0; r < p.topk_group; ++r) {
            float v = lane < G && !keep ? gs : kNegInf;
            int i = lane < G && !keep ? lane : 1 << 30;
            warp_argmax(v, i);
            if (lane == i) keep = true;
        }
#pragma unroll
        for (int j = 0; j < kMaxPerLane; ++j) {
            const int e = lane + 32 * j;
            const bool kept = __shfl_sync(0xffffffffu, keep, (e < E ? e : 0) / per_group % 32);
            if (e < E && !kept) choice[j] = kNegInf;
        }
    }
    // top_k by choice value; the chosen lane retires its entry.
    float sum = 0.0f, chosen_score = 0.0f;
    int chosen = 0;
    for (int k = 0; k < p.top_k; ++k) {
        float v = kNegInf;
        int i = 1 << 30;
#pragma unroll
        for (int j = 0; j < kMaxPerLane; ++j) {
            const int e = lane + 32 * j;
            if (e < E && (choice[j] > v || (choice[j] == v && e < i))) v = choice[j], i = e;
        }
        warp_argmax(v, i);
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < kMaxPerLane; ++j)
            if (lane + 32 * j == i) {
                s = score[j];
                choice[j] = kNegInf;  // retired: the top_k always come from finite (kept) choices
            }
        s = __shfl_sync(0xffffffffu, s, i % 32);
        sum += s;
        if (lane == k) chosen = i, chosen_score = s;
    }
    const float norm = p.norm_topk_prob ? 1.0f / (sum + 1e-20f) : 1.0f;
    if (lane < p.top_k) {
        topk_idx[static_cast<size_t>(t) * p.top_k + lane] = chosen;
        topk_weight[static_cast<size_t>(t) * p.top_k + lane] = chosen_score * norm * p.routed_scaling_factor;
    }
}

}  // namespace

void launch_moe_route(const float* logits, const float* bias, const RouterParams& p, int T, int* topk_idx,
                      float* topk_weight, void* cuda_stream) {
    const int E = p.num_experts, G = p.n_group, K = p.top_k;
    FANOUT_DEVICE_REQUIRE(E > 0 && E <= kMaxExperts && G > 0 && G <= 32 && E % G == 0 && p.topk_group >= 1 &&
                              p.topk_group <= G && K >= 1 && K <= kMaxK && K <= p.topk_group * (E / G),
                          "moe_route: unsupported params experts=" + std::to_string(E) +
                              " n_group=" + std::to_string(G) + " topk_group=" + std::to_string(p.topk_group) +
                              " top_k=" + std::to_string(K) + " (GPU: experts <= 512, groups <= 32, top_k <= 32)");
    if (T <= 0) return;
    moe_route_kernel<<<(T + kWarps - 1) / kWarps, kWarps * 32, 0, static_cast<cudaStream_t>(cuda_stream)>>>(
        logits, bias, p, T, topk_idx, topk_weight);
    FANOUT_CUDA_CHECK_LAUNCH("moe_route_kernel");
}

}  // namespace fanout::ops

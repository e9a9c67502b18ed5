// The MoE router's parameters and its GPU kernel (moe_router.h has the CPU reference and the
// routing rule). fmt-free, so CUDA translation units can include it.
#pragma once

namespace fanout::ops {

// DeepSeek-V3: 256 experts, top 8, 8 groups, top 4 groups. Mixtral-style routing is n_group = 1
// (the group is all experts) without a bias.
struct RouterParams {
    int num_experts = 0;
    int top_k = 0;
    int n_group = 1;
    int topk_group = 1;
    bool norm_topk_prob = true;
    float routed_scaling_factor = 1.0f;
};

#ifdef FANOUT_WITH_CUDA
// moe_route on the device, a CTA per token: logits [T, E] f32, bias [E] f32 or nullptr;
// topk_idx [T, top_k] i32 and topk_weight [T, top_k] f32 as the CPU reference orders them. At most
// 512 experts, 32 groups and 32 chosen experts; parameters are checked like the CPU's.
void launch_moe_route(const float* logits, const float* bias, const RouterParams& p, int T, int* topk_idx,
                      float* topk_weight, void* cuda_stream);
#endif

}  // namespace fanout::ops

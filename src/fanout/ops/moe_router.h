// moe_route: DeepSeek-V3's noaux_tc routing, from gate logits to (expert, weight) per token.
//
// scores = sigmoid(logits); choice = scores + correction_bias (for choosing only);
// group score = sum of the top-2 choice values in each of n_group groups; keep the topk_group
// best groups; experts outside them get -inf (not 0: biased scores can be negative); top_k of the
// rest by choice value. Weights are the unbiased scores of the chosen experts, divided by their sum
// when norm_topk_prob, times routed_scaling_factor. Ties go to the lower index.
#pragma once

#include <cstdint>

#include "fanout/core/tensor.h"
#include "fanout/core/thread_pool.h"
#include "fanout/ops/moe_router_cuda.h"

namespace fanout::ops {

// logits: [T, E] f32; bias: [E] f32 or nullptr; topk_idx: [T, top_k] i32 (by descending choice
// value); topk_weight: [T, top_k] f32.
void moe_route(const Tensor& logits, const float* bias, const RouterParams& p, Tensor& topk_idx, Tensor& topk_weight,
               const Stream& s);

}  // namespace fanout::ops

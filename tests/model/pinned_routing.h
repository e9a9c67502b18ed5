// Routing that cannot flip under rounding, for GPU-vs-CPU and GPU-vs-GPU comparisons on random
// models (see model_cuda_test.cc's file comment on routing near-ties).
#pragma once

#include "fanout/model/deepseek_v3.h"

namespace fanout::testing {

// Spaces each MoE layer's correction bias by 2 (sigmoid scores lie in (0, 1)), so the experts with
// the largest bias win for every token: routing cannot flip under rounding. Writes the loaded
// weights in place (the bias is an f32 copy, not the checkpoint's mapping); the MTP layer's too.
inline void pin_routing(const model::DeepseekV3& m) {
    const auto pin = [](const model::LayerWeights& l) {
        if (!l.is_moe || !l.moe.bias.defined() || l.moe.bias.numel() == 0) return;
        float* b = l.moe.bias.data_as<float>();
        for (int64_t e = 0; e < l.moe.bias.numel(); ++e) b[e] = 2.0f * static_cast<float>((e * 7) % l.moe.bias.numel());
    };
    for (const model::LayerWeights& l : m.weights().layers) pin(l);
    if (m.weights().mtp) pin(m.weights().mtp->layer);
}

}  // namespace fanout::testing

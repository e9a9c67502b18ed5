// Sampling on the device: sample_with_uniform (sampling.h) for every row of a step's logits, one
// block per row, so the logits never leave the GPU. The uniform draws come from each request's
// host-side generator (Sampler::next_uniform), so a GPU step picks the tokens the CPU would.
// fmt-free, so CUDA translation units can include it.
#pragma once

#include <cstdint>

namespace fanout::ops {

// One row's parameters as the device reads them (SamplingParams without the seed, plus the draw).
struct SamplingRow {
    float temperature = 0.0f;
    int top_k = 0;
    float top_p = 1.0f;
    double uniform = 0.0;
};

#ifdef FANOUT_WITH_CUDA
// logits: [rows, vocab] f32; params: [rows] on the device; tokens: [rows] i32. Graph-safe.
void launch_sample(const float* logits, int rows, int vocab, const SamplingRow* params, int32_t* tokens,
                   void* cuda_stream);
#endif

}  // namespace fanout::ops

// Sampling on the device: sample_with_uniform (sampling.h) for every row of a step's logits, one
// block per row, so the logits never leave the GPU — or, for a row checking a speculative draft
// token, check_draft_with_uniforms. The uniform draws come from each request's
// host-side generator (Sampler::next_uniform), so a GPU step picks the tokens the CPU would.
// fmt-free, so CUDA translation units can include it.
#pragma once

#include <cstdint>

namespace fanout::ops {

// One entry of a row's logit_bias, as the device reads it.
struct LogitBias {
    int32_t id = 0;
    float bias = 0.0f;
};

// A temperature below this is greedy, on the CPU and the GPU alike (vLLM's _SAMPLING_EPS): a
// logit divided by less can overflow f32 (a temperature of 1e-38 turned every logit into ±inf and
// the CPU's draw into NaNs, which picked the least likely token).
inline constexpr float kGreedyTemperature = 1e-5f;

// One row's parameters as the device reads them (SamplingParams without the seed, plus the draw).
// The row's logit_bias is entries [bias_begin, bias_begin + bias_count) of the step's LogitBias
// array: a step uploads all its rows' biases as one array, so a graph reads them at fixed addresses.
struct SamplingRow {
    float temperature = 0.0f;
    int top_k = 0;
    float top_p = 1.0f;
    double uniform = 0.0;
    int32_t bias_begin = 0;
    int32_t bias_count = 0;
    // >= 0: the row checks this draft token (check_draft_with_uniforms with `uniform` as the
    // acceptance draw and uniform_residual as the rejected draft's replacement draw).
    int32_t draft = -1;
    double uniform_residual = 0.0;
};

// The token launch_sample writes for a row that breaks the CPU sampler's precondition (a NaN or
// +inf logit, or every one -inf: the model's output went wrong), where the CPU throws.
inline constexpr int32_t kNotFinite = -1;

#ifdef FANOUT_WITH_CUDA
// logits: [rows, vocab] f32; params: [rows] on the device; logit_bias: the entries the rows point
// at, on the device (may be null when no row has any), each id at most once per row — ids outside
// [0, vocab) are skipped; tokens: [rows] i32. Each row's biases are added to its logits in place
// before it is sampled; a row whose logits are not finite gets kNotFinite. Graph-safe.
void launch_sample(float* logits, int rows, int vocab, const SamplingRow* params, const LogitBias* logit_bias,
                   int32_t* tokens, void* cuda_stream);
#endif

}  // namespace fanout::ops

// generate: one request through prefill (in chunks) and decode, sampling each new token, stopping
// at an EOS id or max_tokens. The single-request loop behind `fanout generate`; the batching
// engine (engine/) drives DeepseekV3::forward itself.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "fanout/model/deepseek_v3.h"
#include "fanout/ops/sampling.h"

namespace fanout::model {

struct GenerateRequest {
    std::vector<int32_t> prompt;
    int64_t max_tokens = 16;
    ops::SamplingParams sampling;
    bool ignore_eos = false;
    int64_t prefill_chunk = 512;  // prompt tokens per forward step
};

struct GenerateResult {
    std::vector<int32_t> tokens;  // generated tokens, EOS included when it stopped there
    std::string finish_reason;    // "stop" (EOS) or "length"
    int64_t prompt_tokens = 0;
    double prefill_seconds = 0, decode_seconds = 0;
};

// Throws Error for a bad request (empty prompt, token id outside the vocabulary, too long).
GenerateResult generate(const DeepseekV3& model, kv::PagedKvCache& cache, const GenerateRequest& req,
                        const ForwardOptions& opts, const Stream& s,
                        const std::function<void(int32_t)>& on_token = {});

// The loop behind generate() and generate_cuda(): `step` runs one StepBatch (built on `cache`'s
// blocks) and returns the token sampled from its logit row with `sampler`, or -1 when the batch
// asks for no logits (a prefill chunk before the last).
using SampleStep = std::function<int32_t(const StepBatch&, ops::Sampler&)>;
GenerateResult generate_loop(const io::ModelConfig& config, kv::PagedKvCache& cache, const GenerateRequest& req,
                             const SampleStep& step, const std::function<void(int32_t)>& on_token = {});

}  // namespace fanout::model

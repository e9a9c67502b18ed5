// Token sampling: greedy, temperature, top-k, top-p, with a seeded generator per request.
//
// logit_bias (OpenAI's, as vLLM applies it) is added to the logits before anything else: the
// biased logit of token i is logits[i] + bias, in f32. A temperature of 0 — or any below
// kGreedyTemperature (sampling_cuda.h: 1e-5, as vLLM) — is greedy (argmax of the biased logits,
// ties to the lower id). Otherwise the biased logits are divided by the
// temperature, restricted to the top_k most likely (0 = all), then to the smallest set whose
// probability reaches top_p (1 = all), renormalized and sampled. The generator is a 64-bit
// Mersenne twister drawing doubles from its top 53 bits, so a seed gives the same tokens on
// every machine. Logits must be finite or −∞ (a NaN or +∞ from the model is an error naming the
// token, as is a row with no finite logit); the GPU sampler writes kNotFinite for such a row.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "fanout/ops/sampling_cuda.h"

namespace fanout::ops {

// A bias of at most this magnitude may be added to a token's logit (OpenAI's range).
constexpr float kMaxLogitBias = 100.0f;

struct SamplingParams {
    float temperature = 0.0f;
    int top_k = 0;
    float top_p = 1.0f;
    uint64_t seed = 0;
    // (token id, bias in [-100, 100]) sorted by id, each id once. Ids must be in the vocabulary;
    // that bound is checked where the vocabulary is known (Engine::submit).
    std::vector<std::pair<int32_t, float>> logit_bias = {};
};

// Throws Error for out-of-range parameters (negative temperature, top_p outside (0, 1], a bias
// outside [-100, 100], logit_bias ids negative or not strictly ascending, ...).
void validate_sampling_params(const SamplingParams& p);

// The rule above for one row of logits given the uniform draw u in [0, 1) (unused when greedy):
// the kept tokens in (logit descending, id ascending) order, the first whose running probability
// exceeds u · (kept total). The GPU sampler (sampling_cuda.h) computes the same function.
int32_t sample_with_uniform(const float* logits, int64_t vocab, const SamplingParams& p, double u,
                            std::vector<std::pair<float, int32_t>>& scratch);

// Speculative decoding's verdict on one draft token: the token to emit, and whether it is the draft.
struct DraftCheck {
    int32_t token = 0;
    bool accepted = false;
};

// The check of a draft token proposed with certainty (a greedy draft) against the target logits,
// with its two draws given: greedy accepts it when it is the argmax (and emits the argmax either
// way); sampling accepts it when u_accept · (kept total) < its weight — probability p(draft) under
// the request's distribution (temperature, top-k, top-p, bias) — and otherwise emits the kept
// token, in the rule's order with the draft removed, at which the running weight first exceeds
// u_residual · (kept total − the draft's weight): the rejection rule for a one-hot draft
// distribution, so what is emitted follows p exactly. The emitted token is the draft exactly when
// it is accepted. The GPU sampler (sampling_cuda.h: SamplingRow::draft) computes the same function.
DraftCheck check_draft_with_uniforms(const float* logits, int64_t vocab, const SamplingParams& p, int32_t draft,
                                     double u_accept, double u_residual,
                                     std::vector<std::pair<float, int32_t>>& scratch);

class Sampler {
  public:
    explicit Sampler(const SamplingParams& p);
    // logits: [vocab] f32.
    int32_t sample(const float* logits, int64_t vocab);
    // check_draft_with_uniforms with this request's next two draws (none when greedy).
    DraftCheck check_draft(const float* logits, int64_t vocab, int32_t draft);
    // One row of a step as the GPU sampler reads it (sampling_cuda.h): sample_with_uniform with
    // row.uniform, or, for a draft row (row.draft >= 0), check_draft_with_uniforms with
    // row.uniform and row.uniform_residual — this request's parameters, bias included.
    int32_t pick(const float* logits, int64_t vocab, double uniform, int32_t draft, double uniform_residual);
    // The next draw of this request's generator — one per sampled token, none when greedy — so a
    // GPU step can sample with the same draws the CPU would use.
    double next_uniform();
    const SamplingParams& params() const { return params_; }

  private:
    SamplingParams params_;
    std::mt19937_64 rng_;
    std::vector<std::pair<float, int32_t>> scratch_;
};

int32_t argmax(const float* logits, int64_t n);
// argmax of logits + bias (bias: sorted by id; ids >= n are ignored).
int32_t argmax(const float* logits, int64_t n, std::span<const std::pair<int32_t, float>> bias);

}  // namespace fanout::ops

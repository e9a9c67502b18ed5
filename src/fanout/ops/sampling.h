// Token sampling: greedy, temperature, top-k, top-p, with a seeded generator per request.
//
// temperature == 0 is greedy (argmax, ties to the lower id). Otherwise logits are divided by the
// temperature, restricted to the top_k most likely (0 = all), then to the smallest set whose
// probability reaches top_p (1 = all), renormalized and sampled. The generator is a 64-bit
// Mersenne twister drawing doubles from its top 53 bits, so a seed gives the same tokens on
// every machine.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace fanout::ops {

struct SamplingParams {
    float temperature = 0.0f;
    int top_k = 0;
    float top_p = 1.0f;
    uint64_t seed = 0;
};

// Throws Error for out-of-range parameters (negative temperature, top_p outside (0, 1], ...).
void validate_sampling_params(const SamplingParams& p);

// The rule above for one row of logits given the uniform draw u in [0, 1) (unused when greedy):
// the kept tokens in (logit descending, id ascending) order, the first whose running probability
// exceeds u · (kept total). The GPU sampler (sampling_cuda.h) computes the same function.
int32_t sample_with_uniform(const float* logits, int64_t vocab, const SamplingParams& p, double u,
                            std::vector<std::pair<float, int32_t>>& scratch);

class Sampler {
  public:
    explicit Sampler(const SamplingParams& p);
    // logits: [vocab] f32.
    int32_t sample(const float* logits, int64_t vocab);
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

}  // namespace fanout::ops

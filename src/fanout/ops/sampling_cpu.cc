#include <algorithm>
#include <cmath>

#include "fanout/core/error.h"
#include "fanout/ops/sampling.h"

namespace fanout::ops {

void validate_sampling_params(const SamplingParams& p) {
    FANOUT_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.0f,
                 "temperature must be a finite number >= 0, got {}", p.temperature);
    FANOUT_CHECK(p.top_k >= 0, "top_k must be >= 0 (0 = off), got {}", p.top_k);
    FANOUT_CHECK(std::isfinite(p.top_p) && p.top_p > 0.0f && p.top_p <= 1.0f, "top_p must be in (0, 1], got {}",
                 p.top_p);
    for (size_t i = 0; i < p.logit_bias.size(); ++i) {
        const auto [id, bias] = p.logit_bias[i];
        FANOUT_CHECK(id >= 0, "logit_bias: token id {} is negative", id);
        FANOUT_CHECK(i == 0 || id > p.logit_bias[i - 1].first,
                     "logit_bias: token ids must be sorted ascending and unique (token id {} after {})", id,
                     p.logit_bias[i - 1].first);
        FANOUT_CHECK(std::isfinite(bias) && std::fabs(bias) <= kMaxLogitBias,
                     "logit_bias: the bias of token id {} must be in [-100, 100], got {}", id, bias);
    }
}

int32_t argmax(const float* logits, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i)
        if (logits[i] > logits[best]) best = i;
    return static_cast<int32_t>(best);
}

int32_t argmax(const float* logits, int64_t n, std::span<const std::pair<int32_t, float>> bias) {
    if (bias.empty()) return argmax(logits, n);
    // The plain argmax between biased ids, then each biased id on its own: no copy of the row.
    int64_t best = 0;
    float best_value = bias[0].first == 0 ? logits[0] + bias[0].second : logits[0];
    int64_t from = 1;
    const auto consider = [&](int64_t i, float v) {
        if (v > best_value) {
            best = i;
            best_value = v;
        }
    };
    for (const auto& [id, b] : bias) {
        if (id >= n) break;
        for (int64_t i = from; i < id; ++i) consider(i, logits[i]);
        if (id >= from) consider(id, logits[id] + b);
        from = std::max<int64_t>(from, id + 1);
    }
    for (int64_t i = from; i < n; ++i) consider(i, logits[i]);
    return static_cast<int32_t>(best);
}

Sampler::Sampler(const SamplingParams& p) : params_(p), rng_(p.seed) { validate_sampling_params(p); }

double Sampler::next_uniform() {
    if (params_.temperature < kGreedyTemperature) return 0.0;
    return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
    return sample_with_uniform(logits, vocab, params_, next_uniform(), scratch_);
}

namespace {

bool greedy(const SamplingParams& p) { return p.temperature < kGreedyTemperature; }

// The rule's precondition: no NaN or +∞ (what the model computed went wrong) and at least one
// finite logit. Unchecked, a NaN breaks the sort's ordering and +∞ makes every weight NaN.
void check_logits(const float* logits, int64_t vocab) {
    bool finite = false;
    for (int64_t i = 0; i < vocab; ++i) {
        const float l = logits[i];
        FANOUT_CHECK(!std::isnan(l) && l != INFINITY,
                     "sample: the logit of token {} is {}: the model's output is not finite", i, l);
        finite = finite || l != -INFINITY;
    }
    FANOUT_CHECK(finite, "sample: every logit of the row is -inf");
}

// The kept tokens of the rule (sampling.h) with their unnormalized probabilities, in (logit
// descending, id ascending) order, in v[0, keep); returns keep and their total in *total.
size_t kept_tokens(const float* logits, int64_t vocab, const SamplingParams& params,
                   std::vector<std::pair<float, int32_t>>& v, double* total) {
    v.resize(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) v[i] = {logits[i] / params.temperature, static_cast<int32_t>(i)};
    for (const auto& [id, b] : params.logit_bias)  // the biased ones again, from logits[id] + bias
        if (id < vocab) v[id].first = (logits[id] + b) / params.temperature;
    const auto by_logit = [](const auto& a, const auto& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    size_t keep = v.size();
    if (params.top_k > 0 && static_cast<size_t>(params.top_k) < keep) {
        keep = static_cast<size_t>(params.top_k);
        std::partial_sort(v.begin(), v.begin() + keep, v.end(), by_logit);
    } else {
        std::sort(v.begin(), v.end(), by_logit);
    }
    const float max_logit = v[0].first;
    double sum = 0.0;
    for (size_t i = 0; i < keep; ++i) {
        v[i].first = std::exp(v[i].first - max_logit);  // now an unnormalized probability
        sum += v[i].first;
    }
    if (params.top_p < 1.0f) {
        double cum = 0.0;
        size_t n = 0;
        while (n < keep) {
            cum += v[n].first;
            ++n;
            if (cum >= params.top_p * sum) break;
        }
        keep = n;
        sum = cum;
    }
    *total = sum;
    return keep;
}

}  // namespace

int32_t sample_with_uniform(const float* logits, int64_t vocab, const SamplingParams& params, double uniform,
                            std::vector<std::pair<float, int32_t>>& v) {
    FANOUT_CHECK(vocab > 0, "sample: empty logits");
    check_logits(logits, vocab);
    if (greedy(params)) return argmax(logits, vocab, params.logit_bias);
    double total = 0.0;
    const size_t keep = kept_tokens(logits, vocab, params, v, &total);
    const double u = uniform * total;
    double cum = 0.0;
    for (size_t i = 0; i < keep; ++i) {
        cum += v[i].first;
        if (u < cum) return v[i].second;
    }
    return v[keep - 1].second;
}

DraftCheck check_draft_with_uniforms(const float* logits, int64_t vocab, const SamplingParams& p, int32_t draft,
                                     double u_accept, double u_residual,
                                     std::vector<std::pair<float, int32_t>>& scratch) {
    FANOUT_CHECK(vocab > 0, "check_draft: empty logits");
    check_logits(logits, vocab);
    if (greedy(p)) {
        const int32_t t = argmax(logits, vocab, p.logit_bias);
        return {t, t == draft};
    }
    double total = 0.0;
    const size_t keep = kept_tokens(logits, vocab, p, scratch, &total);
    double w_draft = 0.0;  // p(draft) · total; 0 when top-k / top-p dropped it
    for (size_t i = 0; i < keep; ++i)
        if (scratch[i].second == draft) w_draft = scratch[i].first;
    if (u_accept * total < w_draft) return {draft, true};
    // Rejected: a draw from p with the draft removed.
    const double u = u_residual * (total - w_draft);
    double cum = 0.0;
    int32_t last = -1;
    for (size_t i = 0; i < keep; ++i) {
        if (scratch[i].second == draft) continue;
        cum += scratch[i].first;
        last = scratch[i].second;
        if (u < cum) return {last, false};
    }
    // Only rounding gets here: the last kept token that is not the draft (none: the draft was
    // the only one kept, and u_accept · total < total accepted it above).
    return {last >= 0 ? last : draft, last < 0};
}

DraftCheck Sampler::check_draft(const float* logits, int64_t vocab, int32_t draft) {
    const double u_accept = next_uniform(), u_residual = next_uniform();
    return check_draft_with_uniforms(logits, vocab, params_, draft, u_accept, u_residual, scratch_);
}

int32_t Sampler::pick(const float* logits, int64_t vocab, double uniform, int32_t draft, double uniform_residual) {
    if (draft < 0) return sample_with_uniform(logits, vocab, params_, uniform, scratch_);
    return check_draft_with_uniforms(logits, vocab, params_, draft, uniform, uniform_residual, scratch_).token;
}

}  // namespace fanout::ops

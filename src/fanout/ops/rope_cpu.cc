#include <algorithm>
#include <cmath>
#include <numbers>

#include "fanout/ops/rope.h"

namespace fanout::ops {
namespace {

// The dimension index whose wavelength completes `num_rotations` turns over max_position.
double yarn_correction_dim(double num_rotations, int64_t dim, double base, int64_t max_position) {
    return (static_cast<double>(dim) * std::log(max_position / (num_rotations * 2.0 * std::numbers::pi))) /
           (2.0 * std::log(base));
}

}  // namespace

RopeTable make_rope_table(const RopeParams& p) {
    FANOUT_CHECK(p.dim > 0 && p.dim % 2 == 0, "rope: dim={} must be positive and even", p.dim);
    RopeTable t;
    t.dim = p.dim;
    t.attention_factor = static_cast<float>(p.attention_factor);
    const int64_t half = p.dim / 2;
    t.inv_freq.resize(static_cast<size_t>(half));
    // HF computes the frequencies in float32; so do we, to share its rounding.
    for (int64_t i = 0; i < half; ++i) {
        const float pos_freq = std::pow(static_cast<float>(p.theta), static_cast<float>(2 * i) / p.dim);
        t.inv_freq[i] = 1.0f / pos_freq;
    }
    if (!p.yarn) return t;
    double low = yarn_correction_dim(p.beta_fast, p.dim, p.theta, p.original_max_position);
    double high = yarn_correction_dim(p.beta_slow, p.dim, p.theta, p.original_max_position);
    if (p.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(p.dim - 1));
    if (low == high) high += 0.001;  // avoid a zero-width ramp
    for (int64_t i = 0; i < half; ++i) {
        const float ramp = std::clamp(static_cast<float>((i - low) / (high - low)), 0.0f, 1.0f);
        const float extrapolation_factor = 1.0f - ramp;
        const float extrapolated = t.inv_freq[i];
        const float interpolated = extrapolated / static_cast<float>(p.factor);
        t.inv_freq[i] = interpolated * (1.0f - extrapolation_factor) + extrapolated * extrapolation_factor;
    }
    return t;
}

void rope_apply(Tensor& x, int64_t offset, const int32_t* positions, const RopeTable& table, const Stream& s) {
    FANOUT_CHECK(x.dtype() == DType::kF32 && x.ndim() == 3, "rope_apply: x must be [T, H, stride] f32, got {} {}",
                 dtype_name(x.dtype()), shape_str(x.shape()));
    const int64_t T = x.dim(0), H = x.dim(1), stride = x.dim(2), half = table.dim / 2;
    FANOUT_CHECK(offset >= 0 && offset + table.dim <= stride, "rope_apply: offset {} + dim {} exceeds stride {}",
                 offset, table.dim, stride);
    float* xp = x.data_as<float>();
    parallel_for(s, T, 4, [&](int64_t t0, int64_t t1) {
        std::vector<float> cos_v(static_cast<size_t>(half)), sin_v(static_cast<size_t>(half));
        for (int64_t t = t0; t < t1; ++t) {
            const float pos = static_cast<float>(positions[t]);
            for (int64_t i = 0; i < half; ++i) {
                const float angle = pos * table.inv_freq[i];
                cos_v[i] = std::cos(angle) * table.attention_factor;
                sin_v[i] = std::sin(angle) * table.attention_factor;
            }
            for (int64_t h = 0; h < H; ++h) {
                float* v = xp + (t * H + h) * stride + offset;
                for (int64_t i = 0; i < half; ++i) {
                    const float a = v[2 * i], b = v[2 * i + 1];
                    v[2 * i] = a * cos_v[i] - b * sin_v[i];
                    v[2 * i + 1] = b * cos_v[i] + a * sin_v[i];
                }
            }
        }
    });
}

}  // namespace fanout::ops

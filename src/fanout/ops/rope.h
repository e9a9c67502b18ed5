// Rotary position embedding for DeepSeek-V3: interleaved pairs (x[2i], x[2i+1]) rotated by
// pos · inv_freq[i], with YaRN frequency correction and YaRN's attention factor on cos/sin.
//
// HF's DeepseekV3 de-interleaves q and k before rotating (rope_interleave); since q and k get the
// same permutation their dot products are the same, so the cache keeps the interleaved layout.
#pragma once

#include <cstdint>
#include <vector>

#include "fanout/core/tensor.h"
#include "fanout/core/thread_pool.h"

namespace fanout::ops {

struct RopeParams {
    int64_t dim = 0;  // rotated values per head (qk_rope_head_dim), even
    double theta = 10000.0;
    bool yarn = false;
    double factor = 1.0;
    int64_t original_max_position = 4096;
    double beta_fast = 32.0, beta_slow = 1.0;
    bool truncate = true;
    double attention_factor = 1.0;  // multiplies cos and sin
};

struct RopeTable {
    int64_t dim = 0;
    std::vector<float> inv_freq;  // [dim / 2]
    float attention_factor = 1.0f;
};

RopeTable make_rope_table(const RopeParams& p);

// x: [T, H, stride] f32; rotates x[t, h, offset : offset + dim] by positions[t], in place.
void rope_apply(Tensor& x, int64_t offset, const int32_t* positions, const RopeTable& table, const Stream& s);

}  // namespace fanout::ops

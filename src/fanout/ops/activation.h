// silu_mul: out = silu(gate) * up, the gated MLP's activation.
#pragma once

#include "fanout/core/tensor.h"
#include "fanout/core/thread_pool.h"

namespace fanout::ops {

// gate, up, out: [M, I] f32 (out may alias gate).
void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out, const Stream& s);

}  // namespace fanout::ops

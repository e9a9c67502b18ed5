// rms_norm: out[m] = x[m] / sqrt(mean(x[m]²) + eps) * w.
#pragma once

#include "fanout/core/tensor.h"
#include "fanout/core/thread_pool.h"

namespace fanout::ops {

// x: [M, D] f32; w: [D] f32; out: [M, D] f32 (may alias x).
void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out, const Stream& s);

#ifdef FANOUT_WITH_CUDA
// x, out: [M, D] f32 (may alias); w: [D] f32.
void launch_rms_norm(const float* x, const float* w, float eps, float* out, int M, int D, void* cuda_stream);
#endif

}  // namespace fanout::ops

#include "fanout/ops/activation.h"
#include "fanout/ops/cpu_util.h"

namespace fanout::ops {

void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out, const Stream& s) {
    check_tensor(gate, "silu_mul gate", DType::kF32, {-1, -1});
    check_tensor(up, "silu_mul up", DType::kF32, {gate.dim(0), gate.dim(1)});
    check_tensor(out, "silu_mul out", DType::kF32, {gate.dim(0), gate.dim(1)});
    const float* g = gate.data_as<float>();
    const float* u = up.data_as<float>();
    float* o = out.data_as<float>();
    parallel_for(s, gate.numel(), 4096, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) o[i] = cpu::silu(g[i]) * u[i];
    });
}

}  // namespace fanout::ops

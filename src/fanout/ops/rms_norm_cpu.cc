#include <cmath>

#include "fanout/ops/cpu_util.h"
#include "fanout/ops/rms_norm.h"

namespace fanout::ops {

void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out, const Stream& s) {
    check_tensor(x, "rms_norm x", DType::kF32, {-1, -1});
    const int64_t M = x.dim(0), D = x.dim(1);
    check_tensor(w, "rms_norm w", DType::kF32, {D});
    check_tensor(out, "rms_norm out", DType::kF32, {M, D});
    const float* xp = x.data_as<float>();
    const float* wp = w.data_as<float>();
    float* op = out.data_as<float>();
    parallel_for(s, M, 8, [&](int64_t m0, int64_t m1) {
        for (int64_t m = m0; m < m1; ++m) {
            const float* row = xp + m * D;
            const float inv = 1.0f / std::sqrt(cpu::dot(row, row, D) / static_cast<float>(D) + eps);
            for (int64_t d = 0; d < D; ++d) op[m * D + d] = row[d] * inv * wp[d];
        }
    });
}

}  // namespace fanout::ops

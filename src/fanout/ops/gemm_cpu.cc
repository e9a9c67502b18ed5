#include <algorithm>
#include <vector>

#include "fanout/ops/cpu_util.h"
#include "fanout/ops/fp8_constants.h"
#include "fanout/ops/gemm.h"

namespace fanout::ops {

void gemm_fp8_cpu(const uint8_t* x, const float* sx, const uint8_t* w, const float* sw, float* y, int64_t M,
                  int64_t N, int64_t K, const Stream& s) {
    const int64_t nbk = (K + kFp8Block - 1) / kFp8Block;
    std::vector<float> xf(static_cast<size_t>(M * K));
    convert_to_f32(x, DType::kFP8E4M3, xf.size(), xf.data());
    parallel_for(s, N, 16, [&](int64_t n0, int64_t n1) {
        std::vector<float> row(static_cast<size_t>(K));
        for (int64_t n = n0; n < n1; ++n) {
            convert_to_f32(w + n * K, DType::kFP8E4M3, static_cast<size_t>(K), row.data());
            const float* swn = sw + (n / kFp8Block) * nbk;
            for (int64_t m = 0; m < M; ++m) {
                float acc = 0.0f;
                for (int64_t b = 0; b < nbk; ++b) {
                    const int64_t k0 = b * kFp8Block, len = std::min(kFp8Block, K - k0);
                    acc += cpu::dot(xf.data() + m * K + k0, row.data() + k0, len) * (sx[m * nbk + b] * swn[b]);
                }
                y[m * N + n] = acc;
            }
        }
    });
}

}  // namespace fanout::ops

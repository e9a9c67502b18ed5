// Inner loops shared by the CPU reference ops. Written so GCC vectorizes them at -O2/-O3 with
// AVX2 without -ffast-math: the reduction keeps 8 independent partial sums, whose fixed order
// makes results reproducible run to run.
#pragma once

#include <cmath>
#include <cstdint>

namespace fanout::ops::cpu {

inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
    float tail = 0.0f;
    for (; i < n; ++i) tail += a[i] * b[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

// out[r] = dot(a[r], b) for 4 rows a[r] = a + r * lda: b is loaded once for all four.
inline void dot4(const float* __restrict a, int64_t lda, const float* __restrict b, int64_t n, float* out) {
    float acc[4][8] = {};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) {
            const float bj = b[i + j];
            acc[0][j] += a[i + j] * bj;
            acc[1][j] += a[lda + i + j] * bj;
            acc[2][j] += a[2 * lda + i + j] * bj;
            acc[3][j] += a[3 * lda + i + j] * bj;
        }
    for (int r = 0; r < 4; ++r) {
        float tail = 0.0f;
        for (int64_t k = i; k < n; ++k) tail += a[r * lda + k] * b[k];
        const float* c = acc[r];
        out[r] = ((c[0] + c[1]) + (c[2] + c[3])) + ((c[4] + c[5]) + (c[6] + c[7])) + tail;
    }
}

// y += a * x
inline void axpy(float a, const float* __restrict x, float* __restrict y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace fanout::ops::cpu

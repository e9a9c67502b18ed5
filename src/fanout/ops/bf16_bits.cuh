// bf16 bit conversions for CUDA kernels that keep bf16 as uint16_t (the attention kernels).
// Include only from .cu files.
#pragma once

#include <cstdint>

namespace fanout::ops {

__device__ __forceinline__ float bf16_bits_to_float(uint16_t v) { return __uint_as_float(uint32_t(v) << 16); }

// Round to nearest even (finite inputs; NaN stays NaN).
__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace fanout::ops

// FP8 block-quantization constants shared by the CPU ops and the CUDA kernels (fmt-free, so
// .cu files can include it).
#pragma once

#include <cstdint>
#include <cstring>

#include "fanout/core/dtype.h"

#ifdef __CUDACC__
#define FANOUT_HOST_DEVICE __host__ __device__  // (one definition for the CPU ops and the kernels)
#else
#define FANOUT_HOST_DEVICE
#endif

namespace fanout::ops {

constexpr int64_t kFp8Block = 128;         // 1×128 activation blocks, 128×128 weight blocks
constexpr float kActQuantMinAmax = 1e-4f;  // DeepSeek's act_quant floor on a block's amax

// The FP8 KV cache's entry (mla_attention.h, FlashMLA's layout for DeepSeek-V3.2; the CPU ops and
// the decode kernel read these): kv_lora 512 e4m3 values, four f32 scales, 64 bf16 rope values.
constexpr int64_t kMlaFp8Lora = 512, kMlaFp8Rope = 64;
constexpr int64_t kMlaFp8ScaleOffset = kMlaFp8Lora;                         // bytes
constexpr int64_t kMlaFp8RopeOffset = kMlaFp8ScaleOffset + 4 * 4;           // 528
constexpr int64_t kMlaFp8EntryBytes = kMlaFp8RopeOffset + kMlaFp8Rope * 2;  // 656

// The FP8 KV cache's scale of a 128-value block whose largest magnitude is `amax`
// (mla_attention.h): amax / 448 rounded up to a bf16 value, so that the decode kernel multiplies
// by it in bf16x2 exactly, and kept within [2^-100, 2^15] (a block past 448 · 2^15 ≈ 1.5e7
// saturates); 1 for a block of zeros.
FANOUT_HOST_DEVICE inline float fp8_cache_scale(float amax) {
    if (!(amax > 0.0f)) return 1.0f;
    float s = amax / kFp8E4M3Max;
    uint32_t u;
    memcpy(&u, &s, 4);
    if (u & 0xffffu) u = (u & 0xffff0000u) + 0x10000u;  // up to the next bf16
    memcpy(&s, &u, 4);
    return s < 0x1p-100f ? 0x1p-100f : s > 0x1p15f ? 0x1p15f : s;
}

}  // namespace fanout::ops

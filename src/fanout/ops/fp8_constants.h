// FP8 block-quantization constants shared by the CPU ops and the CUDA kernels (fmt-free, so
// .cu files can include it).
#pragma once

#include <cstdint>
#include <cstring>

#include "fanout/core/dtype.h"

#ifdef __CUDACC__
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

#ifdef __CUDACC__
#define FANOUT_HOST_DEVICE __host__ __device__  // (one definition for the CPU ops and the kernels)
#else
#define FANOUT_HOST_DEVICE
#endif

namespace fanout::ops {

constexpr int64_t kFp8Block = 128;         // 1×128 activation blocks, 128×128 weight blocks
constexpr float kActQuantMinAmax = 1e-4f;  // DeepSeek's act_quant floor on a block's amax

// The order of an activation's scales, one f32 per 1×128 block of each of its `rows` rows:
// * kRowMajor, [rows][nb]: act_quant's layout. A token's scales sit beside each other, so they
//   travel with it: the MoE permute, the EP dispatch and the grouped GEMMs read this order.
// * kMMajor, [nb][rows]: cuBLASLt's VEC128 layout, which its block-scaled FP8 GEMM reads as it is
//   (the tile kernels read row-major; gemm.h's gemm_fp8_scale_order says which to write).
enum class ScaleOrder { kRowMajor, kMMajor };
// Where the scale of row r's block b is: scales[r * strides.row + b * strides.block].
struct ScaleStrides {
    int64_t row = 0, block = 0;
};
FANOUT_HOST_DEVICE constexpr ScaleStrides scale_strides(ScaleOrder order, int64_t rows, int64_t nb) {
    return order == ScaleOrder::kRowMajor ? ScaleStrides{nb, 1} : ScaleStrides{1, rows};
}

// The FP8 KV cache's entry (mla_attention.h; FlashMLA's layout for DeepSeek-V3.2, which the
// decode kernel reads at kv_lora 512, rope 64; the CPU ops, the append and gather kernels and the
// generic decode kernel at any widths): the kv_lora latent values in e4m3, then one f32 scale per
// 128 of them (the last group may be shorter), then the rope values in bf16. The scales need
// kv_lora % 4 == 0 and the rope part an even rope width (mla_fp8_widths_ok).
struct MlaFp8Layout {
    int64_t kv_lora = 0, rope = 0;
    FANOUT_HOST_DEVICE constexpr int64_t num_scales() const { return (kv_lora + kFp8Block - 1) / kFp8Block; }
    FANOUT_HOST_DEVICE constexpr int64_t scale_offset() const { return kv_lora; }  // bytes
    FANOUT_HOST_DEVICE constexpr int64_t rope_offset() const { return scale_offset() + 4 * num_scales(); }
    FANOUT_HOST_DEVICE constexpr int64_t entry_bytes() const { return rope_offset() + 2 * rope; }
};
constexpr bool mla_fp8_widths_ok(int64_t kv_lora, int64_t rope) {
    return kv_lora > 0 && kv_lora % 4 == 0 && rope > 0 && rope % 2 == 0;
}

// DeepSeek-V3's widths: 512 e4m3 values, four f32 scales, 64 bf16 rope values.
constexpr MlaFp8Layout kMlaFp8V3{512, 64};
constexpr int64_t kMlaFp8Lora = kMlaFp8V3.kv_lora, kMlaFp8Rope = kMlaFp8V3.rope;
constexpr int64_t kMlaFp8ScaleOffset = kMlaFp8V3.scale_offset();  // bytes
constexpr int64_t kMlaFp8RopeOffset = kMlaFp8V3.rope_offset();    // 528
constexpr int64_t kMlaFp8EntryBytes = kMlaFp8V3.entry_bytes();    // 656
static_assert(kMlaFp8RopeOffset == 528 && kMlaFp8EntryBytes == 656);

// Bytes of one latent cache entry (kv_lora + rope values) stored as `dtype` — f32, bf16, or
// kFP8E4M3 for the FP8 entry above — the one definition the caches, the memory plan and the GPU
// runner share; 0 for a dtype the cache does not store or FP8 widths it cannot.
constexpr int64_t latent_entry_bytes(int64_t kv_lora, int64_t rope, DType dtype) {
    switch (dtype) {
        case DType::kF32:
            return 4 * (kv_lora + rope);
        case DType::kBF16:
            return 2 * (kv_lora + rope);
        case DType::kFP8E4M3:
            return mla_fp8_widths_ok(kv_lora, rope) ? MlaFp8Layout{kv_lora, rope}.entry_bytes() : 0;
        default:
            return 0;
    }
}

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

#ifdef __CUDACC__
// An FP8 cache value as the kernels read it: e4m3 (exact in f16) times its group's scale, in f32
// (exact: 4 mantissa bits times 8); the caller rounds it to bf16 once, as the CPU's dequantized
// value rounds. The tensor-core decode kernel computes the same product in bf16x2 pairs.
__device__ __forceinline__ float fp8_cache_value(uint8_t e4m3, float scale) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(e4m3), __NV_E4M3);
    return __half2float(__half(h)) * scale;
}
#endif

}  // namespace fanout::ops

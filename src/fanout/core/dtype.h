// Element types and scalar conversions (f32, bf16, f16, fp8 e4m3fn, integers).
//
// Conversions to narrow types round to nearest even. fp8 e4m3fn has no infinity: values past
// ±448 saturate to ±448 (DeepSeek's activation quantization scales every block into range first,
// so saturation only guards rounding at the edge); NaN stays NaN.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fanout {

enum class DType { kF32, kBF16, kF16, kFP8E4M3, kI64, kI32, kI16, kI8, kU8, kBool, kF64 };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);  // safetensors spelling: "F32", "BF16", "F8_E4M3", ...
// Parses a safetensors dtype string; returns false for one fanout does not know.
bool dtype_from_name(std::string_view name, DType* out);
// The KV cache's entry types by the names `--kv-dtype`, the planner and the benchmarks' JSON use:
// "f32", "bf16", "fp8" (kFP8E4M3: the FP8 entry of ops/fp8_constants.h). kv_dtype_from_name throws
// naming the choices; kv_dtype_name gives "?" for another type.
DType kv_dtype_from_name(std::string_view name);
std::string_view kv_dtype_name(DType dtype);

inline float bf16_to_f32(uint16_t v) { return std::bit_cast<float>(static_cast<uint32_t>(v) << 16); }

inline uint16_t f32_to_bf16(float f) {
    uint32_t bits = std::bit_cast<uint32_t>(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<uint16_t>(bits >> 16);
}

// Rounds f to the nearest bf16 value and back: what storing to bf16 does to a float.
inline float round_to_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t v);
uint16_t f32_to_f16(float f);

namespace detail {
constexpr float pow2(int e) {
    float r = 1.0f;
    for (; e > 0; --e) r *= 2.0f;
    for (; e < 0; ++e) r *= 0.5f;
    return r;
}
constexpr float decode_fp8e4m3(int v) {
    const int exp = (v >> 3) & 0xf, man = v & 7;
    if (exp == 0xf && man == 7) return __builtin_nanf("");
    const float mag = exp == 0 ? man * pow2(-9) : (1.0f + man / 8.0f) * pow2(exp - 7);
    return (v & 0x80) ? -mag : mag;
}
struct Fp8Table {
    float v[256];
    constexpr Fp8Table() : v() {
        for (int i = 0; i < 256; ++i) v[i] = decode_fp8e4m3(i);
    }
};
inline constexpr Fp8Table kFp8E4M3Table{};
}  // namespace detail

inline float fp8e4m3_to_f32(uint8_t v) { return detail::kFp8E4M3Table.v[v]; }
uint8_t f32_to_fp8e4m3(float f);

constexpr float kFp8E4M3Max = 448.0f;

// Reads element i of a buffer of the given floating dtype as f32.
float load_as_f32(const void* data, DType dtype, size_t i);
// Converts n elements of a floating dtype to f32 (fp8 without scales: raw values).
void convert_to_f32(const void* src, DType dtype, size_t n, float* dst);

}  // namespace fanout

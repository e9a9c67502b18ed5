#include "fanout/core/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "fanout/core/error.h"

namespace fanout {
namespace {

struct DTypeInfo {
    DType dtype;
    std::string_view name;
    size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kF32, "F32", 4}, {DType::kBF16, "BF16", 2}, {DType::kF16, "F16", 2}, {DType::kFP8E4M3, "F8_E4M3", 1},
    {DType::kI64, "I64", 8}, {DType::kI32, "I32", 4},   {DType::kI16, "I16", 2}, {DType::kI8, "I8", 1},
    {DType::kU8, "U8", 1},   {DType::kBool, "BOOL", 1}, {DType::kF64, "F64", 8},
};

const DTypeInfo& info(DType dtype) {
    for (const auto& d : kDTypes)
        if (d.dtype == dtype) return d;
    FANOUT_FAIL("unknown dtype enum value {}", static_cast<int>(dtype));
}

}  // namespace

size_t dtype_size(DType dtype) { return info(dtype).size; }
std::string_view dtype_name(DType dtype) { return info(dtype).name; }

bool dtype_from_name(std::string_view name, DType* out) {
    for (const auto& d : kDTypes) {
        if (d.name == name) {
            *out = d.dtype;
            return true;
        }
    }
    return false;
}

DType kv_dtype_from_name(std::string_view name) {
    if (name == "f32") return DType::kF32;
    if (name == "bf16") return DType::kBF16;
    if (name == "fp8") return DType::kFP8E4M3;
    FANOUT_FAIL("unknown KV cache dtype '{}'; choose f32, bf16 or fp8", name);
}

std::string_view kv_dtype_name(DType dtype) {
    switch (dtype) {
        case DType::kF32:
            return "f32";
        case DType::kBF16:
            return "bf16";
        case DType::kFP8E4M3:
            return "fp8";
        default:
            return "?";
    }
}

float f16_to_f32(uint16_t h) {
    const uint32_t sign = (h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
    if (exp == 0) {
        const float mag = std::ldexp(static_cast<float>(man), -24);
        return sign ? -mag : mag;
    }
    if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
    return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t f32_to_f16(float f) {
    const uint32_t bits = std::bit_cast<uint32_t>(f);
    const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
    const float a = std::fabs(f);
    if (std::isnan(f)) return sign | 0x7e00;
    if (a >= 65520.0f) return sign | 0x7c00;  // rounds to infinity
    if (a < 6.103515625e-05f) {               // subnormal: units of 2^-24
        return sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f));
    }
    uint32_t abits = std::bit_cast<uint32_t>(a);
    abits += 0xfffu + ((abits >> 13) & 1u);
    return sign | static_cast<uint16_t>((((abits >> 23) - 112) << 10) | ((abits >> 13) & 0x3ffu));
}

uint8_t f32_to_fp8e4m3(float f) {
    const uint8_t sign = static_cast<uint8_t>((std::bit_cast<uint32_t>(f) >> 24) & 0x80u);
    const float a = std::fabs(f);
    if (std::isnan(f)) return sign | 0x7f;
    if (a >= kFp8E4M3Max) return sign | 0x7e;  // saturate: 0x7e is 448
    if (a < 0.015625f) {                       // below 2^-6: subnormal, units of 2^-9
        return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
    }
    uint32_t abits = std::bit_cast<uint32_t>(a);
    abits += 0x7ffffu + ((abits >> 20) & 1u);  // round the mantissa to 3 bits, ties to even
    const uint32_t exp = (abits >> 23) - 127 + 7;
    const uint32_t man = (abits >> 20) & 7u;
    return sign | static_cast<uint8_t>((exp << 3) | man);
}

float load_as_f32(const void* data, DType dtype, size_t i) {
    switch (dtype) {
        case DType::kF32:
            return static_cast<const float*>(data)[i];
        case DType::kBF16:
            return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
        case DType::kF16:
            return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
        case DType::kFP8E4M3:
            return fp8e4m3_to_f32(static_cast<const uint8_t*>(data)[i]);
        case DType::kF64:
            return static_cast<float>(static_cast<const double*>(data)[i]);
        default:
            FANOUT_FAIL("load_as_f32: dtype {} is not a floating type", dtype_name(dtype));
    }
}

void convert_to_f32(const void* src, DType dtype, size_t n, float* dst) {
    switch (dtype) {
        case DType::kF32:
            std::memcpy(dst, src, n * sizeof(float));
            return;
        case DType::kBF16: {
            const auto* s = static_cast<const uint16_t*>(src);
            for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
            return;
        }
        case DType::kFP8E4M3: {
            // Arithmetic decode, which vectorizes: the 7 exponent+mantissa bits placed at the top of
            // an f32 (exponent field = e4m3 exponent) and rescaled by 2^(127-7); f32 subnormal
            // arithmetic makes e4m3 subnormals come out right. 0x7f/0xff (NaN) are patched in.
            const auto* s = static_cast<const uint8_t*>(src);
            for (size_t i = 0; i < n; ++i) {  // written with memcpy so GCC vectorizes it
                const uint32_t v = s[i];
                const uint32_t mag_bits = (v & 0x7fu) << 20;
                float mag;
                std::memcpy(&mag, &mag_bits, 4);
                mag *= 0x1p120f;
                uint32_t bits;
                std::memcpy(&bits, &mag, 4);
                bits |= (v & 0x80u) << 24;
                bits = (v & 0x7fu) == 0x7fu ? (bits | 0x7fc00000u) : bits;
                std::memcpy(dst + i, &bits, 4);
            }
            return;
        }
        default:
            for (size_t i = 0; i < n; ++i) dst[i] = load_as_f32(src, dtype, i);
    }
}

}  // namespace fanout

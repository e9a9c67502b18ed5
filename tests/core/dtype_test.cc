// Tests of the scalar conversions in fanout/core/dtype.h: exact values at the edges of bf16, f16
// and fp8 e4m3fn, round-to-nearest-even at every tie, saturation, NaN, and exhaustive round trips.
//
// Where a whole format fits in a loop (256 fp8 codes, 65536 bf16/f16 codes) every code is checked;
// rounding of arbitrary floats is checked against a brute-force nearest-value search.
#include "fanout/core/dtype.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "fanout/core/error.h"

namespace fanout {
namespace {

using ::testing::HasSubstr;

constexpr float kInf = std::numeric_limits<float>::infinity();

bool is_fp8_nan(uint8_t code) { return (code & 0x7f) == 0x7f; }

// The representable fp8 value nearest to f, ties to the even code; saturates past ±448.
uint8_t reference_f32_to_fp8(float f) {
    const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
    const double a = std::fabs(static_cast<double>(f));
    int best = 0;
    double best_err = INFINITY;
    for (int code = 0; code <= 0x7e; ++code) {
        const double err = std::fabs(static_cast<double>(fp8e4m3_to_f32(static_cast<uint8_t>(code))) - a);
        if (err < best_err || (err == best_err && code % 2 == 0)) {
            best = code;
            best_err = err;
        }
    }
    return sign | static_cast<uint8_t>(best);
}

// ---------------------------------------------------------------------------------------------
// dtype names and sizes

TEST(DTypeTest, NamesAndSizesRoundTrip) {
    struct Case {
        DType dtype;
        const char* name;
        size_t size;
    };
    const Case cases[] = {
        {DType::kF32, "F32", 4}, {DType::kBF16, "BF16", 2}, {DType::kF16, "F16", 2}, {DType::kFP8E4M3, "F8_E4M3", 1},
        {DType::kI64, "I64", 8}, {DType::kI32, "I32", 4},   {DType::kI16, "I16", 2}, {DType::kI8, "I8", 1},
        {DType::kU8, "U8", 1},   {DType::kBool, "BOOL", 1}, {DType::kF64, "F64", 8},
    };
    for (const Case& c : cases) {
        EXPECT_EQ(dtype_name(c.dtype), c.name);
        EXPECT_EQ(dtype_size(c.dtype), c.size) << c.name;
        DType parsed = DType::kF32;
        ASSERT_TRUE(dtype_from_name(c.name, &parsed)) << c.name;
        EXPECT_EQ(parsed, c.dtype) << c.name;
    }
}

TEST(DTypeTest, UnknownNamesAreRejected) {
    DType d = DType::kBF16;
    for (const char* name : {"", "f32", "F8_E5M2", "FP8", "U16", "BF16 ", "float32"}) {
        EXPECT_FALSE(dtype_from_name(name, &d)) << "'" << name << "'";
        EXPECT_EQ(d, DType::kBF16) << "output must be untouched on failure";
    }
}

TEST(DTypeTest, InvalidEnumValueThrows) { EXPECT_THROW(dtype_size(static_cast<DType>(99)), Error); }

// ---------------------------------------------------------------------------------------------
// fp8 e4m3fn

TEST(Fp8E4M3Test, DecodesKnownCodes) {
    EXPECT_EQ(fp8e4m3_to_f32(0x00), 0.0f);
    EXPECT_TRUE(std::signbit(fp8e4m3_to_f32(0x80)));
    EXPECT_EQ(fp8e4m3_to_f32(0x80), 0.0f);
    EXPECT_EQ(fp8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));      // smallest subnormal
    EXPECT_EQ(fp8e4m3_to_f32(0x07), 7 * std::ldexp(1.0f, -9));  // largest subnormal
    EXPECT_EQ(fp8e4m3_to_f32(0x08), std::ldexp(1.0f, -6));      // smallest normal
    EXPECT_EQ(fp8e4m3_to_f32(0x38), 1.0f);
    EXPECT_EQ(fp8e4m3_to_f32(0x39), 1.125f);
    EXPECT_EQ(fp8e4m3_to_f32(0x40), 2.0f);
    EXPECT_EQ(fp8e4m3_to_f32(0x77), 240.0f);
    EXPECT_EQ(fp8e4m3_to_f32(0x78), 256.0f);
    EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.0f);
    EXPECT_EQ(fp8e4m3_to_f32(0xfe), -448.0f);
    EXPECT_EQ(fp8e4m3_to_f32(0xb8), -1.0f);
    EXPECT_TRUE(std::isnan(fp8e4m3_to_f32(0x7f)));
    EXPECT_TRUE(std::isnan(fp8e4m3_to_f32(0xff)));
    EXPECT_EQ(kFp8E4M3Max, 448.0f);
}

TEST(Fp8E4M3Test, OnlyTwoCodesAreNaNAndNoneInfinite) {
    int num_nan = 0;
    for (int code = 0; code < 256; ++code) {
        const float v = fp8e4m3_to_f32(static_cast<uint8_t>(code));
        EXPECT_FALSE(std::isinf(v)) << "code " << code;
        if (std::isnan(v))
            ++num_nan;
        else
            EXPECT_LE(std::fabs(v), 448.0f) << "code " << code;
    }
    EXPECT_EQ(num_nan, 2);
}

TEST(Fp8E4M3Test, DecodeIsMonotonicOverPositiveCodes) {
    for (int code = 0; code < 0x7e; ++code)
        EXPECT_LT(fp8e4m3_to_f32(static_cast<uint8_t>(code)), fp8e4m3_to_f32(static_cast<uint8_t>(code + 1)))
            << "code " << code;
}

TEST(Fp8E4M3Test, EveryNonNaNCodeRoundTrips) {
    for (int code = 0; code < 256; ++code) {
        if (is_fp8_nan(static_cast<uint8_t>(code))) continue;
        const float v = fp8e4m3_to_f32(static_cast<uint8_t>(code));
        EXPECT_EQ(f32_to_fp8e4m3(v), code) << "value " << v;
    }
}

TEST(Fp8E4M3Test, TiesRoundToEvenAndNeighboursRoundToNearest) {
    // Between each pair of adjacent finite codes: the exact midpoint goes to the even code, the
    // floats just either side of it to the nearer code. Checked for both signs.
    for (int code = 0; code < 0x7e; ++code) {
        const float lo = fp8e4m3_to_f32(static_cast<uint8_t>(code));
        const float hi = fp8e4m3_to_f32(static_cast<uint8_t>(code + 1));
        const float mid = (lo + hi) / 2;  // exact: both have few mantissa bits
        const int even = code % 2 == 0 ? code : code + 1;
        for (const uint8_t sign : {uint8_t{0x00}, uint8_t{0x80}}) {
            const float s = sign ? -1.0f : 1.0f;
            EXPECT_EQ(f32_to_fp8e4m3(s * mid), sign | even) << "midpoint " << s * mid;
            EXPECT_EQ(f32_to_fp8e4m3(s * std::nextafter(mid, 0.0f)), sign | code) << "below " << s * mid;
            EXPECT_EQ(f32_to_fp8e4m3(s * std::nextafter(mid, kInf)), sign | (code + 1)) << "above " << s * mid;
        }
    }
}

TEST(Fp8E4M3Test, SmallestSubnormalAndUnderflow) {
    const float tiny = std::ldexp(1.0f, -9);
    EXPECT_EQ(f32_to_fp8e4m3(tiny), 0x01);
    EXPECT_EQ(f32_to_fp8e4m3(-tiny), 0x81);
    EXPECT_EQ(f32_to_fp8e4m3(tiny / 2), 0x00);  // tie between 0 and 2^-9: even is 0
    EXPECT_EQ(f32_to_fp8e4m3(std::nextafter(tiny / 2, 1.0f)), 0x01);
    EXPECT_EQ(f32_to_fp8e4m3(1.5f * tiny), 0x02);  // tie between codes 1 and 2: even is 2
    EXPECT_EQ(f32_to_fp8e4m3(2.5f * tiny), 0x02);  // tie between codes 2 and 3: even is 2
    EXPECT_EQ(f32_to_fp8e4m3(1e-30f), 0x00);
    EXPECT_EQ(f32_to_fp8e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
    EXPECT_EQ(f32_to_fp8e4m3(-1e-30f), 0x80);  // keeps the sign: -0
    EXPECT_EQ(f32_to_fp8e4m3(-0.0f), 0x80);
}

TEST(Fp8E4M3Test, SaturatesPastMax) {
    for (float v : {448.0f, 448.5f, 463.9f, 464.0f, 479.0f, 480.0f, 1000.0f, 65504.0f, 1e30f,
                    std::numeric_limits<float>::max(), kInf}) {
        EXPECT_EQ(f32_to_fp8e4m3(v), 0x7e) << v;
        EXPECT_EQ(f32_to_fp8e4m3(-v), 0xfe) << -v;
    }
    EXPECT_EQ(f32_to_fp8e4m3(447.9f), 0x7e);  // rounds up to 448
    EXPECT_EQ(f32_to_fp8e4m3(432.0f), 0x7e);  // tie between 416 (0x7d) and 448 (0x7e): even is 0x7e
    EXPECT_EQ(f32_to_fp8e4m3(431.9f), 0x7d);
    EXPECT_EQ(f32_to_fp8e4m3(400.0f), 0x7c);  // tie between 384 (0x7c) and 416 (0x7d): even is 0x7c
}

TEST(Fp8E4M3Test, NaNStaysNaN) {
    for (float nan : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::signaling_NaN(), std::bit_cast<float>(0x7fc00001u)}) {
        const uint8_t code = f32_to_fp8e4m3(nan);
        EXPECT_TRUE(is_fp8_nan(code)) << "code " << int(code);
        EXPECT_TRUE(std::isnan(fp8e4m3_to_f32(code)));
    }
}

TEST(Fp8E4M3Test, MatchesBruteForceNearestOnRandomFloats) {
    // Log-uniform magnitudes over the whole fp8 range and beyond, both signs.
    std::mt19937_64 rng(1234);
    std::uniform_real_distribution<float> exponent(-14.0f, 10.0f);
    std::bernoulli_distribution negative(0.5);
    for (int i = 0; i < 20000; ++i) {
        const float v = (negative(rng) ? -1.0f : 1.0f) * std::exp2(exponent(rng));
        ASSERT_EQ(f32_to_fp8e4m3(v), reference_f32_to_fp8(v)) << "value " << v;
    }
}

// ---------------------------------------------------------------------------------------------
// bf16

TEST(BF16Test, KnownValues) {
    EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
    EXPECT_EQ(f32_to_bf16(-2.0f), 0xc000);
    EXPECT_EQ(f32_to_bf16(0.0f), 0x0000);
    EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
    EXPECT_EQ(f32_to_bf16(kInf), 0x7f80);
    EXPECT_EQ(f32_to_bf16(-kInf), 0xff80);
    EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
    EXPECT_EQ(bf16_to_f32(0x7f7f), std::bit_cast<float>(0x7f7f0000u));  // largest finite
    EXPECT_EQ(bf16_to_f32(0x0001), std::bit_cast<float>(0x00010000u));  // smallest subnormal
}

TEST(BF16Test, TiesRoundToEven) {
    const float ulp = std::ldexp(1.0f, -7);              // bf16 spacing in [1, 2)
    EXPECT_EQ(f32_to_bf16(1.0f + ulp / 2), 0x3f80);      // 1.0 (even) vs 1 + ulp: stays 1.0
    EXPECT_EQ(f32_to_bf16(1.0f + 3 * ulp / 2), 0x3f82);  // 1 + ulp (odd) vs 1 + 2ulp (even): up
    EXPECT_EQ(f32_to_bf16(std::nextafter(1.0f + ulp / 2, 2.0f)), 0x3f81);
    EXPECT_EQ(f32_to_bf16(std::nextafter(1.0f + 3 * ulp / 2, 0.0f)), 0x3f81);
    EXPECT_EQ(f32_to_bf16(-(1.0f + ulp / 2)), 0xbf80);
    // Generic: every f32 whose low 16 bits are exactly 0x8000 is a tie.
    std::mt19937 rng(7);
    for (int i = 0; i < 10000; ++i) {
        const uint32_t hi = rng() & 0x7f7f;  // finite
        const float tie = std::bit_cast<float>((hi << 16) | 0x8000u);
        const uint16_t expected = (hi & 1) ? static_cast<uint16_t>(hi + 1) : static_cast<uint16_t>(hi);
        ASSERT_EQ(f32_to_bf16(tie), expected) << std::hex << "hi=0x" << hi;
    }
}

TEST(BF16Test, OverflowRoundsToInfinity) {
    EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
    EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::max()), 0xff80);
}

TEST(BF16Test, EveryNonNaNCodeRoundTripsAndNaNStaysNaN) {
    for (uint32_t code = 0; code < 0x10000; ++code) {
        const float v = bf16_to_f32(static_cast<uint16_t>(code));
        if (std::isnan(v)) {
            EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(v)))) << std::hex << code;
            continue;
        }
        ASSERT_EQ(f32_to_bf16(v), code) << std::hex << code;
    }
    // A NaN whose payload lives only in the low 16 bits must not become infinity.
    EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::bit_cast<float>(0x7f800001u)))));
    EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::bit_cast<float>(0xff800001u)))));
    EXPECT_EQ(round_to_bf16(1.0f + std::ldexp(1.0f, -9)), 1.0f);
}

// ---------------------------------------------------------------------------------------------
// f16

TEST(F16Test, KnownValues) {
    EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
    EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
    EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);               // largest finite
    EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
    EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
    EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
    EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
    EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
    EXPECT_EQ(f16_to_f32(0x7c00), kInf);
    EXPECT_EQ(f16_to_f32(0xfc00), -kInf);
    EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
}

TEST(F16Test, RoundingTiesAndOverflow) {
    const float ulp = std::ldexp(1.0f, -10);
    EXPECT_EQ(f32_to_f16(1.0f + ulp / 2), 0x3c00);
    EXPECT_EQ(f32_to_f16(1.0f + 3 * ulp / 2), 0x3c02);
    EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);                        // tie between 0 and 2^-24
    EXPECT_EQ(f32_to_f16(3 * std::ldexp(1.0f, -25)), 0x0002);                    // tie between 1 and 2 units
    EXPECT_EQ(f32_to_f16(std::nextafter(std::ldexp(1.0f, -14), 0.0f)), 0x0400);  // rounds up to normal
    EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
    EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // tie between 65504 and 65536: even is infinity
    EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
    EXPECT_EQ(f32_to_f16(-kInf), 0xfc00);
}

TEST(F16Test, EveryNonNaNCodeRoundTripsAndNaNStaysNaN) {
    for (uint32_t code = 0; code < 0x10000; ++code) {
        const float v = f16_to_f32(static_cast<uint16_t>(code));
        if (std::isnan(v)) {
            EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(v)))) << std::hex << code;
            continue;
        }
        ASSERT_EQ(f32_to_f16(v), code) << std::hex << code;
    }
}

// ---------------------------------------------------------------------------------------------
// Buffer conversions

TEST(ConvertTest, LoadAndConvertEveryFloatingDType) {
    const std::vector<float> values = {1.5f, -2.0f, 0.25f, 448.0f, -0.015625f};
    std::vector<float> f32 = values;
    std::vector<double> f64(values.begin(), values.end());
    std::vector<uint16_t> bf16, f16;
    std::vector<uint8_t> fp8;
    for (float v : values) {
        bf16.push_back(f32_to_bf16(v));
        f16.push_back(f32_to_f16(v));
        fp8.push_back(f32_to_fp8e4m3(v));
    }
    const struct {
        DType dtype;
        const void* data;
    } buffers[] = {{DType::kF32, f32.data()},
                   {DType::kF64, f64.data()},
                   {DType::kBF16, bf16.data()},
                   {DType::kF16, f16.data()},
                   {DType::kFP8E4M3, fp8.data()}};
    for (const auto& b : buffers) {
        std::vector<float> out(values.size(), std::nanf(""));
        convert_to_f32(b.data, b.dtype, values.size(), out.data());
        for (size_t i = 0; i < values.size(); ++i) {
            EXPECT_EQ(out[i], values[i]) << dtype_name(b.dtype) << " [" << i << "]";
            EXPECT_EQ(load_as_f32(b.data, b.dtype, i), values[i]) << dtype_name(b.dtype) << " [" << i << "]";
        }
    }
}

TEST(ConvertTest, IntegerDTypeIsAnError) {
    const int32_t x[2] = {1, 2};
    try {
        load_as_f32(x, DType::kI32, 0);
        FAIL() << "expected fanout::Error";
    } catch (const Error& e) {
        EXPECT_THAT(e.what(), HasSubstr("I32"));
    }
    float out[2];
    EXPECT_THROW(convert_to_f32(x, DType::kI32, 2, out), Error);
    EXPECT_NO_THROW(convert_to_f32(x, DType::kI32, 0, out));  // nothing to convert
}

}  // namespace
}  // namespace fanout

// MLA: the MHA form and the absorbed form against a dense reference, over a paged cache with
// scattered blocks, several requests, chunked queries and both cache dtypes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "fanout/ops/mla_attention.h"
#include "test_util.h"

namespace fanout::ops {
namespace {

struct Shapes {
    int64_t H = 3, nope = 10, rope = 6, v = 7, kv_lora = 20, block = 4, num_blocks = 16;
    std::vector<int32_t> kv_len = {9, 1, 6};  // tokens in cache per request
    std::vector<int32_t> q_len = {3, 1, 6};   // this step's queries (the last q_len positions)
};

TEST(MlaAttention, BothFormsMatchDenseReference) {
    for (DType cache_dtype : {DType::kF32, DType::kBF16, DType::kFP8E4M3}) {
        Shapes c;
        const int64_t D = c.kv_lora + c.rope, R = 3;
        const MlaFp8Layout fp8{c.kv_lora, c.rope};  // one partial group of 20 values
        // Block tables: scattered, non-contiguous blocks.
        const int64_t max_blocks = 3;
        std::vector<int32_t> table = {7, 2, 11, /**/ 5, -1, -1, /**/ 0, 14, -1};
        std::vector<int32_t> query_start = {0}, positions;
        for (int64_t r = 0; r < R; ++r) {
            query_start.push_back(query_start.back() + c.q_len[r]);
            for (int32_t p = c.kv_len[r] - c.q_len[r]; p < c.kv_len[r]; ++p) positions.push_back(p);
        }
        const int64_t T = query_start.back();
        LatentCache cache{nullptr, cache_dtype, c.num_blocks, c.block, D, c.kv_lora};
        std::vector<uint8_t> storage(size_t(c.num_blocks * c.block * cache.entry_bytes()));
        cache.data = storage.data();
        // Fill each request's entries through kv_append.
        std::vector<std::vector<float>> entries(R);
        for (int64_t r = 0; r < R; ++r) {
            Tensor e = fanout::testing::random_tensor({c.kv_len[r], D}, 100 + r);
            std::vector<int32_t> slots;
            for (int32_t p = 0; p < c.kv_len[r]; ++p)
                slots.push_back(table[r * max_blocks + p / c.block] * c.block + p % c.block);
            kv_append(cache, e, slots.data(), Stream{});
            entries[r].resize(size_t(c.kv_len[r] * D));
            for (int64_t i = 0; i < c.kv_len[r] * D; ++i)
                entries[r][i] =
                    cache_dtype == DType::kBF16 ? round_to_bf16(e.data_as<float>()[i]) : e.data_as<float>()[i];
            if (cache_dtype != DType::kFP8E4M3) continue;
            // The FP8 cache holds quantize_latent_entry_fp8's bytes; attention sees their values.
            std::vector<uint8_t> q(size_t(fp8.entry_bytes()));
            for (int32_t p = 0; p < c.kv_len[r]; ++p) {
                quantize_latent_entry_fp8(e.data_as<float>() + p * D, fp8, q.data());
                ASSERT_EQ(0, std::memcmp(q.data(), storage.data() + size_t(slots[p]) * q.size(), q.size()))
                    << "request " << r << " position " << p;
                dequantize_latent_entry_fp8(q.data(), fp8, entries[r].data() + p * D);
            }
        }
        Tensor q = fanout::testing::random_tensor({T, c.H, c.nope + c.rope}, 200);
        const auto w = fanout::testing::random_floats(size_t(c.H * (c.nope + c.v) * c.kv_lora), 201, 0.3f);
        LinearWeight kv_b{DType::kF32, w.data(), c.H * (c.nope + c.v), c.kv_lora, nullptr};
        AttentionMetadata meta{R, query_start.data(), c.kv_len.data(), table.data(), max_blocks, positions.data()};
        const float scale = 0.37f;

        // Dense reference in double.
        std::vector<float> ref(size_t(T * c.H * c.v));
        for (int64_t r = 0; r < R; ++r)
            for (int64_t t = query_start[r]; t < query_start[r + 1]; ++t)
                for (int64_t h = 0; h < c.H; ++h) {
                    const float* qh = q.data_as<float>() + (t * c.H + h) * (c.nope + c.rope);
                    const int64_t S = positions[t] + 1;
                    std::vector<double> s(S), kn(c.nope), vv(c.v);
                    double mx = -1e300;
                    for (int64_t j = 0; j < S; ++j) {
                        const float* e = entries[r].data() + j * D;
                        double acc = 0;
                        for (int64_t d = 0; d < c.nope; ++d) {
                            double k = 0;
                            for (int64_t l = 0; l < c.kv_lora; ++l)
                                k += double(w[(h * (c.nope + c.v) + d) * c.kv_lora + l]) * e[l];
                            acc += qh[d] * k;
                        }
                        for (int64_t d = 0; d < c.rope; ++d) acc += double(qh[c.nope + d]) * e[c.kv_lora + d];
                        s[j] = acc * scale;
                        mx = std::max(mx, s[j]);
                    }
                    double sum = 0;
                    for (auto& x : s) sum += (x = std::exp(x - mx));
                    for (int64_t d = 0; d < c.v; ++d) {
                        double o = 0;
                        for (int64_t j = 0; j < S; ++j) {
                            double val = 0;
                            for (int64_t l = 0; l < c.kv_lora; ++l)
                                val += double(w[(h * (c.nope + c.v) + c.nope + d) * c.kv_lora + l]) *
                                       entries[r][j * D + l];
                            o += s[j] / sum * val;
                        }
                        ref[(t * c.H + h) * c.v + d] = float(o);
                    }
                }
        Tensor mha = Tensor::zeros({T, c.H, c.v}, DType::kF32), absorbed = Tensor::zeros({T, c.H, c.v}, DType::kF32);
        fanout::testing::poison(mha);
        fanout::testing::poison(absorbed);
        ThreadPool pool(2);
        mla_attention_mha(q, kv_b, Fp8Mode::kDequant, cache, meta, c.kv_lora, c.nope, c.v, scale, mha, Stream{&pool});
        mla_attention_absorbed(q, kv_b, cache, meta, c.kv_lora, c.nope, c.v, scale, absorbed, Stream{&pool});
        EXPECT_LT(fanout::testing::rel_error(mha.data_as<float>(), ref.data(), ref.size()), 1e-5);
        EXPECT_LT(fanout::testing::rel_error(absorbed.data_as<float>(), ref.data(), ref.size()), 1e-5);
    }
}

// The FP8 cache entry: each 128-value group of the latent (the last one shorter when kv_lora is not
// a multiple of 128) comes back within half an e4m3 step of its group's scale (the group's largest
// magnitude at ±448 exactly), a group of zeros stays zeros with scale 1, and the rope part is the
// bf16 rounding of its values — at V3's widths (656 bytes), with a partial last group, and with
// one partial group.
TEST(MlaAttention, Fp8CacheEntryRoundTrips) {
    EXPECT_EQ(kMlaFp8V3.entry_bytes(), 656);
    EXPECT_EQ((MlaFp8Layout{200, 6}.entry_bytes()), 200 + 2 * 4 + 12);
    EXPECT_EQ(latent_entry_bytes(512, 64, DType::kBF16), 1152);
    EXPECT_EQ(latent_entry_bytes(510, 64, DType::kFP8E4M3), 0) << "kv_lora must be a multiple of 4";
    EXPECT_EQ(latent_entry_bytes(512, 63, DType::kFP8E4M3), 0) << "the rope width must be even";
    for (const MlaFp8Layout L : {kMlaFp8V3, MlaFp8Layout{200, 6}, MlaFp8Layout{20, 6}}) {
        std::mt19937 rng(7);
        std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
        std::vector<float> entry(size_t(L.kv_lora + L.rope)), back(entry.size());
        for (auto& v : entry) v = dist(rng);
        const auto group = [&](int64_t g) { return std::pair{128 * g, std::min<int64_t>(L.kv_lora, 128 * (g + 1))}; };
        if (L.num_scales() >= 3) {
            for (int64_t k = 0; k < 128; ++k) entry[k] *= 1e-6f;              // a tiny group
            for (int64_t k = 256; k < group(2).second; ++k) entry[k] = 0.0f;  // zeros
        }
        for (int64_t k = group(L.num_scales() - 1).first; k < L.kv_lora; ++k) entry[k] *= 5000.0f;  // a large one
        std::vector<uint8_t> q(size_t(L.entry_bytes()));
        quantize_latent_entry_fp8(entry.data(), L, q.data());
        dequantize_latent_entry_fp8(q.data(), L, back.data());
        for (int64_t g = 0; g < L.num_scales(); ++g) {
            const auto [k0, k1] = group(g);
            float scale, amax = 0.0f;
            std::memcpy(&scale, q.data() + L.scale_offset() + 4 * g, 4);
            for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(entry[k]));
            if (amax == 0.0f) {
                EXPECT_EQ(scale, 1.0f) << "group " << g;
            } else {  // amax / 448 rounded up to a bf16 value
                EXPECT_EQ(scale, round_to_bf16(scale)) << "group " << g;
                EXPECT_GE(scale, amax / 448.0f) << "group " << g;
                EXPECT_LT(scale, amax / 448.0f * (1.0f + 1.0f / 128)) << "group " << g;
            }
            for (int64_t k = k0; k < k1; ++k) {
                // e4m3 keeps 3 mantissa bits: half a step is 2^-4 of the value, or 2^-10 of the
                // scale in the subnormal range.
                const float tol = std::max(std::fabs(entry[k]) / 16.0f, scale / 1024.0f) * 1.0001f;
                EXPECT_LE(std::fabs(back[k] - entry[k]), tol) << "value " << k << " of kv_lora " << L.kv_lora;
            }
        }
        for (int64_t d = 0; d < L.rope; ++d)
            EXPECT_EQ(back[L.kv_lora + d], round_to_bf16(entry[L.kv_lora + d])) << "rope " << d;
    }
    // A cache whose FP8 widths the entry cannot hold is refused, naming them.
    LatentCache bad{nullptr, DType::kFP8E4M3, 1, 4, 27, 21};
    EXPECT_NE(fanout::testing::error_of([&] { (void)bad.entry_bytes(); }).find("kv_lora 21 of entry 27"),
              std::string::npos);
}

TEST(MlaAttention, RejectsInconsistentMetadata) {
    std::vector<float> storage(4 * 4 * 8);
    LatentCache cache{storage.data(), DType::kF32, 4, 4, 8};
    std::vector<float> w(2 * 4 * 6);
    LinearWeight kv_b{DType::kF32, w.data(), 2 * 4, 6, nullptr};
    Tensor q = Tensor::zeros({2, 2, 4}, DType::kF32), out = Tensor::zeros({2, 2, 2}, DType::kF32);
    std::vector<int32_t> qs = {0, 2}, table = {0, 9}, pos = {0, 5};
    std::vector<int32_t> kv_len = {2};
    AttentionMetadata bad_pos{1, qs.data(), kv_len.data(), table.data(), 2, pos.data()};
    EXPECT_THROW(mla_attention_absorbed(q, kv_b, cache, bad_pos, 6, 2, 2, 1.0f, out, Stream{}), Error);
    kv_len = {6};
    AttentionMetadata bad_block{1, qs.data(), kv_len.data(), table.data(), 2, pos.data()};
    EXPECT_THROW(mla_attention_mha(q, kv_b, Fp8Mode::kDequant, cache, bad_block, 6, 2, 2, 1.0f, out, Stream{}), Error);
}

}  // namespace
}  // namespace fanout::ops

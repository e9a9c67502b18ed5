// The GPU model runner's small kernels (model_glue_cuda.h), the device sampler (sampling_cuda.h),
// the bf16 permute and the f32-output BF16 GEMM, each against its CPU counterpart on random
// odd-shaped input with poisoned outputs. Labelled `gpu`; skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "cuda_test_util.h"
#include "fanout/core/cuda_check.h"
#include "fanout/core/cuda_graph.h"
#include "fanout/ops/activation.h"
#include "fanout/ops/device_context.h"
#include "fanout/ops/fp8_quant.h"
#include "fanout/ops/gemm.h"
#include "fanout/ops/mla_attention.h"
#include "fanout/ops/model_glue_cuda.h"
#include "fanout/ops/moe_permute.h"
#include "fanout/ops/rms_norm.h"
#include "fanout/ops/rope.h"
#include "fanout/ops/sampling.h"
#include "fanout/ops/sampling_cuda.h"
#include "test_util.h"

namespace fanout::ops {
namespace {

template <typename T>
using Dev = fanout::testing::DeviceBuffer<T>;

// Random values rounded to bf16: the bf16 bits, and the same values as f32.
struct Bf16Data {
    std::vector<uint16_t> bits;
    std::vector<float> f32;
};
Bf16Data random_bf16(size_t n, uint32_t seed, float scale = 1.0f) {
    const auto f = fanout::testing::random_floats(n, seed, scale);
    Bf16Data d;
    for (float v : f) {
        d.bits.push_back(f32_to_bf16(v));
        d.f32.push_back(bf16_to_f32(d.bits.back()));
    }
    return d;
}

std::vector<float> to_f32(const std::vector<uint16_t>& b) {
    std::vector<float> f;
    for (uint16_t v : b) f.push_back(bf16_to_f32(v));
    return f;
}

double rel(const std::vector<float>& got, const std::vector<float>& ref) {
    return fanout::testing::rel_error(got.data(), ref.data(), ref.size());
}

RopeTable yarn_table(int64_t dim) {
    RopeParams p;
    p.dim = dim;
    p.yarn = true;
    p.factor = 40;
    p.attention_factor = 1.3;
    return make_rope_table(p);
}

// A failed CUDA call is reported once, by the call that failed: FANOUT_CUDA_CHECK clears the
// runtime's last error before it throws, so the next launch's check (cudaGetLastError) does not
// report it again — before, a recovered out-of-memory failed the next step's first launch too.
// The same after a capture whose body failed.
TEST(CudaCheck, AFailureIsReportedOnceByTheCallThatFailed) {
    REQUIRE_GPU();
    void* p = nullptr;
    EXPECT_THROW(FANOUT_CUDA_CHECK(cudaMalloc(&p, size_t{1} << 52)), Error);  // 4 PiB: out of memory
    EXPECT_NO_THROW(FANOUT_CUDA_CHECK_LAUNCH("the next launch"));
    Dev<uint16_t> a(64);
    cudaStream_t s = nullptr;
    FANOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    EXPECT_THROW(capture_graph(s,
                               [&] {
                                   launch_random_bf16(a.ptr, 64, 1.0f, 1, s);
                                   FANOUT_CUDA_CHECK(cudaStreamSynchronize(s));  // illegal in a capture: ends it
                               }),
                 Error);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    const cudaGraphExec_t g = capture_graph(s, [&] { launch_random_bf16(a.ptr, 64, 1.0f, 1, s); });
    FANOUT_CUDA_CHECK(cudaGraphLaunch(g, s));
    FANOUT_CUDA_CHECK(cudaStreamSynchronize(s));
    cudaGraphExecDestroy(g);
    cudaStreamDestroy(s);
}

TEST(GlueCuda, EmbedGathersRows) {
    REQUIRE_GPU();
    const int V = 37, D = 129, T = 11;
    auto table = random_bf16(size_t(V) * D, 1);
    std::vector<int32_t> tok;
    for (int t = 0; t < T; ++t) tok.push_back((t * 13 + 5) % V);
    Dev<uint16_t> dt(table.bits), out(size_t(T) * D);
    Dev<int32_t> dtok(tok);
    out.poison();
    launch_embed_bf16(dt.ptr, dtok.ptr, T, D, out.ptr, nullptr);
    const auto got = out.download();
    for (int t = 0; t < T; ++t)
        for (int d = 0; d < D; ++d) ASSERT_EQ(got[t * D + d], table.bits[tok[t] * D + d]) << t << "," << d;
}

// q rope: each head's rope part rotated like rope_apply into q_pe, and in place (the MHA form's
// launch, nope parts untouched) — one block of heads and several with a partial last one.
TEST(GlueCuda, QRopeMatchesRopeApply) {
    REQUIRE_GPU();
    for (const int H : {5, 40}) {
        const int T = 9, nope = 24, rope = 16, width = nope + rope;
        auto q = random_bf16(size_t(T) * H * width, 2);
        std::vector<int32_t> pos;
        for (int t = 0; t < T; ++t) pos.push_back(t * 977 + 3);
        const RopeTable tab = yarn_table(rope);
        Tensor ref = Tensor::zeros({T, H, width}, DType::kF32);
        std::copy(q.f32.begin(), q.f32.end(), ref.data_as<float>());
        rope_apply(ref, nope, pos.data(), tab, Stream{});
        Dev<uint16_t> dq(q.bits), pe(size_t(T) * H * rope), inplace(q.bits);
        Dev<int32_t> dpos(pos);
        Dev<float> freq(tab.inv_freq);
        pe.poison();
        launch_mla_q_rope(dq.ptr, T, H, nope, dpos.ptr, {freq.ptr, rope, tab.attention_factor}, pe.ptr, nullptr);
        launch_rope_q_inplace(inplace.ptr, T, H, nope, dpos.ptr, {freq.ptr, rope, tab.attention_factor}, nullptr);
        const auto p = to_f32(pe.download());
        const auto all = inplace.download();
        std::vector<float> ref_pe, in_pe;
        for (int t = 0; t < T; ++t)
            for (int h = 0; h < H; ++h) {
                const size_t row = (size_t(t) * H + h) * width;
                for (int d = 0; d < nope; ++d) ASSERT_EQ(all[row + d], q.bits[row + d]) << "nope " << t << "," << h;
                for (int d = 0; d < rope; ++d) {
                    ref_pe.push_back(ref.data_as<float>()[row + nope + d]);
                    in_pe.push_back(bf16_to_f32(all[row + nope + d]));
                }
            }
        EXPECT_LT(rel(p, ref_pe), 1e-2) << "H " << H;
        EXPECT_EQ(p, in_pe) << "H " << H;  // the same rotation, the same bf16 rounding
    }
}

// The cache append's input and its CPU result: T rows of kv_a (a 3-value offset and 5 values of
// padding around each [latent | k_pe]), positions, scattered slots, the norm weight, and the
// entries the CPU chain (rms_norm, rope_apply) makes of them, [T, 1, C + rope] f32.
struct AppendCase {
    int T, C, rope, stride;
    Bf16Data rows;
    std::vector<float> w;
    std::vector<int32_t> pos, slots;
    RopeTable tab;
    Tensor entry;
};
AppendCase append_case(int T, int C, int rope) {
    AppendCase a{T,
                 C,
                 rope,
                 3 + C + rope + 5,
                 random_bf16(size_t(T) * (3 + C + rope + 5), 3, 3.0f),
                 fanout::testing::random_floats(C, 4),
                 {},
                 {},
                 yarn_table(rope),
                 Tensor()};
    for (int t = 0; t < T; ++t) {
        a.pos.push_back(100 + t * 31);
        a.slots.push_back(64 * (t % 3) + 5 * t + 1);
    }
    Tensor lat = Tensor::zeros({T, C}, DType::kF32);
    a.entry = Tensor::zeros({T, 1, C + rope}, DType::kF32);
    for (int t = 0; t < T; ++t)
        for (int d = 0; d < C + rope; ++d) {
            const float v = a.rows.f32[t * a.stride + 3 + d];
            if (d < C) lat.data_as<float>()[t * C + d] = v;
            a.entry.data_as<float>()[t * (C + rope) + d] = v;
        }
    Tensor wt = Tensor::zeros({C}, DType::kF32);
    std::copy(a.w.begin(), a.w.end(), wt.data_as<float>());
    rms_norm(lat, wt, 1e-6f, lat, Stream{});
    for (int t = 0; t < T; ++t)
        std::copy(lat.data_as<float>() + t * C, lat.data_as<float>() + (t + 1) * C,
                  a.entry.data_as<float>() + t * (C + rope));
    rope_apply(a.entry, C, a.pos.data(), a.tab, Stream{});
    return a;
}

// kv append: the latent normalized, k_pe rotated, written at the slots (other slots untouched).
TEST(GlueCuda, KvAppendMatchesCpuChain) {
    REQUIRE_GPU();
    const AppendCase a = append_case(7, 40, 8);
    const int T = a.T, C = a.C, rope = a.rope, stride = a.stride;
    const Bf16Data& rows = a.rows;
    const std::vector<int32_t>&pos = a.pos, &slots = a.slots;
    const std::vector<float>& w = a.w;
    const RopeTable& tab = a.tab;
    const Tensor& entry = a.entry;
    const size_t cache_n = size_t(3 * 64) * (C + rope);
    Dev<uint16_t> drows(rows.bits), cache(cache_n);
    Dev<float> dw(w), freq(tab.inv_freq);
    Dev<int32_t> dpos(pos), dslots(slots);
    cache.poison();
    launch_mla_kv_append(drows.ptr + 3, stride, T, C, dw.ptr, 1e-6f, dpos.ptr, {freq.ptr, rope, tab.attention_factor},
                         dslots.ptr, {cache.ptr, nullptr}, nullptr);
    const auto got = cache.download();
    std::vector<float> g, r;
    std::vector<bool> written(cache_n / (C + rope), false);
    for (int t = 0; t < T; ++t) {
        written[slots[t]] = true;
        for (int d = 0; d < C + rope; ++d) {
            g.push_back(bf16_to_f32(got[size_t(slots[t]) * (C + rope) + d]));
            r.push_back(entry.data_as<float>()[t * (C + rope) + d]);
        }
    }
    EXPECT_LT(rel(g, r), 1e-2);
    for (size_t s = 0; s < written.size(); ++s)
        if (!written[s]) {
            ASSERT_EQ(got[s * (C + rope)], 0xffff) << "slot " << s << " was written";
        }
}

// The FP8 append: each entry as quantize_latent_entry_fp8 makes it of the CPU chain's values — up
// to the rounding of values the two compute a hair apart: each latent value within one e4m3 step
// (and its group's scale within one bf16 step), the rope part within bf16 rounding — at the tiny
// model's widths (one group of 64), with a partial last group, and at V3's; other slots untouched.
TEST(GlueCuda, KvAppendFp8MatchesCpuQuantization) {
    REQUIRE_GPU();
    for (const auto& [C, rope] : {std::pair{64, 16}, std::pair{200, 8}, std::pair{512, 64}}) {
        const AppendCase a = append_case(7, C, rope);
        const MlaFp8Layout L{C, rope};
        const size_t E = size_t(L.entry_bytes()), slots_n = 3 * 64;
        Dev<uint16_t> drows(a.rows.bits);
        Dev<uint8_t> cache(slots_n * E);
        Dev<float> dw(a.w), freq(a.tab.inv_freq);
        Dev<int32_t> dpos(a.pos), dslots(a.slots);
        cache.poison();
        launch_mla_kv_append(drows.ptr + 3, a.stride, a.T, C, dw.ptr, 1e-6f, dpos.ptr,
                             {freq.ptr, rope, a.tab.attention_factor}, dslots.ptr, {nullptr, cache.ptr}, nullptr);
        const auto got = cache.download();
        std::vector<bool> written(slots_n, false);
        std::vector<uint8_t> want(E);
        std::vector<float> g(size_t(C + rope)), r(g.size()), all_got, all_ref;
        for (int t = 0; t < a.T; ++t) {
            written[a.slots[t]] = true;
            const float* e = a.entry.data_as<float>() + t * (C + rope);
            quantize_latent_entry_fp8(e, L, want.data());
            dequantize_latent_entry_fp8(got.data() + size_t(a.slots[t]) * E, L, g.data());
            dequantize_latent_entry_fp8(want.data(), L, r.data());
            for (int64_t k = 0; k < L.num_scales(); ++k) {
                float sg, sr;
                std::memcpy(&sg, got.data() + size_t(a.slots[t]) * E + L.scale_offset() + 4 * k, 4);
                std::memcpy(&sr, want.data() + L.scale_offset() + 4 * k, 4);
                ASSERT_LE(std::fabs(sg - sr), sr / 128.0f) << "token " << t << " group " << k << " of kv_lora " << C;
            }
            for (int d = 0; d < C; ++d)
                ASSERT_LE(std::fabs(g[d] - r[d]), std::max(std::fabs(r[d]) / 8.0f, 1e-30f) * 1.0001f)
                    << "token " << t << " latent " << d << " of kv_lora " << C;
            for (int d = C; d < C + rope; ++d)
                ASSERT_LE(std::fabs(g[d] - e[d]), std::fabs(e[d]) / 64.0f + 1e-6f) << "token " << t << " rope " << d;
            all_got.insert(all_got.end(), g.begin(), g.end());
            all_ref.insert(all_ref.end(), e, e + C + rope);
        }
        EXPECT_LT(rel(all_got, all_ref), 5e-2) << "kv_lora " << C;  // e4m3: ~2–3% rms
        for (size_t sl = 0; sl < slots_n; ++sl)
            if (!written[sl]) {
                ASSERT_EQ(got[sl * E], 0xff) << "slot " << sl << " was written";
            }
    }
}

// The FP8 gather: each latent value is bf16(e4m3 · scale) of its entry and the rope part its bf16
// values, bit for bit, for several requests out of scattered blocks.
TEST(GlueCuda, GatherLatentFp8DequantizesEntries) {
    REQUIRE_GPU();
    for (const auto& [C, rope] : {std::pair{64, 16}, std::pair{200, 8}}) {
        const MlaFp8Layout L{C, rope};
        const int bs = 16, max_blocks = 4, num_blocks = 12, E = int(L.entry_bytes());
        const auto values = random_bf16(size_t(num_blocks) * bs * (C + rope), 22, 2.0f);
        std::vector<uint8_t> cache(size_t(num_blocks) * bs * E);
        for (int sl = 0; sl < num_blocks * bs; ++sl)
            quantize_latent_entry_fp8(values.f32.data() + size_t(sl) * (C + rope), L, cache.data() + size_t(sl) * E);
        const std::vector<int32_t> lens = {37, 1, 64};
        const std::vector<int32_t> table = {5, 2, 9, 0, /**/ 7, 0, 0, 0, /**/ 11, 1, 3, 4};
        std::vector<int32_t> starts{0};
        for (int32_t n : lens) starts.push_back(starts.back() + n);
        const int rows = starts.back();
        Dev<uint8_t> dcache(cache);
        Dev<uint16_t> latent(size_t(rows) * C), k_pe(size_t(rows) * rope);
        Dev<int32_t> dtable(table), dstarts(starts);
        latent.poison(), k_pe.poison();
        launch_gather_latent({nullptr, dcache.ptr}, dtable.ptr, max_blocks, bs, dstarts.ptr, int(lens.size()), rows, C,
                             rope, latent.ptr, k_pe.ptr, nullptr);
        FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
        const auto lat = latent.download(), pe = k_pe.download();
        std::vector<float> entry(size_t(C + rope));
        for (size_t r = 0; r < lens.size(); ++r)
            for (int pos = 0; pos < lens[r]; ++pos) {
                const size_t slot = size_t(table[r * max_blocks + pos / bs]) * bs + pos % bs, row = starts[r] + pos;
                dequantize_latent_entry_fp8(cache.data() + slot * E, L, entry.data());
                for (int d = 0; d < C + rope; ++d) {
                    const uint16_t want = f32_to_bf16(entry[d]);
                    const uint16_t g = d < C ? lat[row * C + d] : pe[row * rope + d - C];
                    ASSERT_EQ(g, want) << "request " << r << " position " << pos << " value " << d << ", widths " << C
                                       << " + " << rope;
                }
            }
    }
}

// The MHA form's gather: several requests' contexts back to back out of scattered, out-of-order
// cache blocks (odd lengths, a block shared by nobody else, a one-request call without offsets),
// against the host's copy of the same entries; bits must match (a copy).
TEST(GlueCuda, GatherLatentOfSeveralRequestsCopiesTheirEntries) {
    REQUIRE_GPU();
    // 40 + 8: the 16-byte copies; 36 + 6: value by value (rows not a multiple of 16 bytes).
    for (const auto& [C, rope] : {std::pair{40, 8}, std::pair{36, 6}}) {
        const int E = C + rope, bs = 16, max_blocks = 4, num_blocks = 12;
        const auto cache = random_bf16(size_t(num_blocks) * bs * E, 21);
        const std::vector<int32_t> lens = {37, 1, 64, 16};
        const std::vector<int32_t> table = {5, 2, 9, 0, /**/ 7, 0, 0, 0, /**/ 11, 1, 3, 4, /**/ 10, 0, 0, 0};
        std::vector<int32_t> starts{0};
        for (int32_t n : lens) starts.push_back(starts.back() + n);
        const int rows = starts.back();
        Dev<uint16_t> dcache(cache.bits), latent(size_t(rows) * C), k_pe(size_t(rows) * rope);
        Dev<int32_t> dtable(table), dstarts(starts);
        for (const bool several : {true, false}) {
            latent.poison(), k_pe.poison();
            const int R = several ? int(lens.size()) : 1, total = several ? rows : lens[0];
            launch_gather_latent({dcache.ptr, nullptr}, dtable.ptr, max_blocks, bs, several ? dstarts.ptr : nullptr, R,
                                 total, C, rope, latent.ptr, k_pe.ptr, nullptr);
            FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
            const auto lat = latent.download(), pe = k_pe.download();
            for (int r = 0; r < R; ++r)
                for (int pos = 0; pos < lens[r]; ++pos) {
                    const size_t slot = size_t(table[r * max_blocks + pos / bs]) * bs + pos % bs, row = starts[r] + pos;
                    for (int d = 0; d < E; ++d) {
                        const uint16_t want = cache.bits[slot * E + d];
                        const uint16_t g = d < C ? lat[row * C + d] : pe[row * rope + d - C];
                        ASSERT_EQ(g, want) << "request " << r << " position " << pos << " value " << d
                                           << (several ? " (several requests)" : " (one request)") << ", widths " << C
                                           << " + " << rope;
                    }
                }
        }
        if (C != 40) continue;
        EXPECT_NE(fanout::testing::error_of([&] {
                      launch_gather_latent({dcache.ptr, nullptr}, dtable.ptr, max_blocks, bs, nullptr, 2, rows, C, rope,
                                           latent.ptr, k_pe.ptr, nullptr);
                  }).find("kv_start"),
                  std::string::npos);
    }
}

// The fused launch writes what the two separate ones write, bit for bit (both checked against the
// CPU above): odd head counts (a partial last block of heads), rows with padding, a poisoned cache.
TEST(GlueCuda, QRopeKvAppendFusedEqualsTheTwoLaunches) {
    REQUIRE_GPU();
    for (auto [T, H, nope, C, rope] : {std::tuple{7, 5, 24, 40, 8}, {1, 128, 128, 512, 64}, {33, 6, 16, 32, 16}}) {
        const int stride = 3 + C + rope + 5;
        auto q = random_bf16(size_t(T) * H * (nope + rope), 11);
        auto rows = random_bf16(size_t(T) * stride, 12, 3.0f);
        auto w = fanout::testing::random_floats(C, 13);
        std::vector<int32_t> pos, slots;
        for (int t = 0; t < T; ++t) {
            pos.push_back(40 + t * 57);
            slots.push_back(2 * t + 1);
        }
        const RopeTable tab = yarn_table(rope);
        const size_t cache_n = size_t(2 * T + 2) * (C + rope);
        Dev<uint16_t> dq(q.bits), drows(rows.bits), pe_a(size_t(T) * H * rope), pe_b(size_t(T) * H * rope),
            cache_a(cache_n), cache_b(cache_n);
        Dev<float> dw(w), freq(tab.inv_freq);
        Dev<int32_t> dpos(pos), dslots(slots);
        for (auto* d : {&pe_a, &pe_b, &cache_a, &cache_b}) d->poison();
        const RopeDevice rd{freq.ptr, rope, tab.attention_factor};
        launch_mla_q_rope(dq.ptr, T, H, nope, dpos.ptr, rd, pe_a.ptr, nullptr);
        launch_mla_kv_append(drows.ptr + 3, stride, T, C, dw.ptr, 1e-6f, dpos.ptr, rd, dslots.ptr,
                             {cache_a.ptr, nullptr}, nullptr);
        launch_mla_q_rope_kv_append(dq.ptr, T, H, nope, pe_b.ptr, drows.ptr + 3, stride, C, dw.ptr, 1e-6f, dpos.ptr, rd,
                                    dslots.ptr, {cache_b.ptr, nullptr}, nullptr);
        EXPECT_EQ(pe_a.download(), pe_b.download()) << "q_pe, T " << T << " H " << H;
        EXPECT_EQ(cache_a.download(), cache_b.download()) << "cache, T " << T << " C " << C;
        // The same with FP8 entries.
        const size_t fp8_n = size_t(2 * T + 2) * size_t(MlaFp8Layout{C, rope}.entry_bytes());
        Dev<uint8_t> fp8_a(fp8_n), fp8_b(fp8_n);
        fp8_a.poison(), fp8_b.poison();
        launch_mla_kv_append(drows.ptr + 3, stride, T, C, dw.ptr, 1e-6f, dpos.ptr, rd, dslots.ptr, {nullptr, fp8_a.ptr},
                             nullptr);
        launch_mla_q_rope_kv_append(dq.ptr, T, H, nope, pe_b.ptr, drows.ptr + 3, stride, C, dw.ptr, 1e-6f, dpos.ptr, rd,
                                    dslots.ptr, {nullptr, fp8_b.ptr}, nullptr);
        EXPECT_EQ(fp8_a.download(), fp8_b.download()) << "FP8 cache, T " << T << " C " << C;
    }
}

TEST(GlueCuda, SiluMulMatchesCpu) {
    REQUIRE_GPU();
    const int R = 6, I = 45;
    auto gu = random_bf16(size_t(R) * 2 * I, 6, 3.0f);
    Tensor g = Tensor::zeros({R, I}, DType::kF32), u = Tensor::zeros({R, I}, DType::kF32),
           o = Tensor::zeros({R, I}, DType::kF32);
    for (int r = 0; r < R; ++r)
        for (int i = 0; i < I; ++i) {
            g.data_as<float>()[r * I + i] = gu.f32[r * 2 * I + i];
            u.data_as<float>()[r * I + i] = gu.f32[r * 2 * I + I + i];
        }
    silu_mul(g, u, o, Stream{});
    Dev<uint16_t> dgu(gu.bits), out(size_t(R) * I);
    out.poison();
    launch_silu_mul_bf16(dgu.ptr, R, I, out.ptr, nullptr);
    EXPECT_LT(rel(to_f32(out.download()), std::vector<float>(o.data_as<float>(), o.data_as<float>() + R * I)), 1e-2);
}

// y += x in f32, rounded to bf16 once: the CPU rule on an odd length; past n nothing is written.
// y[b, m] = x[b, m] · w[b]ᵀ for m < counts[b]; rows past a count stay poisoned. Also f32 output.
TEST(GlueCuda, BatchedGemmBf16MatchesCpu) {
    REQUIRE_GPU();
    const int B = 3, M = 21, N = 35, K = 50;
    const std::vector<int32_t> counts = {21, 0, 9};
    auto x = random_bf16(size_t(B) * M * K, 7), w = random_bf16(size_t(B) * N * K, 8);
    Dev<uint16_t> dx(x.bits), dw(w.bits), y(size_t(B) * M * N);
    Dev<float> yf(size_t(B) * M * N);
    Dev<int32_t> dc(counts);
    y.poison();
    yf.poison();
    BatchedGemmBf16 g;
    g.x = dx.ptr;
    g.x_batch_stride = int64_t(M) * K;
    g.x_row_stride = K;
    g.w = dw.ptr;
    g.counts = dc.ptr;
    g.batch = B;
    g.M = M;
    g.N = N;
    g.K = K;
    g.y = y.ptr;
    launch_batched_gemm_bf16(g, nullptr);
    g.y = nullptr;
    g.y_f32 = yf.ptr;
    g.counts = nullptr;
    launch_batched_gemm_bf16(g, nullptr);
    const auto got = y.download();
    const auto gotf = yf.download();
    std::vector<float> gv, rv, gf, rf;
    for (int b = 0; b < B; ++b)
        for (int m = 0; m < M; ++m)
            for (int n = 0; n < N; ++n) {
                double acc = 0;
                for (int k = 0; k < K; ++k) acc += double(x.f32[(b * M + m) * K + k]) * w.f32[(b * N + n) * K + k];
                const size_t o = (size_t(b) * M + m) * N + n;
                gf.push_back(gotf[o]);
                rf.push_back(float(acc));
                if (m < counts[b]) {
                    gv.push_back(bf16_to_f32(got[o]));
                    rv.push_back(float(acc));
                } else {
                    ASSERT_EQ(got[o], 0xffff) << "row past the count written: b " << b << " m " << m;
                }
            }
    EXPECT_LT(rel(gv, rv), 1e-2);
    EXPECT_LT(rel(gf, rf), 1e-5);
}

// y of a strided-batched GEMM on the host (f64 sums): y[b·stride_y + m·ldy + n] =
// Σ_k x[b·stride_x + m·ldx + k] · w[b·stride_w + n·ldw + k], into a y of `y_size` values.
std::vector<float> strided_reference(const StridedBatchedGemm& g, const std::vector<float>& x,
                                     const std::vector<float>& w, size_t y_size) {
    std::vector<float> y(y_size, 0.0f);
    for (int b = 0; b < g.batch; ++b)
        for (int m = 0; m < g.M; ++m)
            for (int n = 0; n < g.N; ++n) {
                double acc = 0;
                for (int k = 0; k < g.K; ++k)
                    acc +=
                        double(x[size_t(b * g.stride_x + m * g.ldx + k)]) * w[size_t(b * g.stride_w + n * g.ldw + k)];
                y[size_t(b * g.stride_y + m * g.ldy + n)] = float(acc);
            }
    return y;
}

// The strided-batched BF16 GEMM in the absorbed attention's two layouts, on odd shapes: k_b reading
// each head's first `nope` values of q rows [T, H, nope + rope] in place into [H, T, C], and v_b
// from [H, T, C] writing [T, H, v] in place (outputs poisoned first: every value is written). Each
// shape runs twice (the second on its cached plan); bad strides and null pointers are refused.
TEST(GlueCuda, StridedBatchedGemmBf16MatchesCpu) {
    REQUIRE_GPU();
    DeviceContext ctx(nullptr);
    // The last: strides of 52 / 156 / 360 bytes, batches off 16-byte alignment.
    for (auto [T, H, nope, rope, C, V] :
         {std::tuple{7, 3, 24, 8, 40, 16}, {1, 5, 128, 64, 512, 128}, {33, 2, 16, 8, 72, 24}, {5, 3, 20, 6, 36, 12}}) {
        const int qw = nope + rope;
        auto q = random_bf16(size_t(T) * H * qw, 30 + T), kb = random_bf16(size_t(H) * C * nope, 31);
        auto ol = random_bf16(size_t(H) * T * C, 32), vb = random_bf16(size_t(H) * V * C, 33);
        Dev<uint16_t> dq(q.bits), dkb(kb.bits), dol(ol.bits), dvb(vb.bits), lat(size_t(H) * T * C),
            out(size_t(T) * H * V);
        lat.poison();
        out.poison();
        const StridedBatchedGemm k_b{
            H, T, C, nope, dq.ptr, int64_t(H) * qw, qw, dkb.ptr, nope, int64_t(C) * nope, lat.ptr, C, int64_t(T) * C};
        const StridedBatchedGemm v_b{
            H, T, V, C, dol.ptr, C, int64_t(T) * C, dvb.ptr, C, int64_t(V) * C, out.ptr, int64_t(H) * V, V};
        for (int rep = 0; rep < 2; ++rep) {
            launch_gemm_bf16_batched(ctx, k_b);
            launch_gemm_bf16_batched(ctx, v_b);
        }
        FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> ref_lat = strided_reference(k_b, q.f32, kb.f32, lat.n),
                                 ref_out = strided_reference(v_b, ol.f32, vb.f32, out.n);
        EXPECT_LT(rel(to_f32(lat.download()), ref_lat), 1e-2) << "k_b, T " << T << " H " << H;
        EXPECT_LT(rel(to_f32(out.download()), ref_out), 1e-2) << "v_b, T " << T << " H " << H;
    }
    const std::string msg = fanout::testing::error_of([&] {
        launch_gemm_bf16_batched(ctx, {2, 4, 8, 16, nullptr, 8, 64, nullptr, 16, 128, nullptr, 8, 32});
    });
    EXPECT_NE(msg.find("row strides x 8"), std::string::npos) << msg;
    const std::string null_msg = fanout::testing::error_of([&] {
        launch_gemm_bf16_batched(ctx, {2, 4, 8, 16, nullptr, 16, 64, nullptr, 16, 128, nullptr, 8, 32});
    });
    EXPECT_NE(null_msg.find("device pointers"), std::string::npos) << null_msg;
}

// cuBLASLt's shapes and the few-row GEMV's (M <= 8, K % 8 == 0: the router's gate at decode), a K
// the GEMV cannot take, and V3's router at 61 and 256 rows (cuBLASLt's first choice splits K at 256:
// PERF.md, run89).
TEST(GlueCuda, GemmBf16F32OutMatchesCpu) {
    REQUIRE_GPU();
    for (auto [M, N, K] : {std::tuple{13, 72, 256},
                           {1, 256, 7168},
                           {2, 256, 7168},
                           {8, 37, 136},
                           {5, 4096, 64},
                           {3, 19, 36},
                           {61, 256, 7168},
                           {256, 256, 7168}}) {
        auto x = random_bf16(size_t(M) * K, 9 + M), w = random_bf16(size_t(N) * K, 10 + N);
        Dev<uint16_t> dx(x.bits), dw(w.bits);
        Dev<float> y(size_t(M) * N);
        y.poison();
        DeviceContext ctx(nullptr);  // the default stream: the copies around it are synchronous
        launch_gemm_bf16_f32(ctx, dx.ptr, dw.ptr, y.ptr, M, N, K);
        std::vector<float> ref;
        for (int m = 0; m < M; ++m)
            for (int n = 0; n < N; ++n) {
                double acc = 0;
                for (int k = 0; k < K; ++k) acc += double(x.f32[m * K + k]) * w.f32[n * K + k];
                ref.push_back(float(acc));
            }
        EXPECT_LT(rel(y.download(), ref), 1e-5) << M << "x" << N << "x" << K;
    }
    const std::string msg =
        fanout::testing::error_of([] { launch_gemv_bf16_f32(nullptr, nullptr, nullptr, 9, 8, 8, nullptr); });
    EXPECT_NE(msg.find("M=9"), std::string::npos) << msg;
}

// The norm that also quantizes for the next FP8 GEMM gives exactly rms_norm_bf16 then
// act_quant_bf16 (same bf16 output, same e4m3 bytes and scales), on strided rows.
TEST(GlueCuda, RmsNormQuantEqualsNormThenActQuant) {
    REQUIRE_GPU();
    // 16-byte and one-value accesses, one slot of 8 columns per thread and two (past 8,192), partial
    // 128-column blocks.
    for (auto [M, D, stride] : {std::tuple{3, 1536, 2112},
                                {2, 7168, 7168},
                                {37, 7168, 7168},
                                {5, 96, 176},
                                {2, 130, 130},
                                {3, 16384, 16384},
                                {2, 9002, 9010}}) {
        auto x = random_bf16(size_t(M) * stride, 21, 3.0f);
        auto w = fanout::testing::random_floats(size_t(D), 22);
        const int nb = (D + 127) / 128;
        Dev<uint16_t> dx(x.bits), y1(size_t(M) * D), y2(size_t(M) * D);
        Dev<float> dw(w), s1(size_t(M) * nb), s2(size_t(M) * nb);
        Dev<float> s3(size_t(M) * nb), s4(size_t(M) * nb), s5(size_t(M) * nb);
        Dev<uint8_t> q1(size_t(M) * D), q2(size_t(M) * D), q3(size_t(M) * D), q4(size_t(M) * D);
        for (auto* b : {&q1, &q2, &q3, &q4}) b->poison();
        for (auto* b : {&s1, &s2, &s3, &s4, &s5}) b->poison();
        y2.poison();
        constexpr ScaleOrder kRow = ScaleOrder::kRowMajor, kMMajor = ScaleOrder::kMMajor;
        launch_rms_norm_bf16_strided(dx.ptr, stride, nullptr, dw.ptr, 1e-6f, y1.ptr, D, M, D, nullptr);
        launch_act_quant_bf16(y1.ptr, q1.ptr, s1.ptr, kRow, M, D, nullptr);
        launch_act_quant_bf16(y1.ptr, q4.ptr, s4.ptr, kMMajor, M, D, nullptr);
        launch_rms_norm_quant_bf16(dx.ptr, stride, nullptr, dw.ptr, 1e-6f, y2.ptr, D, q2.ptr, s2.ptr, kRow, M, D,
                                   nullptr);
        // Only the quantized rows (no bf16 output), as the layer asks when FP8 projections follow,
        // with M-major scales and a row-major copy, as it asks in front of the shared experts'
        // cuBLASLt GEMM and the routed experts.
        launch_rms_norm_quant_bf16(dx.ptr, stride, nullptr, dw.ptr, 1e-6f, nullptr, D, q3.ptr, s3.ptr, kMMajor, M, D,
                                   nullptr, s5.ptr);
        EXPECT_EQ(y1.download(), y2.download()) << M << "x" << D;
        EXPECT_EQ(q1.download(), q2.download()) << M << "x" << D;
        EXPECT_EQ(s1.download(), s2.download()) << M << "x" << D;
        EXPECT_EQ(q1.download(), q3.download()) << M << "x" << D << " without y";
        EXPECT_EQ(s4.download(), s3.download()) << M << "x" << D << " without y, M-major";
        EXPECT_EQ(s1.download(), s5.download()) << M << "x" << D << " the row-major copy";
    }
    const std::string msg = fanout::testing::error_of([] {
        launch_rms_norm_quant_bf16(nullptr, 8, nullptr, nullptr, 1e-6f, nullptr, 8, nullptr, nullptr,
                                   ScaleOrder::kRowMajor, 1, 8, nullptr);
    });
    EXPECT_NE(msg.find("neither"), std::string::npos) << msg;
}

// The bf16 permute: the FP8 permute's order, counts, slots and spill blocks, on 2-byte rows
// without scales — capped (the hot experts spill), all contiguous, all masked.
TEST(GlueCuda, PermuteBf16MatchesCpuOrder) {
    REQUIRE_GPU();
    const int T = 29, K = 3, D = 40, E = 6;
    auto x = random_bf16(size_t(T) * D, 11);
    std::vector<int32_t> idx;
    std::mt19937 rng(3);
    for (int t = 0; t < T; ++t) {
        std::vector<int32_t> all = {0, 1, 2, 3, 4, 5, 6, 7};
        std::shuffle(all.begin() + 1, all.end(), rng);      // expert 0 in every token: it spills
        for (int k = 0; k < K; ++k) idx.push_back(all[k]);  // 6, 7: experts of another rank
    }
    // Reference: the CPU permute on a byte view of the rows (2 bytes per value, no scales).
    std::vector<uint8_t> bytes(reinterpret_cast<const uint8_t*>(x.bits.data()),
                               reinterpret_cast<const uint8_t*>(x.bits.data()) + x.bits.size() * 2);
    for (const int cap : {5, 0, T}) {
        const int spill_rows = int(moe_spill_rows(T, K, E, cap)), rows = E * cap + spill_rows;
        std::vector<uint8_t> ref_x(size_t(rows) * 2 * D, 0xff);  // the device buffer's poison
        std::vector<int32_t> ref_counts(E), ref_blocks(size_t(spill_rows / 128)), ref_slot(size_t(T) * K);
        moe_permute_cpu(bytes.data(), nullptr, idx.data(), T, K, 2 * D, 0, E, cap, spill_rows, ref_x.data(), nullptr,
                        ref_counts.data(), ref_blocks.data(), ref_slot.data());
        Dev<uint16_t> dx(x.bits), out(size_t(rows) * D);
        Dev<int32_t> didx(idx), counts(E), blocks(ref_blocks.size()), slot(size_t(T) * K);
        out.poison();
        counts.poison();
        blocks.poison();
        slot.poison();
        launch_moe_permute_bf16(dx.ptr, didx.ptr, T, K, D, 0, E, cap, spill_rows, out.ptr, counts.ptr, blocks.ptr,
                                slot.ptr, nullptr);
        EXPECT_EQ(counts.download(), ref_counts) << "cap " << cap;
        if (!ref_blocks.empty()) {
            EXPECT_EQ(blocks.download(), ref_blocks) << "cap " << cap;
        }
        EXPECT_EQ(slot.download(), ref_slot) << "cap " << cap;
        EXPECT_EQ(std::count(ref_blocks.begin(), ref_blocks.end(), 0) > 0, cap < T) << "cap " << cap;
        const auto got = out.download();
        ASSERT_EQ(std::memcmp(got.data(), ref_x.data(), ref_x.size()), 0) << "cap " << cap;
    }
}

// The spill region's 128-row blocks as batches of the bf16 GEMM: batch b on w[block_expert[b]],
// -1 blocks untouched.
TEST(GlueCuda, BatchedGemmBf16OverBlocksMatchesCpu) {
    REQUIRE_GPU();
    const int E = 3, N = 35, K = 50, M = 128;
    const std::vector<int32_t> block_expert = {2, -1, 0, 2, -1};
    const int B = int(block_expert.size());
    auto x = random_bf16(size_t(B) * M * K, 12), w = random_bf16(size_t(E) * N * K, 13);
    Dev<uint16_t> dx(x.bits), dw(w.bits), y(size_t(B) * M * N);
    Dev<int32_t> dbe(block_expert);
    y.poison();
    BatchedGemmBf16 g;
    g.x = dx.ptr;
    g.x_batch_stride = int64_t(M) * K;
    g.x_row_stride = K;
    g.w = dw.ptr;
    g.block_expert = dbe.ptr;
    g.batch = B;
    g.M = M;
    g.N = N;
    g.K = K;
    g.y = y.ptr;
    launch_batched_gemm_bf16(g, nullptr);
    const auto got = y.download();
    std::vector<float> gv, rv;
    for (int b = 0; b < B; ++b)
        for (int m = 0; m < M; ++m)
            for (int n = 0; n < N; ++n) {
                const size_t o = (size_t(b) * M + m) * N + n;
                const int e = block_expert[b];
                if (e < 0) {
                    ASSERT_EQ(got[o], 0xffff) << "unused block written: b " << b << " m " << m;
                    continue;
                }
                double acc = 0;
                for (int k = 0; k < K; ++k)
                    acc += double(x.f32[(size_t(b) * M + m) * K + k]) * w.f32[(size_t(e) * N + n) * K + k];
                gv.push_back(bf16_to_f32(got[o]));
                rv.push_back(float(acc));
            }
    EXPECT_LT(rel(gv, rv), 1e-2);
}

// The device sampler's tokens for `rows` over `logits` [rows, V] (no logit bias).
std::vector<int32_t> sample_on_device(const std::vector<float>& logits, int V, const std::vector<SamplingRow>& rows) {
    Dev<float> dl(logits);
    Dev<SamplingRow> dp(rows);
    Dev<int32_t> out(rows.size());
    out.poison();
    launch_sample(dl.ptr, static_cast<int>(rows.size()), V, dp.ptr, nullptr, out.ptr, nullptr);
    return out.download();
}

// The device sampler picks what sample_with_uniform picks, row by row, for greedy, temperature,
// top-k, top-p and their mixes, a temperature too small to divide by, over the real vocabulary
// size with many draws.
TEST(SamplingCuda, MatchesCpuRule) {
    REQUIRE_GPU();
    const int V = 129280;
    std::vector<SamplingRow> rows;
    // (1e-38: under kGreedyTemperature, greedy on both; a logit divided by it overflows)
    const SamplingRow kinds[] = {{0.0f, 0, 1.0f, 0},  {1.0f, 0, 1.0f, 0}, {0.7f, 50, 1.0f, 0},    {1.3f, 0, 0.9f, 0},
                                 {0.9f, 20, 0.5f, 0}, {1.0f, 1, 1.0f, 0}, {2.0f, 1000, 0.95f, 0}, {1e-38f, 0, 1.0f, 0}};
    std::mt19937_64 rng(5);
    for (int i = 0; i < 80; ++i) {
        SamplingRow r = kinds[i % 8];
        r.uniform = static_cast<double>(rng() >> 11) * 0x1.0p-53;
        rows.push_back(r);
    }
    const int R = static_cast<int>(rows.size());
    std::vector<float> logits = fanout::testing::random_floats(size_t(R) * V, 12, 6.0f);
    for (int r = 0; r < R; ++r) logits[size_t(r) * V + (r * 7919) % V] = 30.0f;  // a clear favourite in each row
    for (int r = 0; r < R; r += 5) logits[size_t(r) * V + 17] = 30.0f;           // and a tie in some
    const auto got = sample_on_device(logits, V, rows);
    std::vector<std::pair<float, int32_t>> scratch;
    int differ = 0;
    for (int r = 0; r < R; ++r) {
        SamplingParams p{rows[r].temperature, rows[r].top_k, rows[r].top_p, 0};
        const int32_t ref = sample_with_uniform(logits.data() + size_t(r) * V, V, p, rows[r].uniform, scratch);
        if (got[r] != ref) {
            ++differ;
            ADD_FAILURE() << "row " << r << " (T " << p.temperature << " top_k " << p.top_k << " top_p " << p.top_p
                          << " u " << rows[r].uniform << "): gpu " << got[r] << " cpu " << ref;
        }
    }
    EXPECT_EQ(differ, 0);
}

// Rows the CPU sampler refuses (a NaN or +inf logit, every logit -inf: sampling.h) get kNotFinite
// on the device, for every kind of parameters and draft rows alike, the bad logit at the first, a
// middle or the last id (each kind of parameters at another); the rows beside them (one -inf
// logit, -inf everywhere but one) are sampled as the CPU samples them. (No logit_bias here: the
// device adds it before the check, and a finite bias cannot make a logit finite or not.)
TEST(SamplingCuda, NonFiniteRowsAreRefusedAsOnTheCpu) {
    REQUIRE_GPU();
    const int V = 32003;
    const SamplingRow kinds[] = {{0.0f, 0, 1.0f, 0}, {1.0f, 0, 1.0f, 0}, {0.9f, 20, 0.5f, 0}, {1.0f, 1, 1.0f, 0}};
    std::vector<SamplingRow> rows;
    std::vector<float> logits;
    std::vector<bool> refused;
    std::mt19937_64 rng(21);
    for (int k = 0; k < 4; ++k)
        for (int what = 0; what < 8; ++what) {
            SamplingRow r = kinds[k];
            r.uniform = static_cast<double>(rng() >> 11) * 0x1.0p-53;
            if (what % 2 == 1) r.draft = 5, r.uniform_residual = 0.5;
            std::vector<float> row = fanout::testing::random_floats(V, 40 + k * 8 + what, 3.0f);
            const int at = (k + what / 2) % 3 == 0 ? 0 : (k + what / 2) % 3 == 1 ? V / 2 : V - 1;
            switch (what / 2) {
                case 0:
                    row[at] = std::nanf("");
                    break;
                case 1:
                    row[at] = INFINITY;
                    break;
                case 2:
                    std::fill(row.begin(), row.end(), -INFINITY);
                    break;
                default:  // beside them: one -inf, or -inf everywhere but one
                    if (k % 2 == 0) {
                        std::fill(row.begin(), row.end(), -INFINITY);
                        row[V / 3] = 1.0f;
                    } else {
                        row[at] = -INFINITY;
                    }
            }
            refused.push_back(what / 2 < 3);
            rows.push_back(r);
            logits.insert(logits.end(), row.begin(), row.end());
        }
    const auto got = sample_on_device(logits, V, rows);
    std::vector<std::pair<float, int32_t>> scratch;
    for (size_t r = 0; r < rows.size(); ++r) {
        SCOPED_TRACE("row " + std::to_string(r));
        const float* l = logits.data() + r * V;
        const SamplingParams p{rows[r].temperature, rows[r].top_k, rows[r].top_p, 0};
        const auto cpu = [&] {
            return rows[r].draft >= 0 ? check_draft_with_uniforms(l, V, p, rows[r].draft, rows[r].uniform,
                                                                  rows[r].uniform_residual, scratch)
                                            .token
                                      : sample_with_uniform(l, V, p, rows[r].uniform, scratch);
        };
        if (refused[r]) {
            EXPECT_EQ(got[r], kNotFinite);
            EXPECT_THROW(cpu(), Error);
        } else {
            EXPECT_EQ(got[r], cpu());
        }
    }
}

// Draft rows (MTP verification): the device's verdict is check_draft_with_uniforms's, row by row,
// for every kind of parameters, with drafts that are the favourite, a likely token, an unlikely
// one, one top-k / top-p drop, and the first and last ids — accepted and rejected both occur.
TEST(SamplingCuda, DraftRowsMatchCpuCheck) {
    REQUIRE_GPU();
    const SamplingRow kinds[] = {{0.0f, 0, 1.0f, 0},  {1.0f, 0, 1.0f, 0}, {0.7f, 50, 1.0f, 0},   {1.3f, 0, 0.9f, 0},
                                 {0.9f, 20, 0.5f, 0}, {1.0f, 1, 1.0f, 0}, {2.0f, 1000, 0.95f, 0}};
    std::mt19937_64 rng(9);
    for (const int V : {37, 32003, 129280}) {
        std::vector<SamplingRow> rows;
        for (int i = 0; i < 84; ++i) {
            SamplingRow r = kinds[i % 7];
            r.uniform = static_cast<double>(rng() >> 11) * 0x1.0p-53;
            r.uniform_residual = static_cast<double>(rng() >> 11) * 0x1.0p-53;
            rows.push_back(r);
        }
        const int R = static_cast<int>(rows.size());
        std::vector<float> logits = fanout::testing::random_floats(size_t(R) * V, 13 + V, 3.0f);
        for (int r = 0; r < R; ++r) {
            const int fav = (r * 7919) % V, second = (r * 104729 + 1) % V;
            logits[size_t(r) * V + fav] = 8.0f;
            logits[size_t(r) * V + second] = 7.5f;
            const int which = (r / 7) % 6;
            rows[r].draft = which == 0   ? fav
                            : which == 1 ? second
                            : which == 2 ? static_cast<int32_t>(rng() % V)
                            : which == 3 ? 0
                            : which == 4 ? V - 1
                                         : (fav + 1) % V;
        }
        const auto got = sample_on_device(logits, V, rows);
        std::vector<std::pair<float, int32_t>> scratch;
        int accepted = 0, rejected = 0;
        for (int r = 0; r < R; ++r) {
            SamplingParams p{rows[r].temperature, rows[r].top_k, rows[r].top_p, 0};
            const DraftCheck ref = check_draft_with_uniforms(logits.data() + size_t(r) * V, V, p, rows[r].draft,
                                                             rows[r].uniform, rows[r].uniform_residual, scratch);
            EXPECT_EQ(got[r], ref.token) << "V " << V << " row " << r << " (T " << p.temperature << " top_k " << p.top_k
                                         << " top_p " << p.top_p << " draft " << rows[r].draft << ")";
            EXPECT_EQ(ref.accepted, ref.token == rows[r].draft);
            (ref.accepted ? accepted : rejected) += 1;
        }
        EXPECT_GT(accepted, 0) << V;
        EXPECT_GT(rejected, 0) << V;
    }
}

// Flat logits: every token has the same probability, so the pick is a direct function of u —
// the tie resolution in id order is what is tested.
TEST(SamplingCuda, FlatLogitsPickByIdOrder) {
    REQUIRE_GPU();
    const int V = 1000;
    std::vector<SamplingRow> rows;
    for (int i = 0; i < 16; ++i) rows.push_back({1.0f, i % 2 ? 100 : 0, 1.0f, (i + 0.5) / 16.0});
    std::vector<float> logits(size_t(rows.size()) * V, 0.25f);
    Dev<float> dl(logits);
    Dev<SamplingRow> dp(rows);
    Dev<int32_t> out(rows.size());
    launch_sample(dl.ptr, int(rows.size()), V, dp.ptr, nullptr, out.ptr, nullptr);
    const auto got = out.download();
    std::vector<std::pair<float, int32_t>> scratch;
    for (size_t r = 0; r < rows.size(); ++r) {
        SamplingParams p{rows[r].temperature, rows[r].top_k, rows[r].top_p, 0};
        EXPECT_EQ(got[r], sample_with_uniform(logits.data() + r * V, V, p, rows[r].uniform, scratch)) << r;
    }
}

// logit_bias on the device: random biases (none, a few small ones that reorder close logits,
// ±100 ones that force or ban, the first and last ids) on odd vocabulary sizes, every kind of
// parameters; the device picks what sample_with_uniform picks with the same biases, and leaves
// each row's logits biased in place (logits[id] + bias, bit for bit).
TEST(SamplingCuda, LogitBiasMatchesCpuRule) {
    REQUIRE_GPU();
    const SamplingRow kinds[] = {{0.0f, 0, 1.0f, 0},  {1.0f, 0, 1.0f, 0}, {0.7f, 50, 1.0f, 0},   {1.3f, 0, 0.9f, 0},
                                 {0.9f, 20, 0.5f, 0}, {1.0f, 1, 1.0f, 0}, {2.0f, 1000, 0.95f, 0}};
    std::mt19937_64 rng(6);
    for (const int V : {1, 37, 1001, 32003, 129281}) {
        std::vector<SamplingRow> rows;
        std::vector<LogitBias> bias;
        std::vector<std::vector<std::pair<int32_t, float>>> row_bias;
        for (int i = 0; i < 42; ++i) {
            SamplingRow r = kinds[i % 7];
            r.uniform = static_cast<double>(rng() >> 11) * 0x1.0p-53;
            std::vector<int32_t> ids;
            const int count = i % 6 == 0 ? 0 : static_cast<int>(rng() % 3000);
            for (int k = 0; k < count; ++k) ids.push_back(static_cast<int32_t>(rng() % V));
            if (i % 5 == 1) ids.push_back(0);
            if (i % 5 == 2) ids.push_back(V - 1);
            std::sort(ids.begin(), ids.end());
            ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
            std::vector<std::pair<int32_t, float>> rb;
            for (int32_t id : ids) {
                const int kind = static_cast<int>(rng() % 8);
                const float b = kind == 0   ? 100.0f
                                : kind == 1 ? -100.0f
                                            : std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
                rb.push_back({id, b});
            }
            r.bias_begin = static_cast<int32_t>(bias.size());
            r.bias_count = static_cast<int32_t>(rb.size());
            for (const auto& [id, b] : rb) bias.push_back({id, b});
            row_bias.push_back(rb);
            rows.push_back(r);
        }
        const int R = static_cast<int>(rows.size());
        std::vector<float> logits = fanout::testing::random_floats(size_t(R) * V, 13 + V, 6.0f);
        for (int r = 0; r < R; r += 3) logits[size_t(r) * V + (r * 7919) % V] = 30.0f;  // a clear favourite
        Dev<float> dl(logits);
        Dev<SamplingRow> dp(rows);
        Dev<LogitBias> db(bias);
        Dev<int32_t> out(R);
        out.poison();
        launch_sample(dl.ptr, R, V, dp.ptr, db.ptr, out.ptr, nullptr);
        const auto got = out.download();
        const auto biased = dl.download();
        std::vector<std::pair<float, int32_t>> scratch;
        int differ = 0;
        for (int r = 0; r < R; ++r) {
            SamplingParams p{rows[r].temperature, rows[r].top_k, rows[r].top_p, 0};
            p.logit_bias = row_bias[r];
            const float* row = logits.data() + size_t(r) * V;
            const int32_t ref = sample_with_uniform(row, V, p, rows[r].uniform, scratch);
            if (got[r] != ref) {
                ++differ;
                ADD_FAILURE() << "V " << V << " row " << r << " (T " << p.temperature << " top_k " << p.top_k
                              << " top_p " << p.top_p << " u " << rows[r].uniform << ", " << p.logit_bias.size()
                              << " biases): gpu " << got[r] << " cpu " << ref;
            }
            std::vector<float> want(row, row + V);
            for (const auto& [id, b] : row_bias[r]) want[id] = row[id] + b;
            ASSERT_EQ(std::memcmp(want.data(), biased.data() + size_t(r) * V, size_t(V) * sizeof(float)), 0)
                << "V " << V << " row " << r << ": the logits left on the device are not logits + bias";
        }
        EXPECT_EQ(differ, 0) << "V " << V;
    }
}

}  // namespace
}  // namespace fanout::ops

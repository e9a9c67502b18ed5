// mla_cuda_test: the MLA attention kernels (ops/mla_attention_cuda.h) against the CPU reference
// `mla_latent_attention_cpu`. Labelled `gpu`; without a GPU the GPU tests report themselves skipped.
//
// Every problem: random bf16 inputs (never zero), a shuffled block table, every cache slot that no
// query may see (past kv_len, unused blocks, unused table entries) filled with NaN so a read past
// the causal/tail mask shows, and outputs poisoned with 0xff (bf16 NaN) before the launch.
//
// Tolerance (per (token, head) row, ‖got − ref‖ / ‖ref‖ ≤ 1e-2; whole output ≤ 5e-3): the output is
// bf16 (2^-9 relative rounding per value) and the tensor-core kernel feeds P to P·V in bf16 (2^-9
// per weight, averaging out over the positions); scores are exact bf16 products summed in f32. A
// correct kernel stays near 3e-3 per row. A mask that admits or drops one position moves a row by
// about 1/√(visible positions) — 3% at 1000 — and a split combined without its log-sum-exp weight
// moves it by far more; `ToleranceCatchesAnOffByOneMask` checks the first claim on the CPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "fanout/core/cuda_check.h"
#include "fanout/core/cuda_graph.h"
#include "fanout/core/dtype.h"
#include "fanout/core/error.h"
#include "fanout/ops/mla_attention.h"
#include "fanout/ops/mla_attention_cuda.h"
#include "test_util.h"

namespace fanout::ops {
namespace {

using fanout::testing::DeviceBuffer;

constexpr uint16_t kBf16NaN = 0x7fc0;

struct Case {
    std::string name;
    int heads, kv_lora, rope;
    std::vector<int> q_lens, kv_lens;  // per request; query tokens sit at positions kv - q .. kv - 1
    bool head_major = false;           // q_lat, q_pe and out in [H][T][C] instead of [T][H][C]
    int force_splits = 0;
    int block_size = 64;
    float q_scale = 1.0f;  // larger: peakier softmax, larger jumps of the running maximum
    bool generic = false;  // launch_mla_attention_generic whatever the widths
    bool fp8 = false;      // the FP8 cache (quantize_latent_entry_fp8) instead of the bf16 one
};

std::string describe(const Case& c) {
    std::ostringstream s;
    s << "[" << c.name << "] H=" << c.heads << " kv_lora=" << c.kv_lora << " rope=" << c.rope
      << " block=" << c.block_size << (c.head_major ? " q/out [H][T][C]" : " q/out [T][H][C]")
      << " force_splits=" << c.force_splits << (c.fp8 ? " cache fp8" : "") << " q_lens={";
    for (size_t r = 0; r < c.q_lens.size(); ++r) s << (r ? "," : "") << c.q_lens[r];
    s << "} kv_lens={";
    for (size_t r = 0; r < c.kv_lens.size(); ++r) s << (r ? "," : "") << c.kv_lens[r];
    s << "}";
    return s.str();
}

// One problem on the host: metadata, a bf16 cache, bf16 queries in the case's layout.
struct Problem {
    Case c;
    int T = 0, R = 0, H = 0, C = 0, D = 0, num_blocks = 0, max_blocks = 0;
    std::vector<int32_t> query_start, kv_len, positions, block_table;
    std::vector<uint16_t> cache, q_lat, q_pe;
    std::vector<uint8_t> cache_fp8;  // c.fp8: the FP8 form of every slot (`cache` then holds what it decodes to)
    int64_t q_lat_st = 0, q_lat_sh = 0, q_pe_st = 0, q_pe_sh = 0, out_st = 0, out_sh = 0;
    float scale = 0;

    // min_blocks / min_table: sizes to keep across problems (graph replays reuse the buffers).
    Problem(const Case& cs, uint64_t seed, int min_blocks = 0, int min_table = 0, int num_tokens = -1)
        : c(cs), R(int(cs.q_lens.size())), H(cs.heads), C(cs.kv_lora), D(cs.kv_lora + cs.rope) {
        std::mt19937_64 rng(seed);
        const int bs = c.block_size;
        query_start.assign(R + 1, 0);
        int needed = 0;
        for (int r = 0; r < R; ++r) {
            query_start[r + 1] = query_start[r] + c.q_lens[r];
            kv_len.push_back(c.kv_lens[r]);
            for (int i = 0; i < c.q_lens[r]; ++i) positions.push_back(c.kv_lens[r] - c.q_lens[r] + i);
            needed += (c.kv_lens[r] + bs - 1) / bs;
            max_blocks = std::max(max_blocks, (c.kv_lens[r] + bs - 1) / bs + 1);
        }
        T = query_start[R];
        if (num_tokens >= 0) {
            EXPECT_EQ(T, num_tokens) << "replay problems must keep the token count";
        }
        max_blocks = std::max(max_blocks, min_table);
        num_blocks = std::max(needed + 1, min_blocks);  // at least one block that nobody owns
        // Blocks handed out in a shuffled order; the last id of the permutation stays unowned and
        // fills the unused table entries, so a read through them meets NaN.
        std::vector<int32_t> perm(num_blocks);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        block_table.assign(size_t(R) * max_blocks, perm.back());
        cache.assign(size_t(num_blocks) * bs * D, kBf16NaN);
        std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
        auto value = [&](float s) {
            float v = dist(rng);
            if (std::fabs(v) < 1e-3f) v = 0.5f;  // never zero
            return f32_to_bf16(v * s);
        };
        int next = 0;
        for (int r = 0; r < R; ++r) {
            for (int b = 0; b < (c.kv_lens[r] + bs - 1) / bs; ++b)
                block_table[size_t(r) * max_blocks + b] = perm[next++];
            for (int j = 0; j < c.kv_lens[r]; ++j) {
                const size_t slot = size_t(block_table[size_t(r) * max_blocks + j / bs]) * bs + j % bs;
                for (int d = 0; d < D; ++d) cache[slot * D + d] = value(1.0f);
            }
        }
        if (c.fp8) {
            // Every slot in the FP8 form (NaN slots stay NaN); `cache` becomes the bf16 values the kernel
            // computes with (e4m3 · scale rounded to bf16), so the reference below is the kernel's math.
            const MlaFp8Layout L{C, c.rope};
            EXPECT_TRUE(mla_fp8_widths_ok(C, c.rope)) << "kv_lora " << C << " rope " << c.rope;
            cache_fp8.assign(size_t(num_blocks) * bs * L.entry_bytes(), 0);
            std::vector<float> entry(D);
            for (size_t slot = 0; slot < size_t(num_blocks) * bs; ++slot) {
                for (int d = 0; d < D; ++d) entry[d] = bf16_to_f32(cache[slot * D + d]);
                uint8_t* q = cache_fp8.data() + slot * L.entry_bytes();
                quantize_latent_entry_fp8(entry.data(), L, q);
                dequantize_latent_entry_fp8(q, L, entry.data());
                for (int d = 0; d < D; ++d) cache[slot * D + d] = f32_to_bf16(entry[d]);
            }
        }
        q_lat.resize(size_t(T) * H * C);
        q_pe.resize(size_t(T) * H * c.rope);
        for (auto& v : q_lat) v = value(c.q_scale);
        for (auto& v : q_pe) v = value(c.q_scale);
        if (c.head_major) {
            q_lat_st = C, q_lat_sh = int64_t(T) * C, q_pe_st = c.rope, q_pe_sh = int64_t(T) * c.rope;
            out_st = C, out_sh = int64_t(T) * C;
        } else {
            q_lat_st = int64_t(H) * C, q_lat_sh = C, q_pe_st = int64_t(H) * c.rope, q_pe_sh = c.rope;
            out_st = int64_t(H) * C, out_sh = C;
        }
        scale = 1.5f / std::sqrt(float(D));
    }

    // [T, H, C] f32; `positions_override` replaces the positions (the tolerance self-test).
    std::vector<float> reference(ThreadPool& pool, const std::vector<int32_t>* positions_override = nullptr) const {
        std::vector<float> ql(q_lat.size()), qp(q_pe.size()), out(size_t(T) * H * C);
        for (size_t i = 0; i < ql.size(); ++i) ql[i] = bf16_to_f32(q_lat[i]);
        for (size_t i = 0; i < qp.size(); ++i) qp[i] = bf16_to_f32(q_pe[i]);
        LatentCache lc{const_cast<uint16_t*>(cache.data()), DType::kBF16, num_blocks, c.block_size, D};
        AttentionMetadata meta{R,
                               query_start.data(),
                               kv_len.data(),
                               block_table.data(),
                               max_blocks,
                               positions_override ? positions_override->data() : positions.data()};
        mla_latent_attention_cpu(ql.data(), q_lat_st, q_lat_sh, qp.data(), q_pe_st, q_pe_sh, lc, meta, T, H, C, scale,
                                 out.data(), Stream{&pool});
        return out;
    }

    // got: the kernel's output in the case's layout, read back into [T, H, C].
    std::vector<float> to_thc(const std::vector<uint16_t>& got) const {
        std::vector<float> o(size_t(T) * H * C);
        for (int t = 0; t < T; ++t)
            for (int h = 0; h < H; ++h)
                for (int d = 0; d < C; ++d)
                    o[(size_t(t) * H + h) * C + d] = bf16_to_f32(got[size_t(t * out_st + h * out_sh + d)]);
        return o;
    }

    int request_of(int t) const {
        int r = 0;
        while (query_start[r + 1] <= t) ++r;
        return r;
    }
};

// Per-row and overall relative error; the message names the worst row.
struct Comparison {
    double overall = 0, worst_row = 0;
    std::string detail;
};

Comparison compare(const Problem& pb, const std::vector<float>& got, const std::vector<float>& ref) {
    Comparison cmp;
    cmp.overall = fanout::testing::rel_error(got.data(), ref.data(), ref.size());
    int worst = -1;
    for (int i = 0; i < pb.T * pb.H; ++i) {
        const double e = fanout::testing::rel_error(got.data() + size_t(i) * pb.C, ref.data() + size_t(i) * pb.C, pb.C);
        if (worst < 0 || !(e <= cmp.worst_row)) cmp.worst_row = e, worst = i;
        if (!std::isfinite(e)) break;
    }
    if (worst >= 0) {
        const int t = worst / pb.H, h = worst % pb.H, r = pb.request_of(t);
        std::ostringstream s;
        s << "worst row: token " << t << " (request " << r << ", kv_len " << pb.kv_len[r] << ", position "
          << pb.positions[t] << ") head " << h << " rel error " << cmp.worst_row << "; values [0..3] got";
        for (int d = 0; d < std::min(pb.C, 4); ++d) s << " " << got[size_t(worst) * pb.C + d];
        s << " want";
        for (int d = 0; d < std::min(pb.C, 4); ++d) s << " " << ref[size_t(worst) * pb.C + d];
        s << " (NaN = unwritten output or a masked/NaN cache slot that was read)";
        cmp.detail = s.str();
    }
    return cmp;
}

// Device copies of a problem; `refresh` uploads a same-sized problem (graph replays).
struct DeviceProblem {
    DeviceBuffer<int32_t> query_start, kv_len, positions, block_table;
    DeviceBuffer<uint16_t> cache, q_lat, q_pe, out;
    DeviceBuffer<uint8_t> cache_fp8;
    explicit DeviceProblem(const Problem& pb)
        : query_start(pb.query_start.size()),
          kv_len(pb.kv_len.size()),
          positions(pb.positions.size()),
          block_table(pb.block_table.size()),
          cache(pb.cache.size()),
          q_lat(pb.q_lat.size()),
          q_pe(pb.q_pe.size()),
          out(size_t(pb.T) * pb.H * pb.C),
          cache_fp8(pb.cache_fp8.size()) {
        refresh(pb);
    }
    void refresh(const Problem& pb) {
        ASSERT_EQ(pb.cache.size(), cache.n);
        ASSERT_EQ(pb.block_table.size(), block_table.n);
        query_start.upload(pb.query_start.data());
        kv_len.upload(pb.kv_len.data());
        positions.upload(pb.positions.data());
        block_table.upload(pb.block_table.data());
        cache.upload(pb.cache.data());
        if (!pb.cache_fp8.empty()) cache_fp8.upload(pb.cache_fp8.data());
        q_lat.upload(pb.q_lat.data());
        q_pe.upload(pb.q_pe.data());
    }
    MlaAttentionParams params(const Problem& pb) const {
        MlaAttentionParams p;
        p.num_tokens = pb.T;
        p.num_requests = pb.R;
        p.num_heads = pb.H;
        p.kv_lora = pb.C;
        p.rope_dim = pb.c.rope;
        p.block_size = pb.c.block_size;
        p.max_blocks = pb.max_blocks;
        p.max_query_len = *std::max_element(pb.c.q_lens.begin(), pb.c.q_lens.end());
        p.scale = pb.scale;
        p.query_start = query_start.ptr;
        p.kv_len = kv_len.ptr;
        p.positions = positions.ptr;
        p.block_table = block_table.ptr;
        p.cache = pb.c.fp8 ? nullptr : cache.ptr;
        p.cache_fp8 = pb.c.fp8 ? cache_fp8.ptr : nullptr;
        p.q_lat = q_lat.ptr, p.q_lat_stride_t = pb.q_lat_st, p.q_lat_stride_h = pb.q_lat_sh;
        p.q_pe = q_pe.ptr, p.q_pe_stride_t = pb.q_pe_st, p.q_pe_stride_h = pb.q_pe_sh;
        p.out = out.ptr, p.out_stride_t = pb.out_st, p.out_stride_h = pb.out_sh;
        return p;
    }
    std::vector<uint16_t> download_out() const {
        std::vector<uint16_t> h(out.n);
        out.download(h.data());
        return h;
    }
};

const char* kernel_name(MlaKernel k) { return k == MlaKernel::kTensorCore ? "tensor-core (wgmma)" : "generic"; }

void expect_matches(const Problem& pb, const std::vector<uint16_t>& got_raw, const std::vector<float>& ref,
                    const std::string& what) {
    const Comparison cmp = compare(pb, pb.to_thc(got_raw), ref);
    EXPECT_LE(cmp.worst_row, 1e-2) << what << "\n  " << cmp.detail;
    EXPECT_LE(cmp.overall, 5e-3) << what << "\n  " << cmp.detail;
}

void run_case(const Case& c, ThreadPool& pool, MlaWorkspace& ws) {
    const Problem pb(c, 1234 + c.heads + c.kv_lens.size());
    const std::vector<float> ref = pb.reference(pool);
    DeviceProblem dev(pb);
    const MlaAttentionParams p = dev.params(pb);
    const MlaKernel expected = c.generic || !(c.kv_lora == 512 && c.rope == 64 && c.block_size == 64)
                                   ? MlaKernel::kGeneric
                                   : MlaKernel::kTensorCore;
    if (!c.generic) {
        EXPECT_EQ(mla_attention_kernel_for(p), expected) << describe(c) << ": routed to the wrong kernel";
    }
    dev.out.poison();
    if (c.generic)
        launch_mla_attention_generic(p, &ws, nullptr, c.force_splits);
    else
        launch_mla_attention(p, &ws, nullptr, c.force_splits);
    FANOUT_CUDA_CHECK(cudaGetLastError());
    FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
    expect_matches(pb, dev.download_out(), ref, describe(c) + " kernel " + kernel_name(expected));
}

TEST(MlaCuda, TensorCoreKernelMatchesCpuReference) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    MlaWorkspace ws;
    const std::vector<Case> cases = {
        {"decode, every tail", 128, 512, 64, {1, 1, 1, 1, 1, 1}, {1, 63, 64, 65, 1000, 1500}},
        {"MTP q2 + a request with no query", 128, 512, 64, {2, 0, 2, 2}, {2, 100, 64, 1030}},
        {"q4/q1/q3 at 16 heads", 16, 512, 64, {4, 4, 1, 3}, {4, 65, 1000, 127}},
        {"q2 head-major layout", 128, 512, 64, {2, 1, 2}, {129, 1, 777}, true},
        {"prefill chunk of 37 after 50 cached + decode", 16, 512, 64, {37, 1}, {87, 200}},
        {"prefill chunk at 128 heads", 128, 512, 64, {37}, {87}},
        {"no split", 128, 512, 64, {2, 2}, {1000, 65}, false, 1},
        // Unsplit: row blocks the requests fill only partly (16 heads: 48 and 16 rows; the staged
        // 16-byte output stores skip the rows past a request's), and the head-major layout.
        {"16 heads q3 + q1, no split", 16, 512, 64, {3, 1}, {700, 65}, false, 1},
        {"64 heads q3 + q1, head-major, no split", 64, 512, 64, {3, 1}, {300, 129}, true, 1},
        {"7 splits", 128, 512, 64, {2, 2}, {1000, 65}, false, 7},
        {"64 splits, most empty", 32, 512, 64, {1, 2}, {70, 3}, false, 64},
        {"peaky scores", 32, 512, 64, {1, 2}, {3000, 700}, false, 0, 64, 8.0f},
        {"heads 64, 4 query tokens, head-major", 64, 512, 64, {4, 4, 4}, {2048, 5, 300}, true},
        // Many tile pairs in one CTA (mbarrier phases wrap), an odd tile count (the last pair has no
        // second tile) and a partial last block, unsplit and split into odd/even tile ranges.
        {"long, odd tiles, no split", 128, 512, 64, {2, 1}, {4999, 4033}, false, 1},
        {"long, odd tiles, 3 splits", 128, 512, 64, {2, 1}, {4999, 4033}, false, 3},
        // The benchmark's small-batch shape: 1, 2 or 3 tiles per split (one pair, or a pair and a lone
        // tile A), tails in tile A and in tile B.
        {"q2 kv 5000, 33 splits", 128, 512, 64, {2}, {5000}, false, 33},
        {"q2 kv 4990 / 4866, 40 splits", 128, 512, 64, {2, 2}, {4990, 4866}, false, 40},
        // Row blocks in pairs (clusters sharing each load): a pair whose second block has no rows, one
        // whose blocks end in different tiles (kv 129, q3: horizons 128 and 129), a partial block.
        {"pairs of row blocks at 32 heads", 32, 512, 64, {4, 2, 3}, {300, 1000, 129}},
        {"pairs of row blocks at 32 heads, no split", 32, 512, 64, {4, 2, 3}, {300, 1000, 129}, false, 1},
    };
    for (const Case& c : cases) run_case(c, pool, ws);
    // 24 requests of random lengths at 128 heads: enough CTAs that no split is taken.
    Case big{"24 mixed requests", 128, 512, 64, {}, {}};
    std::mt19937 rng(5);
    for (int r = 0; r < 24; ++r) {
        big.q_lens.push_back(1 + int(rng() % 2));
        big.kv_lens.push_back(2 + int(rng() % 2500));
    }
    run_case(big, pool, ws);
}

// One process driving several GPUs: the tensor-core kernel's shared-memory limit is set on each
// device (devices in reverse order, so that device 0 is not the first a launch met).
TEST(MlaCuda, EveryDeviceOfOneProcess) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    fanout::testing::on_every_device_zero_last([&](int d) {
        MlaWorkspace ws;
        run_case({"q2 on device " + std::to_string(d), 128, 512, 64, {2, 1}, {1000, 65}}, pool, ws);
    });
}

// The FP8 cache through the tensor-core kernel against the reference on what it decodes to: every
// tail position in either tile of a pair, splits, the head-major layout, peaky scores, many tile
// pairs, and a request whose slots past kv_end hold NaN bytes. Then through the generic kernel: the
// tiny model's widths (one group of 64), odd widths with a partial last group and another block
// size, V3's widths, and a negative scale (which only the generic kernel takes).
TEST(MlaCuda, Fp8CacheMatchesCpuReference) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    MlaWorkspace ws;
    std::vector<Case> cases = {
        {"decode, every tail", 128, 512, 64, {1, 1, 1, 1, 1, 1}, {1, 63, 64, 65, 1000, 1500}},
        {"MTP q2 + a request with no query", 128, 512, 64, {2, 0, 2, 2}, {2, 100, 64, 1030}},
        {"q4/q1/q3 at 16 heads", 16, 512, 64, {4, 4, 1, 3}, {4, 65, 1000, 127}},
        {"q2 head-major layout", 128, 512, 64, {2, 1, 2}, {129, 1, 777}, true},
        {"no split", 128, 512, 64, {2, 2}, {1000, 65}, false, 1},
        {"7 splits", 128, 512, 64, {2, 2}, {1000, 65}, false, 7},
        {"peaky scores", 32, 512, 64, {1, 2}, {3000, 700}, false, 0, 64, 8.0f},
        {"long, odd tiles, no split", 128, 512, 64, {2, 1}, {4999, 4033}, false, 1},
        {"q2 kv 4990 / 4866, 40 splits", 128, 512, 64, {2, 2}, {4990, 4866}, false, 40},
        {"generic: tiny 64/16", 4, 64, 16, {1, 2, 4, 37}, {1, 63, 65, 87}},
        {"generic: tiny 64/16, 5 splits, head-major", 4, 64, 16, {2}, {1000}, true, 5},
        {"generic: 200/24 (a partial group), block 16", 5, 200, 24, {2, 3}, {130, 64}, false, 0, 16},
        {"generic: DeepSeek widths", 16, 512, 64, {2, 1}, {1000, 65}, false, 0, 64, 1.0f, true},
    };
    for (Case& c : cases) {
        c.fp8 = true;
        run_case(c, pool, ws);
    }
    Case negative{"negative scale (the generic kernel)", 8, 512, 64, {1, 2}, {70, 300}};
    negative.fp8 = true;
    const Problem pb(negative, 3);
    DeviceProblem dev(pb);
    MlaAttentionParams p = dev.params(pb);
    p.scale = -p.scale;
    EXPECT_EQ(mla_attention_kernel_for(p), MlaKernel::kGeneric);
    Problem flipped = pb;
    flipped.scale = -pb.scale;
    const std::vector<float> ref = flipped.reference(pool);
    dev.out.poison();
    launch_mla_attention(p, &ws, nullptr);
    FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
    expect_matches(flipped, dev.download_out(), ref, describe(negative));
}

// The device quantization equals quantize_latent_entry_fp8 byte for byte: ordinary entries, a block
// of zeros (scale 1), one tiny and one large block, an odd count of entries.
TEST(MlaCuda, QuantizeLatentFp8MatchesCpu) {
    REQUIRE_GPU();
    constexpr int n = 37, D = kMlaFp8Lora + kMlaFp8Rope;
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<uint16_t> in(size_t(n) * D);
    for (auto& v : in) v = f32_to_bf16(dist(rng));
    for (int d = 128; d < 256; ++d) in[size_t(3) * D + d] = 0;                              // zeros
    for (int d = 0; d < 128; ++d) in[size_t(5) * D + d] = f32_to_bf16(dist(rng) * 1e-30f);  // tiny
    for (int d = 384; d < 512; ++d) in[size_t(6) * D + d] = f32_to_bf16(dist(rng) * 3e4f);  // large
    std::vector<uint8_t> want(size_t(n) * kMlaFp8EntryBytes);
    std::vector<float> entry(D);
    for (int e = 0; e < n; ++e) {
        for (int d = 0; d < D; ++d) entry[d] = bf16_to_f32(in[size_t(e) * D + d]);
        quantize_latent_entry_fp8(entry.data(), kMlaFp8V3, want.data() + size_t(e) * kMlaFp8EntryBytes);
    }
    DeviceBuffer<uint16_t> d_in(in);
    DeviceBuffer<uint8_t> d_out(want.size());
    d_out.poison();
    launch_quantize_latent_fp8(d_in.ptr, n, d_out.ptr, nullptr);
    FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint8_t> got = d_out.download();
    for (size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(int(got[i]), int(want[i])) << "entry " << i / kMlaFp8EntryBytes << " byte " << i % kMlaFp8EntryBytes;
}

// Both caches at once, or FP8 widths the entry cannot hold, are refused by name.
TEST(MlaCuda, BadFp8CacheIsRefused) {
    REQUIRE_GPU();
    const Case c{"fp8 refused", 8, 512, 64, {1}, {70}, false, 0, 64, 1.0f, false, true};
    const Problem pb(c, 3);
    DeviceProblem dev(pb);
    MlaAttentionParams p = dev.params(pb);
    p.cache = dev.cache.ptr;  // both
    EXPECT_NE(fanout::testing::error_of([&] { launch_mla_attention(p, nullptr, nullptr); }).find("exactly one"),
              std::string::npos);
    p.cache = nullptr;
    p.kv_lora = 510, p.rope_dim = 66;  // 510 is not a multiple of 4
    EXPECT_NE(fanout::testing::error_of([&] { launch_mla_attention(p, nullptr, nullptr); }).find("kv_lora=510"),
              std::string::npos);
}

TEST(MlaCuda, GenericKernelMatchesCpuReference) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    MlaWorkspace ws;
    const std::vector<Case> cases = {
        {"tiny 32/8", 4, 32, 8, {1, 2, 4, 37}, {1, 63, 65, 87}},
        {"tiny 64/16 head-major", 4, 64, 16, {1, 4}, {1000, 64}, true},
        {"tiny 64/16, 5 splits", 4, 64, 16, {2}, {1000}, false, 5},
        {"tiny 64/16, no split", 4, 64, 16, {2, 1}, {1000, 1}, false, 1},
        {"block size 16", 4, 64, 16, {3, 1}, {50, 17}, false, 0, 16},
        {"odd widths 100/24, 5 heads", 5, 100, 24, {2, 3}, {130, 64}},
        {"widest 1024/128", 3, 1024, 128, {1, 2}, {300, 65}},
        {"DeepSeek widths through the generic kernel", 16, 512, 64, {2, 1}, {1000, 65}, false, 0, 64, 1.0f, true},
        {"DeepSeek widths with another block size", 16, 512, 64, {2, 1}, {300, 65}, false, 0, 32},
    };
    for (const Case& c : cases) run_case(c, pool, ws);
}

// One captured graph, replayed with new kv lengths, positions, block tables and cache contents
// (same token/request counts and max_query_len: the graph's host values).
TEST(MlaCuda, GraphReplaysWithNewLengths) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    MlaWorkspace ws;
    struct Replay {
        int heads, kv_lora, rope;
        std::vector<int> q_lens;
        std::vector<std::vector<int>> kv_rounds;
    };
    const std::vector<Replay> replays = {
        {128, 512, 64, {2, 2, 2}, {{1000, 65, 2}, {64, 2000, 130}, {3, 7, 4000}}},
        {16, 512, 64, {1, 4}, {{1, 4}, {3000, 63}, {65, 1025}}},
        {4, 64, 16, {2, 2, 1}, {{2, 1000, 1}, {640, 2, 64}, {5, 5, 3000}}},
    };
    for (const Replay& rp : replays) {
        std::vector<Case> rounds;
        int min_blocks = 0, min_table = 0, T = 0;
        for (const auto& kv : rp.kv_rounds) {
            rounds.push_back({"replay", rp.heads, rp.kv_lora, rp.rope, rp.q_lens, kv});
            int blocks = 1, table = 0;
            for (int v : kv) blocks += (v + 63) / 64, table = std::max(table, (v + 63) / 64 + 1);
            min_blocks = std::max(min_blocks, blocks);
            min_table = std::max(min_table, table);
        }
        T = std::accumulate(rp.q_lens.begin(), rp.q_lens.end(), 0);
        const Problem first(rounds[0], 77, min_blocks, min_table, T);
        DeviceProblem dev(first);
        const MlaAttentionParams p = dev.params(first);
        cudaStream_t stream;
        FANOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        const cudaGraphExec_t exec = capture_graph(stream, [&] { launch_mla_attention(p, &ws, stream); });
        for (size_t i = 0; i < rounds.size(); ++i) {
            const Problem pb(rounds[i], 100 + i, min_blocks, min_table, T);
            dev.refresh(pb);
            dev.out.poison();
            FANOUT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
            FANOUT_CUDA_CHECK(cudaStreamSynchronize(stream));
            expect_matches(pb, dev.download_out(), pb.reference(pool),
                           "graph replay " + std::to_string(i) + " of " + describe(rounds[i]) + " kernel " +
                               kernel_name(mla_attention_kernel_for(p)));
        }
        cudaGraphExecDestroy(exec);
        cudaStreamDestroy(stream);
    }
}

// The tensor-core kernel writes out rows in 16-byte pieces and takes row maxima on raw scores: an
// out pointer or stride off that alignment, or a scale that is not positive, goes to the generic
// kernel instead.
TEST(MlaCuda, UnsuitedLaunchesGoToTheGenericKernel) {
    MlaAttentionParams p;
    p.num_requests = 1, p.num_heads = 128, p.kv_lora = 512, p.rope_dim = 64, p.block_size = 64;
    const auto at = [](uintptr_t a) { return reinterpret_cast<uint16_t*>(a); };
    p.q_lat = p.q_pe = p.cache = p.out = at(0x10000);
    p.q_lat_stride_t = p.q_pe_stride_t = p.out_stride_t = 128 * 512;
    p.q_lat_stride_h = p.q_pe_stride_h = p.out_stride_h = 512;
    EXPECT_EQ(mla_attention_kernel_for(p), MlaKernel::kTensorCore);
    p.out = at(0x10008);
    EXPECT_EQ(mla_attention_kernel_for(p), MlaKernel::kGeneric) << "out 8 bytes off 16";
    p.out = at(0x10000), p.out_stride_h = 516;
    EXPECT_EQ(mla_attention_kernel_for(p), MlaKernel::kGeneric) << "out rows 1,032 bytes apart";
    p.out_stride_h = 512, p.scale = 0.0f;
    EXPECT_EQ(mla_attention_kernel_for(p), MlaKernel::kGeneric) << "scale 0";
    p.scale = 0.1f;
    EXPECT_EQ(mla_attention_kernel_for(p), MlaKernel::kTensorCore);
}

// The comparison can fail: a reference whose mask lets the last query token of each request see
// one position fewer differs from the true one by more than the tolerance.
TEST(MlaCuda, ToleranceCatchesAnOffByOneMask) {
    ThreadPool pool(0);
    const Case c{"mask self-test", 8, 512, 64, {2, 2}, {1000, 2500}};
    const Problem pb(c, 9);
    std::vector<int32_t> shifted = pb.positions;
    for (int r = 0; r < pb.R; ++r) shifted[pb.query_start[r + 1] - 1] -= 1;
    const Comparison cmp = compare(pb, pb.reference(pool, &shifted), pb.reference(pool));
    EXPECT_GT(cmp.worst_row, 1e-2) << "an off-by-one mask would pass the kernel tests: " << cmp.detail;
}

}  // namespace
}  // namespace fanout::ops

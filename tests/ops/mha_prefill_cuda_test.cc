// mha_prefill_cuda_test: the MLA prefill attention kernels in MHA form (ops/mha_prefill_cuda.h)
// against the CPU reference `mha_prefill_cpu` (ops/mla_attention.h). Labelled `gpu`; without a GPU
// the GPU tests report themselves skipped (the parameter checks and the mask self-test still run).
//
// Every problem: random bf16 inputs (never zero); the 64 key rows past ctx_len of k_nope, k_pe and v
// and every padding element of a strided layout hold NaN, so a read past the keys or outside a row
// shows as NaN in the output; outputs are poisoned with 0xff (bf16 NaN) before the launch, so an
// unwritten output shows too.
//
// Tolerance (per (token, head) row ‖got − ref‖ / ‖ref‖ ≤ 1e-2; whole output ≤ 5e-3): the inputs are
// the same bf16 values on both sides and scores are exact bf16 products summed in f32, so the
// kernels differ from the f32 reference only by the bf16 output (2^-9 relative rounding per value)
// and, in the tensor-core kernels, by P fed to P·V in bf16 (2^-9 per weight, averaging out over the
// keys). A correct kernel stays near 3e-3 per row. A mask that admits or drops one key moves a row
// by about 1/√(visible keys) — 3% at 1000 — and no mask at all moves the early rows by far more;
// `ToleranceCatchesWrongMasks` checks both claims on the CPU.
#include "fanout/ops/mha_prefill_cuda.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_test_util.h"
#include "fanout/core/cuda_check.h"
#include "fanout/core/dtype.h"
#include "fanout/ops/device_context.h"
#include "fanout/ops/mla_attention.h"
#include "test_util.h"

namespace fanout::ops {
namespace {

using fanout::testing::DeviceBuffer;

// The launches' context: the legacy default stream (the tests' copies are synchronous), made on
// first use — after REQUIRE_GPU, so the parameter checks run without a GPU too.
DeviceContext& launch_ctx() {
    static DeviceContext c(nullptr);
    return c;
}

constexpr uint16_t kBf16NaN = 0x7fc0;
constexpr int kNanKeyRows = 64;  // NaN rows after the last key

struct Case {
    std::string name;
    int heads, nope, rope, v_dim;
    int T, prefix;                // ctx_len = prefix + T
    bool head_major = false;      // q and out [H][T][C] instead of [T][H][C]
    bool kv_interleaved = false;  // k_nope and v in one [ctx][H][nope + v] buffer (kv_b's output) and
                                  // k_pe the tail of [ctx][lora + rope] rows (the latent cache entry)
    int q_pad = 0;                // NaN elements after each q row; not a multiple of 8: misaligned rows
    float q_scale = 1.0f;         // larger: peakier softmax, larger jumps of the running maximum
    bool force_generic = false;   // only the generic kernel, whatever the widths
};

std::string describe(const Case& c) {
    std::ostringstream s;
    s << "[" << c.name << "] H=" << c.heads << " nope=" << c.nope << " rope=" << c.rope << " v=" << c.v_dim
      << " T=" << c.T << " ctx_len=" << c.prefix + c.T << (c.head_major ? " q/out [H][T][C]" : " q/out [T][H][C]")
      << (c.kv_interleaved ? " kv interleaved [ctx][H][nope+v], k_pe in [ctx][lora+rope]" : " separate k/v")
      << " q_pad=" << c.q_pad << " q_scale=" << c.q_scale << (c.force_generic ? " forced generic" : "");
    return s.str();
}

// One problem on the host: bf16 buffers in the case's layout and their f32 copies for the reference.
struct Problem {
    Case c;
    int T = 0, ctx = 0, H = 0, qk = 0, V = 0;
    std::vector<uint16_t> q, k, v, kp;  // v is empty when interleaved (it lives in k)
    int64_t q_st = 0, q_sh = 0, k_st = 0, k_sh = 0, v_st = 0, v_sh = 0, v_off = 0, kp_st = 0, kp_off = 0;
    int64_t out_st = 0, out_sh = 0;
    std::vector<float> qf, kf, vf, kpf;
    float scale = 0;

    Problem(const Case& cs, uint64_t seed)
        : c(cs), T(cs.T), ctx(cs.prefix + cs.T), H(cs.heads), qk(cs.nope + cs.rope), V(cs.v_dim) {
        std::mt19937_64 rng(seed);
        std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
        auto value = [&](float s) {
            float x = dist(rng);
            if (std::fabs(x) < 1e-3f) x = 0.5f;  // never zero
            return f32_to_bf16(x * s);
        };
        const int64_t q_row = qk + c.q_pad, rows = ctx + kNanKeyRows;
        if (c.head_major) {
            q_st = q_row, q_sh = int64_t(T) * q_row, out_st = V, out_sh = int64_t(T) * V;
        } else {
            q_st = int64_t(H) * q_row, q_sh = q_row, out_st = int64_t(H) * V, out_sh = V;
        }
        q.assign(size_t(T) * H * q_row, kBf16NaN);
        for (int t = 0; t < T; ++t)
            for (int h = 0; h < H; ++h)
                for (int d = 0; d < qk; ++d) q[t * q_st + h * q_sh + d] = value(c.q_scale);
        if (c.kv_interleaved) {
            k_st = v_st = int64_t(H) * (c.nope + V), k_sh = v_sh = c.nope + V, v_off = c.nope;
            k.assign(size_t(rows * k_st), kBf16NaN);
            kp_off = c.nope == 128 ? 512 : 32;  // the c_kv part of the entry: never read
            kp_st = kp_off + c.rope;
        } else {
            k_st = int64_t(H) * c.nope, k_sh = c.nope, v_st = int64_t(H) * V, v_sh = V;
            k.assign(size_t(rows * k_st), kBf16NaN);
            v.assign(size_t(rows * v_st), kBf16NaN);
            kp_st = c.rope;
        }
        kp.assign(size_t(rows * kp_st), kBf16NaN);
        std::vector<uint16_t>& vbuf = c.kv_interleaved ? k : v;
        for (int j = 0; j < ctx; ++j) {
            for (int h = 0; h < H; ++h) {
                for (int d = 0; d < c.nope; ++d) k[j * k_st + h * k_sh + d] = value(1.0f);
                for (int d = 0; d < V; ++d) vbuf[v_off + j * v_st + h * v_sh + d] = value(1.0f);
            }
            for (int d = 0; d < c.rope; ++d) kp[kp_off + j * kp_st + d] = value(1.0f);
        }
        auto widen = [](const std::vector<uint16_t>& b) {
            std::vector<float> f(b.size());
            for (size_t i = 0; i < b.size(); ++i) f[i] = bf16_to_f32(b[i]);
            return f;
        };
        qf = widen(q), kf = widen(k), vf = widen(v), kpf = widen(kp);
        scale = 1.5f / std::sqrt(float(qk));
    }

    const float* v_f32() const { return (c.kv_interleaved ? kf.data() : vf.data()) + v_off; }

    // [num_tokens, H, V] f32: query tokens first_token .. first_token + num_tokens with `ctx_len` keys,
    // i.e. token first_token + i at position ctx_len − num_tokens + i (the self-test shifts it).
    std::vector<float> reference(ThreadPool& pool, int first_token, int num_tokens, int ctx_len) const {
        std::vector<float> out(size_t(num_tokens) * H * V);
        mha_prefill_cpu(qf.data() + first_token * q_st, q_st, q_sh, kf.data(), k_st, k_sh, kpf.data() + kp_off, kp_st,
                        v_f32(), v_st, v_sh, num_tokens, ctx_len, H, c.nope, c.rope, V, scale, out.data(),
                        Stream{&pool});
        return out;
    }
    std::vector<float> reference(ThreadPool& pool) const { return reference(pool, 0, T, ctx); }

    // got: the kernel's output in the case's layout, read back into [T, H, V].
    std::vector<float> to_thv(const std::vector<uint16_t>& got) const {
        std::vector<float> o(size_t(T) * H * V);
        for (int t = 0; t < T; ++t)
            for (int h = 0; h < H; ++h)
                for (int d = 0; d < V; ++d)
                    o[(size_t(t) * H + h) * V + d] = bf16_to_f32(got[size_t(t * out_st + h * out_sh + d)]);
        return o;
    }
};

// Per-row and overall relative error of [rows, H, V] outputs; `detail` names the worst row.
// first_token: the token index of row 0 (the self-test compares sub-ranges).
struct Comparison {
    double overall = 0, worst_row = 0;
    std::string detail;
};

Comparison compare(const Problem& pb, const std::vector<float>& got, const std::vector<float>& ref,
                   int first_token = 0) {
    Comparison cmp;
    cmp.overall = fanout::testing::rel_error(got.data(), ref.data(), ref.size());
    const int V = pb.V, rows = int(ref.size() / V);
    int worst = -1;
    for (int i = 0; i < rows; ++i) {
        const double e = fanout::testing::rel_error(got.data() + size_t(i) * V, ref.data() + size_t(i) * V, V);
        if (worst < 0 || !(e <= cmp.worst_row)) cmp.worst_row = e, worst = i;
        if (!std::isfinite(e)) break;
    }
    if (worst >= 0) {
        const int t = first_token + worst / pb.H, h = worst % pb.H;
        std::ostringstream s;
        s << "worst row: token " << t << " (position " << pb.ctx - pb.T + t << ", sees keys 0.." << pb.ctx - pb.T + t
          << " of ctx_len " << pb.ctx << ", query block of 64 #" << t / 64 << ") head " << h << " rel error "
          << cmp.worst_row << "; values [0..3] got";
        for (int d = 0; d < std::min(V, 4); ++d) s << " " << got[size_t(worst) * V + d];
        s << " want";
        for (int d = 0; d < std::min(V, 4); ++d) s << " " << ref[size_t(worst) * V + d];
        s << " (NaN = unwritten output, or a key past ctx_len / a padding element was read)";
        cmp.detail = s.str();
    }
    return cmp;
}

struct DeviceProblem {
    DeviceBuffer<uint16_t> q, k, v, kp, out;
    explicit DeviceProblem(const Problem& pb)
        : q(pb.q.size()), k(pb.k.size()), v(pb.v.size()), kp(pb.kp.size()), out(size_t(pb.T) * pb.H * pb.V) {
        q.upload(pb.q);
        k.upload(pb.k);
        if (!pb.v.empty()) v.upload(pb.v);
        kp.upload(pb.kp);
    }
    MhaPrefillParams params(const Problem& pb) const {
        MhaPrefillParams p;
        p.num_tokens = pb.T;
        p.ctx_len = pb.ctx;
        p.num_heads = pb.H;
        p.nope = pb.c.nope, p.rope = pb.c.rope, p.v_dim = pb.V;
        p.scale = pb.scale;
        p.q = q.ptr, p.q_stride_t = pb.q_st, p.q_stride_h = pb.q_sh;
        p.k_nope = k.ptr, p.k_stride_t = pb.k_st, p.k_stride_h = pb.k_sh;
        p.k_pe = kp.ptr + pb.kp_off, p.k_pe_stride_t = pb.kp_st;
        p.v = (pb.c.kv_interleaved ? k.ptr : v.ptr) + pb.v_off, p.v_stride_t = pb.v_st, p.v_stride_h = pb.v_sh;
        p.out = out.ptr, p.out_stride_t = pb.out_st, p.out_stride_h = pb.out_sh;
        return p;
    }
};

void run_case(const Case& c, ThreadPool& pool) {
    SCOPED_TRACE(describe(c));
    const Problem pb(c, 1234 + uint64_t(c.heads) * 7919 + uint64_t(c.T) * 31 + uint64_t(c.prefix));
    const std::vector<float> ref = pb.reference(pool);
    DeviceProblem dev(pb);
    const MhaPrefillParams p = dev.params(pb);
    const bool fast = c.nope == 128 && c.rope == 64 && c.v_dim == 128 && c.q_pad % 8 == 0;
    EXPECT_EQ(mha_prefill_kernel_for(p), fast ? MhaPrefillKernel::kWgmma : MhaPrefillKernel::kGeneric)
        << describe(c) << ": routed to the wrong kernel";
    const MhaPrefillKernel kernel = c.force_generic ? MhaPrefillKernel::kGeneric : mha_prefill_kernel_for(p);
    dev.out.poison();
    if (c.force_generic)
        launch_mha_prefill(launch_ctx(), p, kernel);
    else
        launch_mha_prefill(launch_ctx(), p);
    FANOUT_CUDA_CHECK(cudaGetLastError());
    FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
    const Comparison cmp = compare(pb, pb.to_thv(dev.out.download()), ref);
    const std::string what = describe(c) + " kernel " + mha_prefill_kernel_name(kernel);
    EXPECT_LE(cmp.worst_row, 1e-2) << what << "\n  " << cmp.detail;
    EXPECT_LE(cmp.overall, 5e-3) << what << "\n  " << cmp.detail;
}

TEST(MhaPrefillCuda, WgmmaKernelMatchesCpuReference) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    std::vector<Case> cases;
    // 128 heads (TP1) for the short chunks, 16 (TP8) for the long ones: the CPU reference's time.
    for (int T : {1, 37, 64})
        for (int prefix : {0, 50, 1000}) {
            Case c{"128 heads", 128, 128, 64, 128, T, prefix};
            c.head_major = (T == 37 && prefix == 50) || (T == 1 && prefix == 1000);
            c.kv_interleaved = (T == 64 && prefix == 1000) || (T == 1 && prefix == 1000);
            cases.push_back(c);
        }
    cases.push_back({"128 heads, 200 tokens", 128, 128, 64, 128, 200, 0});
    for (int T : {200, 513})
        for (int prefix : {0, 50, 1000}) {
            Case c{"16 heads", 16, 128, 64, 128, T, prefix};
            c.head_major = T == 513 && prefix == 50;
            c.kv_interleaved = T == 200 && prefix == 1000;
            cases.push_back(c);
        }
    cases.push_back({"prefix a multiple of the tile", 16, 128, 64, 128, 128, 64});
    // The wgmma kernel's 128-row blocks and 128-key tiles: chunks one past a block, three blocks
    // with a partial last one, a prefix that puts the diagonal mid-tile.
    cases.push_back({"129 tokens", 8, 128, 64, 128, 129, 0});
    cases.push_back({"300 tokens after 200", 8, 128, 64, 128, 300, 200, true});
    cases.push_back({"256 tokens after 127, interleaved kv", 8, 128, 64, 128, 256, 127, false, true});
    cases.push_back({"prefix 1: masked tiles straddle", 16, 128, 64, 128, 127, 1, true, true});
    cases.push_back({"padded q rows (16-byte aligned)", 16, 128, 64, 128, 100, 30, false, false, 8});
    cases.push_back({"peaky scores", 16, 128, 64, 128, 130, 70, false, false, 0, 8.0f});
    for (const Case& c : cases) run_case(c, pool);
}

TEST(MhaPrefillCuda, GenericKernelMatchesCpuReference) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    std::vector<Case> cases;
    for (const auto& [nope, rope, v_dim] : {std::tuple{16, 8, 16}, std::tuple{32, 16, 32}})
        for (int T : {1, 37, 200})
            for (int prefix : {0, 50, 1000}) {
                Case c{"tiny", 4, nope, rope, v_dim, T, prefix};
                c.head_major = (T + prefix) % 2 == 1;
                c.kv_interleaved = prefix == 50;
                cases.push_back(c);
            }
    cases.push_back({"tiny, peaky", 4, 32, 16, 32, 64, 100, false, false, 0, 8.0f});
    cases.push_back({"DeepSeek widths with misaligned q rows", 16, 128, 64, 128, 64, 100, false, false, 4});
    cases.push_back({"DeepSeek widths forced generic", 16, 128, 64, 128, 37, 50, true, true, 0, 1.0f, true});
    cases.push_back({"widest 768/256/256", 2, 768, 256, 256, 37, 50});
    cases.push_back({"odd widths 24/8/40, 3 heads", 3, 24, 8, 40, 45, 20, true});
    for (const Case& c : cases) run_case(c, pool);
}

// Several requests in one launch (query_start / kv_start), as the model's batched prefill calls it:
// queries and the kv_b-expanded keys of each request back to back (k_nope and v interleaved, k_pe
// the tail of latent-cache rows), NaN rows after the last request's keys. Each request must come
// out as its own reference — its keys only, its own positions — including a request with no
// queries (it has keys but writes nothing) and blocks that straddle requests.
void run_requests(int nope, int rope, int v_dim, int heads, const std::vector<std::pair<int, int>>& chunks,
                  ThreadPool& pool) {
    std::vector<Problem> reqs;
    std::vector<int32_t> qs{0}, ks{0};
    for (const auto& [T, prefix] : chunks) {
        Case c{"request", heads, nope, rope, v_dim, T, prefix};
        c.kv_interleaved = true;
        reqs.emplace_back(c, 77 + uint64_t(T) * 13 + uint64_t(prefix));
        qs.push_back(qs.back() + T);
        ks.push_back(ks.back() + T + prefix);
    }
    const Problem& p0 = reqs[0];
    const int T = qs.back(), ctx = ks.back(), H = heads, V = v_dim;
    std::vector<uint16_t> q, k, kp;
    std::vector<float> ref;
    int max_q = 0;
    for (const Problem& pb : reqs) {
        q.insert(q.end(), pb.q.begin(), pb.q.end());
        k.insert(k.end(), pb.k.begin(), pb.k.begin() + pb.ctx * pb.k_st);
        kp.insert(kp.end(), pb.kp.begin(), pb.kp.begin() + pb.ctx * pb.kp_st);
        const std::vector<float> r = pb.reference(pool);
        ref.insert(ref.end(), r.begin(), r.end());
        max_q = std::max(max_q, pb.T);
    }
    k.resize(k.size() + kNanKeyRows * p0.k_st, kBf16NaN);
    kp.resize(kp.size() + kNanKeyRows * p0.kp_st, kBf16NaN);
    DeviceBuffer<uint16_t> dq(q.size()), dk(k.size()), dkp(kp.size()), out(size_t(T) * H * V);
    DeviceBuffer<int32_t> dqs(qs.size()), dks(ks.size());
    dq.upload(q), dk.upload(k), dkp.upload(kp), dqs.upload(qs), dks.upload(ks);
    MhaPrefillParams p;
    p.num_tokens = T, p.ctx_len = ctx, p.num_heads = H, p.nope = nope, p.rope = rope, p.v_dim = V;
    p.scale = p0.scale;
    p.q = dq.ptr, p.q_stride_t = p0.q_st, p.q_stride_h = p0.q_sh;
    p.k_nope = dk.ptr, p.k_stride_t = p0.k_st, p.k_stride_h = p0.k_sh;
    p.k_pe = dkp.ptr + p0.kp_off, p.k_pe_stride_t = p0.kp_st;
    p.v = dk.ptr + p0.v_off, p.v_stride_t = p0.v_st, p.v_stride_h = p0.v_sh;
    p.out = out.ptr, p.out_stride_t = int64_t(H) * V, p.out_stride_h = V;
    p.num_requests = int(chunks.size()), p.max_query_len = max_q;
    p.query_start = dqs.ptr, p.kv_start = dks.ptr;
    const MhaPrefillKernel kernel = mha_prefill_kernel_for(p);
    out.poison();
    launch_mha_prefill(launch_ctx(), p);
    FANOUT_CUDA_CHECK(cudaGetLastError());
    FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> got(size_t(T) * H * V);
    const std::vector<uint16_t> raw = out.download();
    for (size_t i = 0; i < got.size(); ++i) got[i] = bf16_to_f32(raw[i]);
    for (size_t r = 0; r < reqs.size(); ++r) {
        const size_t a = size_t(qs[r]) * H * V, b = size_t(qs[r + 1]) * H * V;
        const Comparison cmp = compare(reqs[r], std::vector<float>(got.begin() + a, got.begin() + b),
                                       std::vector<float>(ref.begin() + a, ref.begin() + b));
        const std::string what = "request " + std::to_string(r) + " of " + std::to_string(reqs.size()) + " (" +
                                 std::to_string(reqs[r].T) + " tokens after " + std::to_string(reqs[r].c.prefix) +
                                 "), kernel " + mha_prefill_kernel_name(kernel);
        EXPECT_LE(cmp.worst_row, 1e-2) << what << "\n  " << cmp.detail;
        EXPECT_LE(cmp.overall, 5e-3) << what << "\n  " << cmp.detail;
    }
}

TEST(MhaPrefillCuda, SeveralRequestsInOneLaunchMatchEachAlone) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    const std::vector<std::pair<int, int>> chunks = {{37, 0}, {200, 50}, {1, 300}, {0, 5}, {129, 127}, {64, 1000}};
    run_requests(128, 64, 128, 8, chunks, pool);  // the wgmma kernel
    run_requests(32, 16, 32, 3, chunks, pool);    // the generic kernel
}

// The comparison can fail: references whose mask is wrong differ from the true one by more than
// the tolerance — with no mask at all, and with one key too few or too many.
TEST(MhaPrefillCuda, ToleranceCatchesWrongMasks) {
    ThreadPool pool(0);
    const Problem pb({"mask self-test", 4, 128, 64, 128, 64, 1000}, 9);
    const std::vector<float> truth = pb.reference(pool);
    const size_t row = size_t(pb.H) * pb.V;

    // No mask: token i sees every key (a one-token chunk with all ctx_len keys).
    std::vector<float> no_mask(truth.size());
    for (int t = 0; t < pb.T; ++t) {
        const std::vector<float> one = pb.reference(pool, t, 1, pb.ctx);
        std::copy(one.begin(), one.end(), no_mask.begin() + t * row);
    }
    const Comparison none = compare(pb, no_mask, truth);
    EXPECT_GT(none.worst_row, 1e-2) << "a kernel without the causal mask would pass: " << none.detail;

    // One key too few: tokens 1..T−1 as a chunk over ctx_len − 1 keys sit one position earlier.
    const std::vector<float> fewer = pb.reference(pool, 1, pb.T - 1, pb.ctx - 1);
    const Comparison cmp_fewer = compare(pb, fewer, std::vector<float>(truth.begin() + row, truth.end()), 1);
    EXPECT_GT(cmp_fewer.worst_row, 1e-2) << "a mask that drops the diagonal key would pass: " << cmp_fewer.detail;

    // One key too many: tokens 0..T−2 as a chunk over all ctx_len keys sit one position later.
    const std::vector<float> more = pb.reference(pool, 0, pb.T - 1, pb.ctx);
    const Comparison cmp_more = compare(pb, more, std::vector<float>(truth.begin(), truth.end() - row));
    EXPECT_GT(cmp_more.worst_row, 1e-2) << "a mask that admits the next key would pass: " << cmp_more.detail;
    std::printf("wrong-mask distances (tolerance 1e-2 per row): none %.3g, one key fewer %.3g, one more %.3g\n",
                none.worst_row, cmp_fewer.worst_row, cmp_more.worst_row);
}

// Broken preconditions throw before anything reaches the GPU, naming the values (check_mha_prefill,
// which the launch runs first: no GPU needed).
TEST(MhaPrefillCuda, RejectsBadParams) {
    static uint16_t dummy[16];
    MhaPrefillParams good;
    good.num_tokens = 10, good.ctx_len = 20, good.num_heads = 4, good.nope = 16, good.rope = 8, good.v_dim = 16;
    good.scale = 0.1f;
    good.q = good.k_nope = good.k_pe = good.v = dummy;
    good.out = dummy;
    struct Bad {
        const char* what;  // expected in the message
        void (*edit)(MhaPrefillParams&);
    };
    const Bad bads[] = {
        {"ctx_len=5", [](MhaPrefillParams& p) { p.ctx_len = 5; }},
        {"num_tokens=-1", [](MhaPrefillParams& p) { p.num_tokens = -1; }},
        {"num_heads=0", [](MhaPrefillParams& p) { p.num_heads = 0; }},
        {"nope=0", [](MhaPrefillParams& p) { p.nope = 0; }},
        {"rope=0", [](MhaPrefillParams& p) { p.rope = 0; }},
        {"nope=1020", [](MhaPrefillParams& p) { p.nope = 1020; }},
        {"v_dim=300", [](MhaPrefillParams& p) { p.v_dim = 300; }},
        {"scale=0.0", [](MhaPrefillParams& p) { p.scale = 0.0f; }},
        {"null", [](MhaPrefillParams& p) { p.k_pe = nullptr; }},
    };
    for (const Bad& b : bads) {
        MhaPrefillParams p = good;
        b.edit(p);
        const std::string msg = fanout::testing::error_of([&] { check_mha_prefill(p, mha_prefill_kernel_for(p)); });
        EXPECT_NE(msg.find(b.what), std::string::npos) << "message does not name " << b.what << ": " << msg;
        const std::string msg2 = fanout::testing::error_of([&] { check_mha_prefill(p, MhaPrefillKernel::kGeneric); });
        EXPECT_NE(msg2.find(b.what), std::string::npos) << "message does not name " << b.what << ": " << msg2;
    }
    // The tensor-core kernels refuse widths they were not written for, naming them.
    const std::string wgmma = fanout::testing::error_of([&] { check_mha_prefill(good, MhaPrefillKernel::kWgmma); });
    EXPECT_NE(wgmma.find("nope=16"), std::string::npos) << wgmma;
    // Several requests need both offset arrays and a max_query_len.
    static int32_t offsets[3];
    const Bad bad_requests[] = {
        {"num_requests=2", [](MhaPrefillParams& p) { p.num_requests = 2; }},
        {"come together", [](MhaPrefillParams& p) { p.query_start = offsets; }},
        {"max_query_len=0", [](MhaPrefillParams& p) { p.query_start = p.kv_start = offsets, p.num_requests = 2; }},
        {"max_query_len=11",
         [](MhaPrefillParams& p) { p.query_start = p.kv_start = offsets, p.num_requests = 2, p.max_query_len = 11; }},
    };
    for (const Bad& b : bad_requests) {
        MhaPrefillParams p = good;
        b.edit(p);
        const std::string msg = fanout::testing::error_of([&] { check_mha_prefill(p, mha_prefill_kernel_for(p)); });
        EXPECT_NE(msg.find(b.what), std::string::npos) << "message does not name " << b.what << ": " << msg;
    }
    // The launch checks the same before it touches the GPU, and an empty chunk is a no-op (no
    // launch, even with null pointers) — with a GPU to make the launches' context on.
    if (!fanout::testing::have_gpu()) return;
    MhaPrefillParams bad = good;
    bad.ctx_len = 5;
    EXPECT_NE(fanout::testing::error_of([&] { launch_mha_prefill(launch_ctx(), bad); }).find("ctx_len=5"),
              std::string::npos);
    MhaPrefillParams empty = good;
    empty.num_tokens = 0;
    empty.q = nullptr, empty.out = nullptr;
    EXPECT_NO_THROW(launch_mha_prefill(launch_ctx(), empty));
}

}  // namespace
}  // namespace fanout::ops

// CUDA kernels against the CPU reference ops: random odd-shaped inputs, poisoned outputs.
// Labelled `gpu`; without a GPU each test reports itself skipped.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cuda_test_util.h"
#include "fanout/core/cuda_check.h"
#include "fanout/core/cuda_graph.h"
#include "fanout/ops/device_context.h"
#include "fanout/ops/fp8_quant.h"
#include "fanout/ops/gemm.h"
#include "fanout/ops/grouped_gemm.h"
#include "fanout/ops/grouped_gemm_cuda.h"
#include "fanout/ops/moe_permute.h"
#include "fanout/ops/moe_router.h"
#include "fanout/ops/rms_norm.h"
#include "test_util.h"

namespace fanout::ops {
namespace {

using fanout::testing::skewed_routing;

using fanout::testing::DeviceBuffer;

TEST(RmsNormCuda, MatchesCpuReference) {
    REQUIRE_GPU();
    for (auto [M, D] : {std::pair{1, 1}, {3, 7168}, {37, 1537}, {129, 576}}) {
        Tensor x = fanout::testing::random_tensor({M, D}, 41, 4.0f), w = fanout::testing::random_tensor({D}, 42);
        Tensor ref = Tensor::zeros({M, D}, DType::kF32), got = Tensor::zeros({M, D}, DType::kF32);
        rms_norm(x, w, 1e-6f, ref, Stream{});
        DeviceBuffer<float> dx(M * D), dw(D), dout(M * D);
        dx.upload(x.data_as<float>());
        dw.upload(w.data_as<float>());
        dout.poison();
        launch_rms_norm(dx.ptr, dw.ptr, 1e-6f, dout.ptr, M, D, nullptr);
        FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
        dout.download(got.data_as<float>());
        EXPECT_LT(fanout::testing::rel_error(got.data_as<float>(), ref.data_as<float>(), size_t(M * D)), 1e-6)
            << M << "x" << D;
    }
}

TEST(ActQuantCuda, MatchesCpuReferenceBitForBit) {
    REQUIRE_GPU();
    for (auto [M, K] : {std::pair{1, 1}, {5, 7168}, {33, 300}, {128, 129}}) {
        Tensor x = fanout::testing::random_tensor({M, K}, 43, 10.0f);
        const int64_t nb = ceil_div(K, kFp8Block);
        Tensor q = Tensor::zeros({M, K}, DType::kFP8E4M3), s = Tensor::zeros({M, nb}, DType::kF32);
        act_quant(x, q, s, Stream{});
        DeviceBuffer<float> dx(M * K), ds(M * nb);
        DeviceBuffer<uint8_t> dq(M * K);
        dx.upload(x.data_as<float>());
        dq.poison();
        ds.poison();
        launch_act_quant(dx.ptr, dq.ptr, ds.ptr, M, K, nullptr);
        FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<uint8_t> gq(M * K);
        std::vector<float> gs(M * nb);
        dq.download(gq.data());
        ds.download(gs.data());
        for (int64_t i = 0; i < M * nb; ++i) ASSERT_EQ(gs[i], s.data_as<float>()[i]) << "scale " << i;
        int64_t mismatches = 0;
        for (int64_t i = 0; i < M * K; ++i) mismatches += gq[i] != q.data_as<uint8_t>()[i];
        EXPECT_EQ(mismatches, 0) << M << "x" << K;
    }
}

// Random FP8 operands of one block-scaled GEMM (x [M, K], W [groups · N, K]) with their scales.
struct Fp8Operands {
    int64_t M, N, K, groups, nbk, nbn;
    std::vector<uint8_t> x, w;
    std::vector<float> sx, sw;
    Fp8Operands(int64_t m, int64_t n, int64_t k, uint64_t seed, int64_t g = 1)
        : M(m), N(n), K(k), groups(g), nbk(ceil_div(k, 128)), nbn(ceil_div(n, 128)) {
        x.resize(size_t(M * K));
        w.resize(size_t(groups * N * K));
        const auto xf = fanout::testing::random_floats(x.size(), seed, 400.0f);
        const auto wf = fanout::testing::random_floats(w.size(), seed + 1, 400.0f);
        for (size_t i = 0; i < x.size(); ++i) x[i] = f32_to_fp8e4m3(xf[i]);
        for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_fp8e4m3(wf[i]);
        sx = fanout::testing::random_floats(size_t(M * nbk), seed + 2, 0.01f);
        sw = fanout::testing::random_floats(size_t(groups * nbn * nbk), seed + 3, 0.01f);
    }
    // Reference rows [r0, r0 + rows) of x against group g's weights into ref (rows × N).
    void reference(int64_t r0, int64_t rows, int64_t g, float* ref, ThreadPool& pool) const {
        gemm_fp8_cpu(x.data() + r0 * K, sx.data() + r0 * nbk, w.data() + g * N * K, sw.data() + g * nbn * nbk, ref,
                     rows, N, K, Stream{&pool});
    }
    std::vector<float> reference_rows(int64_t r0, int64_t rows, int64_t g, ThreadPool& pool) const {
        std::vector<float> ref(size_t(rows * N));
        reference(r0, rows, g, ref.data(), pool);
        return ref;
    }
};

// A [rows, cols] matrix transposed: x's scales [M, nb] into M-major [nb, M], or back.
std::vector<float> transposed(const std::vector<float>& s, int64_t rows, int64_t cols) {
    std::vector<float> t(s.size());
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = s[size_t(r * cols + c)];
    return t;
}

// The operands on the device, x's scales in both orders: sx row-major, sx_m M-major.
struct DeviceFp8 {
    DeviceBuffer<uint8_t> x, w;
    DeviceBuffer<float> sx, sx_m, sw;
    explicit DeviceFp8(const Fp8Operands& o)
        : x(o.x.size()), w(o.w.size()), sx(o.sx.size()), sx_m(o.sx.size()), sw(o.sw.size()) {
        x.upload(o.x.data());
        w.upload(o.w.data());
        sx.upload(o.sx.data());
        sx_m.upload(transposed(o.sx, o.sx.size() / o.nbk, o.nbk).data());
        sw.upload(o.sw.data());
    }
    const float* scales(ScaleOrder order) const { return order == ScaleOrder::kRowMajor ? sx.ptr : sx_m.ptr; }
};

constexpr std::initializer_list<ScaleOrder> kBothOrders = {ScaleOrder::kRowMajor, ScaleOrder::kMMajor};
std::string order_name(ScaleOrder o) { return o == ScaleOrder::kRowMajor ? "row-major sx" : "M-major sx"; }

// bf16 results against the f32 reference: within bf16 rounding plus the tensor cores' reduced
// accumulation precision inside one 128-wide K block (DeepSeek-V3 §3.3.2: ~14 bits), and NaN or
// an unwritten (poisoned) element fails.
void expect_close_bf16(const uint16_t* got, const float* ref, size_t n, const std::string& what) {
    std::vector<float> g(n);
    double scale = 0;
    for (size_t i = 0; i < n; ++i) {
        g[i] = bf16_to_f32(got[i]);
        scale = std::max(scale, double(std::fabs(ref[i])));
    }
    EXPECT_LT(fanout::testing::rel_error(g.data(), ref, n), 5e-3) << what;
    size_t bad = 0, first = n;
    for (size_t i = 0; i < n; ++i) {
        const bool ok =
            std::isfinite(g[i]) && std::fabs(double(g[i]) - ref[i]) <= std::fabs(ref[i]) / 128.0 + 1e-3 * scale;
        if (!ok && bad++ == 0) first = i;
    }
    EXPECT_EQ(bad, 0u) << what << ": first at " << first << " got " << (first < n ? g[first] : 0.f) << " want "
                       << (first < n ? ref[first] : 0.f);
}

// The masked layout's y [E, max_m, N] (poisoned before the launch): each expert with tokens close
// to ref_of(e) (its counts[e] × N reference rows), and nothing written past any count.
void expect_masked_result(const DeviceBuffer<uint16_t>& dy, const std::vector<int32_t>& counts, int max_m, int N,
                          const std::function<std::vector<float>(int)>& ref_of, const std::string& what) {
    std::vector<uint16_t> got(counts.size() * max_m * N);
    ASSERT_EQ(dy.n, got.size()) << what << ": y is not [experts × max_m, N]";
    dy.download(got.data());
    for (int e = 0; e < static_cast<int>(counts.size()); ++e) {
        const uint16_t* g = got.data() + size_t(e) * max_m * N;
        for (size_t i = size_t(counts[e]) * N; i < size_t(max_m) * N; ++i)
            ASSERT_EQ(g[i], 0xffff) << what << ": expert " << e << " wrote past its count, element " << i;
        if (counts[e] == 0) continue;
        const std::vector<float> ref = ref_of(e);
        expect_close_bf16(g, ref.data(), ref.size(),
                          what + ": expert " + std::to_string(e) + " count " + std::to_string(counts[e]));
    }
}

// The contiguous layout's y [blocks × 128, N] (poisoned before the launch): each block close to
// o's reference rows for its expert, padding blocks (expert -1) not written.
void expect_contiguous_result(const DeviceBuffer<uint16_t>& dy, const std::vector<int32_t>& block_expert,
                              const Fp8Operands& o, ThreadPool& pool, const std::string& what) {
    const int64_t N = o.N;
    std::vector<uint16_t> got(block_expert.size() * 128 * N);
    ASSERT_EQ(dy.n, got.size()) << what << ": y is not [blocks × 128, N]";
    dy.download(got.data());
    std::vector<float> ref(size_t(128 * N));
    for (size_t b = 0; b < block_expert.size(); ++b) {
        const uint16_t* g = got.data() + b * 128 * N;
        if (block_expert[b] < 0) {
            for (size_t i = 0; i < ref.size(); ++i) ASSERT_EQ(g[i], 0xffff) << what << ": padding block " << b;
            continue;
        }
        o.reference(int64_t(b) * 128, 128, block_expert[b], ref.data(), pool);
        expect_close_bf16(g, ref.data(), ref.size(), what + ": block " + std::to_string(b));
    }
}

// One launch of a dense GEMM on the device: its name in failures, the order of x's scales it reads,
// and the launch (the operands, those scales, y, the residual or nullptr).
struct DenseLaunch {
    std::string what;
    ScaleOrder order;
    std::function<void(const DeviceFp8&, ScaleOrder, uint16_t*, const uint16_t*)> run;
};

// `run` once with x's scales in each order.
std::vector<DenseLaunch> in_both_orders(
    const std::string& what, const std::function<void(const DeviceFp8&, ScaleOrder, uint16_t*, const uint16_t*)>& run) {
    std::vector<DenseLaunch> l;
    for (ScaleOrder order : kBothOrders) l.push_back({what, order, run});
    return l;
}

// Each of `launches` of a dense GEMM of o's operands (y poisoned before each, the residual added if
// asked) against one CPU reference.
void run_dense_with(const Fp8Operands& o, bool with_residual, ThreadPool& pool,
                    const std::vector<DenseLaunch>& launches) {
    const int64_t M = o.M, N = o.N, K = o.K;
    std::vector<float> ref(size_t(M * N));
    o.reference(0, M, 0, ref.data(), pool);
    DeviceFp8 d(o);
    DeviceBuffer<uint16_t> dy(ref.size()), dres(ref.size());
    std::vector<uint16_t> res(ref.size());
    if (with_residual) {
        const auto r = fanout::testing::random_floats(ref.size(), 99, 50.0f);
        for (size_t i = 0; i < ref.size(); ++i) {
            res[i] = f32_to_bf16(r[i]);
            ref[i] += bf16_to_f32(res[i]);
        }
        dres.upload(res.data());
    }
    std::vector<uint16_t> got(ref.size());
    for (const DenseLaunch& l : launches) {
        dy.poison();
        l.run(d, l.order, dy.ptr, with_residual ? dres.ptr : nullptr);
        FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
        dy.download(got.data());
        expect_close_bf16(got.data(), ref.data(), ref.size(),
                          "M " + std::to_string(M) + " N " + std::to_string(N) + " K " + std::to_string(K) + " " +
                              l.what + (with_residual ? " +residual, " : ", ") + order_name(l.order));
    }
}

// The tile kernel's launch of `cfg` on o's operands (x's scales row-major).
DenseLaunch tile_launch(const Fp8Operands& o, GemmConfig cfg, GemmWorkspace* ws) {
    return {"block " + std::to_string(cfg.block_m) + "x" + std::to_string(cfg.block_n) + " splits " +
                std::to_string(cfg.splits) + " cluster " + std::to_string(cfg.cluster),
            ScaleOrder::kRowMajor,
            [&o, cfg, ws](const DeviceFp8& d, ScaleOrder order, uint16_t* y, const uint16_t* res) {
                launch_gemm_fp8(d.x.ptr, d.scales(order), d.w.ptr, d.sw.ptr, y, int(o.M), int(o.N), int(o.K), nullptr,
                                res, ws, cfg);
            }};
}

void run_dense(const Fp8Operands& o, GemmConfig cfg, GemmWorkspace* ws, bool with_residual, ThreadPool& pool) {
    run_dense_with(o, with_residual, pool, {tile_launch(o, cfg, ws)});
}

TEST(GemmFp8Cuda, MatchesCpuReferenceWithTheMeasuredTable) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    GemmWorkspace ws;
    // (130, 200): K not a multiple of 16 runs on the SIMT fallback; the others on wgmma. K below
    // one 128-block (32, 64, 96): the tiny models' projections.
    for (auto [N, K] : {std::pair{128, 128},
                        {130, 200},
                        {200, 144},
                        {576, 7168},
                        {2112, 512},
                        {7168, 2048},
                        {176, 256},
                        {192, 96},
                        {256, 64},
                        {64, 32}}) {
        for (int M : {1, 7, 64, 129, 1000, 4096}) {
            if (int64_t(M) * N * K > int64_t(4096) * 2112 * 512) continue;  // keep the CPU reference quick
            run_dense(Fp8Operands(M, N, K, 51 + M + N), GemmConfig{}, &ws, false, pool);
        }
    }
}

// One process driving several GPUs (the ranks of comm/local_gpus.h): the kernel's shared-memory
// limit and persistent grid are set for each device, not only for the first one a launch met —
// the devices in reverse order, so that device 0 is not the first. One GPU: device 0 alone.
TEST(GemmFp8Cuda, EveryDeviceOfOneProcess) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    fanout::testing::on_every_device_zero_last([&](int d) {
        GemmWorkspace ws;
        run_dense(Fp8Operands(129, 200, 1040, 300 + d), GemmConfig{128, 256, 3, 2}, &ws, false, pool);
        run_dense(Fp8Operands(64, 2112, 512, 310 + d), GemmConfig{}, &ws, true, pool);
    });
}

// A split-K workspace after its GEMMs: the tile counters, the ticket and the grab counter at zero,
// as the next GEMM on the stream needs them.
void expect_workspace_at_zero(const GemmWorkspace& ws, const std::string& what) {
    const size_t n = size_t(ws.num_counters);
    std::vector<int> left(n + 2, -1);
    FANOUT_CUDA_CHECK(cudaMemcpy(left.data(), ws.counters, left.size() * sizeof(int), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < left.size(); ++i)
        ASSERT_EQ(left[i], 0) << what << ": "
                              << (i < n    ? "tile counter " + std::to_string(i)
                                  : i == n ? "the ticket"
                                           : "the grab counter");
}

TEST(GemmFp8Cuda, EveryTileShapeSplitClusterAndTheResidual) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    GemmWorkspace ws;
    for (int cluster : {1, 2})
        for (int bm : {64, 128, 192})
            for (int bn : {64, 128, 192, 256})
                for (int splits : {1, 3, 8}) {
                    if (!gemm_fp8_tile_exists(bm, bn, true)) continue;  // 192 × 128, dense 128 × 192
                    const GemmConfig cfg{bm, bn, splits, cluster};
                    const uint64_t seed = 7 + bm + bn + splits + cluster;
                    // 129 rows: a partial last tile (x's box there is 8 rows, the tile's other rows hold
                    // the stage's bytes of an earlier tile and must not reach y), and with clusters a
                    // pair whose second tile is past M.
                    run_dense(Fp8Operands(129, 200, 1040, seed), cfg, &ws, splits == 3, pool);
                    // 400 rows: 192-row tiles whose last holds 16 rows (the third warpgroup's none).
                    if (bm == 192) run_dense(Fp8Operands(400, 264, 1040, seed + 3), cfg, &ws, splits == 1, pool);
                    // Fewer rows than a tile: the only tile is the last, its box 8 or 40 rows.
                    run_dense(Fp8Operands(5, 384, 768, seed + 1), cfg, &ws, false, pool);
                    run_dense(Fp8Operands(37, 256, 640, seed + 4), cfg, &ws, splits == 8, pool);
                    // N % 8 != 0: every row block stores from registers (no TMA store).
                    run_dense(Fp8Operands(70, 131, 256, seed + 2), cfg, &ws, splits == 1, pool);
                }
    // Every launch above, of its own grid, left the workspace as it found it.
    expect_workspace_at_zero(ws, "after every tile shape");
}

// CTAs with several 256-wide tiles each (the tiles after a CTA's first reuse its stages, barriers
// and, in pairs, its peer's W), one of which leaves a warpgroup idle: 7 row blocks (the last of 24
// rows, so its second warpgroup has none) × 60 column blocks (the last 192 or 187 wide), 420
// tiles; the tiles' row block runs fastest, and neither the grid's CTAs nor its pairs are a
// multiple of 7 (or of 4, the row units of pairs), so a CTA's tiles fall in different row blocks.
// Unpaired and in pairs, with and without the residual, N % 8 == 0 (TMA stores) and not (stores
// from registers); 64 × 256 tiles with one warpgroup the same way. (Written for the stores of a
// tile's second half deferred under the next tile's wgmmas, measured slower and dropped — PERF.md,
// thirty-fourth session — and kept: nothing else runs many wide tiles per CTA.)
TEST(GemmFp8Cuda, SeveralWideTilesPerCta) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    GemmWorkspace ws;
    const int M = 6 * 128 + 24, K = 256;
    for (int N : {15296, 15291}) {
        const Fp8Operands o(M, N, K, 131 + N);
        std::vector<DenseLaunch> launches;
        for (GemmConfig cfg : {GemmConfig{128, 256, 1, 1}, GemmConfig{128, 256, 1, 2}, GemmConfig{64, 256, 1, 1},
                               GemmConfig{64, 256, 1, 2}})
            launches.push_back(tile_launch(o, cfg, &ws));
        for (bool residual : {false, true}) run_dense_with(o, residual, pool, launches);
    }
}

// Runs launch(stream, 0) and launch(stream, 1) `rounds` times each on two streams at once: both
// streams wait behind a host callback until every launch is queued, so their kernels overlap.
void overlap_on_two_streams(int rounds, const std::function<void(cudaStream_t, int)>& launch) {
    cudaStream_t streams[2] = {nullptr, nullptr};
    for (cudaStream_t& s : streams) FANOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaStream_t gate = nullptr;
    cudaEvent_t open = nullptr;
    FANOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&gate, cudaStreamNonBlocking));
    FANOUT_CUDA_CHECK(cudaEventCreateWithFlags(&open, cudaEventDisableTiming));
    FANOUT_CUDA_CHECK(cudaLaunchHostFunc(
        gate, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }, nullptr));
    FANOUT_CUDA_CHECK(cudaEventRecord(open, gate));
    for (cudaStream_t s : streams) FANOUT_CUDA_CHECK(cudaStreamWaitEvent(s, open, 0));
    for (int round = 0; round < rounds; ++round)
        for (int which = 0; which < 2; ++which) launch(streams[which], which);
    FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
    for (cudaStream_t s : streams) cudaStreamDestroy(s);
    cudaStreamDestroy(gate);
    cudaEventDestroy(open);
}

// After overlap_on_two_streams: each stream's result y[i] equals `want` bit for bit, and its
// workspace ws[i] is back at zero.
void expect_each_stream(const DeviceBuffer<uint16_t> (&y)[2], const GemmWorkspace (&ws)[2],
                        const std::vector<uint16_t>& want) {
    std::vector<uint16_t> got(want.size());
    for (int i = 0; i < 2; ++i) {
        y[i].download(got.data());
        EXPECT_EQ(got, want) << "stream " << i;
        expect_workspace_at_zero(ws[i], "stream " + std::to_string(i));
    }
}

// The dense GEMM of o's operands on cfg, alone and then `rounds` times on each of two streams at
// once, each stream with its workspace: every result equals the one alone bit for bit, and the
// workspaces end at zero.
void expect_two_streams_match_alone(const Fp8Operands& o, GemmConfig cfg, int rounds) {
    const int M = int(o.M), N = int(o.N), K = int(o.K);
    DeviceFp8 d(o);
    GemmWorkspace ws[2];
    DeviceBuffer<uint16_t> alone(size_t(M) * N),
        y[2] = {DeviceBuffer<uint16_t>(size_t(M) * N), DeviceBuffer<uint16_t>(size_t(M) * N)};
    launch_gemm_fp8(d.x.ptr, d.sx.ptr, d.w.ptr, d.sw.ptr, alone.ptr, M, N, K, nullptr, nullptr, &ws[0], cfg);
    FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> want(size_t(M) * N);
    alone.download(want.data());
    overlap_on_two_streams(rounds, [&](cudaStream_t s, int i) {
        launch_gemm_fp8(d.x.ptr, d.sx.ptr, d.w.ptr, d.sw.ptr, y[i].ptr, M, N, K, s, nullptr, &ws[i], cfg);
    });
    expect_each_stream(y, ws, want);
}

// Two split-K GEMMs on two streams at once, each with its workspace, whose CTAs do not all fit on
// the GPU together (each fills ~70% of it): a tile's last split waits for its others, and the
// units are handed out in the order CTAs start, so neither waits on a split that cannot start (a
// deadlock would hang, and ctest's timeout fail, the test). Split K sums in split order, so each
// result equals the same GEMM run alone, bit for bit; the workspaces end at zero. (The hardware
// starts CTAs in index order, so the index-based units passed this too: it guards the ticket's
// hand-out and wrap under overlapping launches, not the order CUDA does not promise.)
TEST(GemmFp8Cuda, SplitGemmsOnTwoStreamsAtOnce) {
    REQUIRE_GPU();
    const int sms = fanout::ops::device_sm_count();
    const GemmConfig cfg{64, 64, 4, 1};                             // two CTAs per SM
    const int N = 64 * ((2 * sms * 7 / 10) / 4), K = 2048, M = 64;  // units = N/64 × 4
    expect_two_streams_match_alone(Fp8Operands(M, N, K, 77), cfg, 50);
}

// The masked layout's split of a last wave on two streams at once: each grid is a CTA (pair) per
// multiprocessor (pair of them), so one launch's CTAs start while the other's still hold SMs, and
// a last split waits on splits taken before it — by CTAs that were running then; a wait on one
// not yet running could hang, and ctest's timeout fail, the test. Unpaired, the two-round 3-way
// split (G/2 < R <= 2G/3), its units handed out as CTAs ask; in pairs, the one-round split
// (R <= G/2), its units placed by the ticket, with rows in both CTAs of each pair (counts of
// 129-136 rows: the peer's row block holds 1-8), so both store partials and wait as last splits.
// Four whole waves come first, so unpaired the CTAs take five units each on average and the unit
// ring (four slots) goes round. Run alone first: the result is its CPU reference, and tile 0's
// second split stored its partial (slot 1 of the NaN-filled workspace, written only when the wave
// splits 3 ways or more). Then each run on the two streams equals that one bit for bit, and the
// workspaces (the grab counter included) end at zero.
TEST(GroupedGemmFp8Cuda, MaskedLastWaveSplitsOnTwoStreamsAtOnce) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    for (const GemmConfig cfg : {GemmConfig{128, 128, 8, 1}, GemmConfig{128, 128, 8, 2}}) {
        SCOPED_TRACE("cluster " + std::to_string(cfg.cluster));
        // One tile (pair unit) per expert: 4G + R of them, R = 3G/5 unpaired and G/4 in pairs
        // (G/4 of the pairs the SMs would hold, every SM in one as on the H100 and H200: under half
        // of them, and at most 3 ways apart, 48 K blocks of 16 each).
        const bool pairs = cfg.cluster == 2;
        const int G = device_sm_count() / cfg.cluster, max_m = pairs ? 136 : 64, N = 128, K = 6144;
        const int E = 4 * G + (pairs ? G / 4 : 3 * G / 5);
        const Fp8Operands o(int64_t(E) * max_m, N, K, 113, E);
        DeviceFp8 d(o);
        std::vector<int32_t> counts(E);
        for (int e = 0; e < E; ++e) counts[e] = pairs ? 129 + (e * 41) % 8 : 1 + (e * 41) % max_m;
        DeviceBuffer<int32_t> dcounts(E);
        dcounts.upload(counts.data());
        GemmWorkspace ws[2];
        const size_t n = size_t(E) * max_m * N;
        DeviceBuffer<uint16_t> alone(n), y[2] = {DeviceBuffer<uint16_t>(n), DeviceBuffer<uint16_t>(n)};
        alone.poison();
        FANOUT_CUDA_CHECK(cudaMemset(ws[0].partials, 0xff, ws[0].partial_floats * sizeof(float)));  // NaN
        launch_grouped_gemm_fp8_masked(d.x.ptr, d.sx.ptr, dcounts.ptr, E, max_m, d.w.ptr, d.sw.ptr, N, K, alone.ptr,
                                       max_m, nullptr, &ws[0], cfg);
        FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
        expect_masked_result(
            alone, counts, max_m, N, [&](int e) { return o.reference_rows(int64_t(e) * max_m, counts[e], e, pool); },
            "alone");
        const size_t slot = size_t(cfg.block_m) * cfg.block_n;
        std::vector<float> second(slot);
        FANOUT_CUDA_CHECK(
            cudaMemcpy(second.data(), ws[0].partials + slot, slot * sizeof(float), cudaMemcpyDeviceToHost));
        EXPECT_TRUE(std::all_of(second.begin(), second.end(), [](float v) { return std::isfinite(v); }))
            << "tile 0's second split stored no partial: the last wave did not split 3 ways";
        std::vector<uint16_t> want(n);
        alone.download(want.data());
        for (DeviceBuffer<uint16_t>& yi : y) yi.poison();
        overlap_on_two_streams(20, [&](cudaStream_t s, int i) {
            launch_grouped_gemm_fp8_masked(d.x.ptr, d.sx.ptr, dcounts.ptr, E, max_m, d.w.ptr, d.sw.ptr, N, K, y[i].ptr,
                                           max_m, s, &ws[i], cfg);
        });
        expect_each_stream(y, ws, want);
    }
}

// Split K where the splits would not all fit on the GPU at once: the launch splits fewer ways (a
// tile's last split waits for the others, so each needs a CTA of its own) — 100 tiles split 8
// ways run 2-way, 528 tiles unsplit — and the result stays the GEMM's.
TEST(GemmFp8Cuda, SplitsBeyondOneWaveRunFewer) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    GemmWorkspace ws;
    run_dense(Fp8Operands(64, 6400, 1040, 91), GemmConfig{64, 64, 8, 1}, &ws, true, pool);
    run_dense(Fp8Operands(1024, 2112, 1040, 92), GemmConfig{64, 64, 8, 1}, &ws, false, pool);
    run_dense(Fp8Operands(1024, 2112, 1040, 93), GemmConfig{128, 128, 8, 2}, &ws, false, pool);
}

// Dense stream-K (GemmConfig::stream_k, the 128 × 128 and 128 × 256 tiles): the tiles past the
// whole waves are dealt out in shares of at least kMinStreamKShare K blocks, one per CTA (pair), so
// shares end and begin tiles part-way and a tile's last share adds the others'. Against the CPU
// reference: several waves and a remainder (128 × 256, 180 tiles of 17 K blocks: on 132 SMs 48
// left, in 102 shares of 8, three per tile; in 66 pairs 100 units, 34 left, shares of 9, the last
// pair's second row block past M running the pipeline and writing nothing), fewer tiles than CTAs
// (every tile shared: three 128 × 128 tiles of 64 K blocks, eight shares each), stores from
// registers (N % 8 != 0) with a short last K block, up to six shares of a tile of V3's 56 K
// blocks; with and without the residual. Then the same GEMM twice on two streams at once against
// itself alone, bit for bit (a last share waits for lower shares, handed out by the ticket in the
// order CTAs start, so neither launch waits on a CTA that cannot start), and every workspace back
// at zero. (A remainder whose shares would be whole tiles runs them whole: gemm_stream_k_test.)
TEST(GemmFp8Cuda, StreamKDealsTheLastWaveInShares) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    GemmWorkspace ws;
    auto sk = [](int bm, int bn, int cluster) {
        GemmConfig c{bm, bn, 1, cluster};
        c.stream_k = true;
        return c;
    };
    for (int cluster : {1, 2}) {
        run_dense(Fp8Operands(1100, 5000, 2080, 141 + cluster), sk(128, 256, cluster), &ws, cluster == 1, pool);
        run_dense(Fp8Operands(100, 300, 8192, 143 + cluster), sk(128, 128, cluster), &ws, cluster == 2, pool);
        run_dense(Fp8Operands(300, 1003, 3088, 145 + cluster), sk(128, 128, cluster), &ws, true, pool);
        run_dense(Fp8Operands(300, 2112, 7168, 149 + cluster), sk(128, 256, cluster), &ws, cluster == 1, pool);
    }
    expect_workspace_at_zero(ws, "after the stream-K GEMMs");

    expect_two_streams_match_alone(Fp8Operands(1100, 5000, 2080, 151), sk(128, 256, 1), 20);
}

// Stream-K with split K, on a tile it is not built for, or without a workspace for its partials,
// is refused by name.
TEST(GemmFp8Cuda, StreamKWithSplitsOnAnUnbuiltTileOrWithoutWorkspaceIsAnError) {
    REQUIRE_GPU();
    GemmWorkspace ws;
    Fp8Operands o(64, 256, 256, 153);
    DeviceFp8 d(o);
    DeviceBuffer<uint16_t> y(size_t(64) * 256);
    GemmConfig cfg{128, 256, 2, 1};
    cfg.stream_k = true;
    auto launch = [&](GemmWorkspace* w) {
        return fanout::testing::error_of([&] {
            launch_gemm_fp8(d.x.ptr, d.sx.ptr, d.w.ptr, d.sw.ptr, y.ptr, 64, 256, 256, nullptr, nullptr, w, cfg);
        });
    };
    std::string msg = launch(&ws);
    EXPECT_NE(msg.find("stream-K"), std::string::npos) << msg;
    cfg.splits = 1;
    cfg.block_m = 64;
    msg = launch(&ws);
    EXPECT_NE(msg.find("stream-K"), std::string::npos) << msg;
    cfg.block_m = 128;
    msg = launch(nullptr);
    EXPECT_NE(msg.find("GemmWorkspace"), std::string::npos) << msg;
}

TEST(TransposeScalesCuda, MatchesHostTranspose) {
    REQUIRE_GPU();
    for (auto [M, nb] : {std::pair{1, 1}, {33, 56}, {1001, 12}, {64, 144}}) {
        const auto in = fanout::testing::random_floats(size_t(M) * nb, 17 + M, 1.0f);
        DeviceBuffer<float> din(in.size()), dout(in.size());
        din.upload(in.data());
        dout.poison();
        launch_transpose_scales(din.ptr, dout.ptr, M, nb, nullptr);
        FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<float> got(in.size());
        dout.download(got.data());
        for (int m = 0; m < M; ++m)
            for (int k = 0; k < nb; ++k)
                ASSERT_EQ(got[size_t(k) * M + m], in[size_t(m) * nb + k]) << M << "x" << nb << " at " << m << "," << k;
    }
}

// cuBLASLt's block-scaled FP8 with DeepSeek's scales (x's M-major as they are, or row-major and
// transposed first) computes the same GEMM: M off 16 and 128, N with a partial 128-block (200,
// 2112, 136), the residual; shapes it cannot take are refused (false, nothing launched) and the
// DeviceContext launch then runs the tile kernel.
TEST(GemmFp8Cuda, CublasLtBlockScaledMatchesCpuReference) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    DeviceContext ctx(nullptr);
    int ran = 0;
    for (auto [M, N, K] : {std::tuple{1024, 2112, 1024},
                           {304, 200, 512},
                           {512, 7168, 2048},
                           {300, 384, 1536},
                           {1001, 136, 512},
                           {1, 256, 512}}) {
        for (bool residual : {false, true}) {
            bool lt[2] = {false, false};  // per scale order
            run_dense_with(
                Fp8Operands(M, N, K, 71 + M + N + residual), residual, pool,
                in_both_orders("cuBLASLt", [&](const DeviceFp8& d, ScaleOrder order, uint16_t* y, const uint16_t* res) {
                    const float* sx = d.scales(order);
                    bool& ran_lt = lt[order == ScaleOrder::kMMajor];
                    ran_lt = launch_gemm_fp8_cublaslt(ctx, d.x.ptr, sx, order, d.w.ptr, d.sw.ptr, y, M, N, K, res);
                    if (!ran_lt) launch_gemm_fp8(ctx, d.x.ptr, sx, order, d.w.ptr, d.sw.ptr, y, M, N, K, res);
                }));
            for (ScaleOrder order : kBothOrders) {
                const bool ran_lt = lt[order == ScaleOrder::kMMajor];
                std::printf("  M %d N %d K %d%s, %s: %s\n", M, N, K, residual ? " +residual" : "",
                            order_name(order).c_str(), ran_lt ? "cuBLASLt" : "refused by cuBLASLt, tile kernel");
                ran += ran_lt;
                if (M % 16 == 0) {
                    EXPECT_TRUE(ran_lt) << "cuBLASLt refused M " << M << " N " << N << " K " << K << ", "
                                        << order_name(order);
                }
            }
        }
    }
    EXPECT_GT(ran, 0);
    // K not a multiple of 512: W's scale rows are not cuBLASLt's layout — refused.
    DeviceBuffer<uint8_t> x(64 * 640), w(128 * 640);
    DeviceBuffer<float> s(64 * 5);
    DeviceBuffer<uint16_t> y(64 * 128);
    for (ScaleOrder order : kBothOrders)
        EXPECT_FALSE(launch_gemm_fp8_cublaslt(ctx, x.ptr, s.ptr, order, w.ptr, s.ptr, y.ptr, 64, 128, 640));
}

// The model's launch (cuBLASLt where the table says so, the tile kernel elsewhere) computes the
// GEMM with a residual at a size of each kind, x's scales in either order (the one its kernel does
// not read transposed first).
TEST(GemmFp8Cuda, DeviceContextLaunchComputesTheGemmAtBothKindsOfSize) {
    REQUIRE_GPU();
    ASSERT_FALSE(pick_gemm_config(7, 384, 512, 132, true).cublaslt);  // (the table's rows: gemm_config_test)
    ASSERT_TRUE(pick_gemm_config(600, 384, 512, 132, true).cublaslt);
    ThreadPool pool(0);
    DeviceContext ctx(nullptr);
    for (int M : {7, 600})
        run_dense_with(Fp8Operands(M, 384, 512, 91 + M), true, pool,
                       in_both_orders("DeviceContext launch",
                                      [&](const DeviceFp8& d, ScaleOrder order, uint16_t* y, const uint16_t* res) {
                                          launch_gemm_fp8(ctx, d.x.ptr, d.scales(order), order, d.w.ptr, d.sw.ptr, y, M,
                                                          384, 512, res);
                                      }));
}

TEST(GemmFp8Cuda, SplitKWithoutWorkspaceIsAnError) {
    REQUIRE_GPU();
    DeviceBuffer<uint8_t> x(64 * 256), w(128 * 256);
    DeviceBuffer<float> s(64 * 2);
    DeviceBuffer<uint16_t> y(64 * 128);
    const std::string msg = fanout::testing::error_of([&] {
        launch_gemm_fp8(x.ptr, s.ptr, w.ptr, s.ptr, y.ptr, 64, 128, 256, nullptr, nullptr, nullptr, {64, 128, 2});
    });
    EXPECT_NE(msg.find("GemmWorkspace"), std::string::npos) << msg;
}

// A tile the kernel is not built for (the n192 tile outside the dense layout, 64 × 192 anywhere)
// is refused with the list of those it has; a zero tile width, cluster or split count too.
TEST(GemmFp8Cuda, UnbuiltTileIsAnError) {
    REQUIRE_GPU();
    DeviceBuffer<uint8_t> x(128 * 256), w(2 * 192 * 256);
    DeviceBuffer<float> s(128 * 4);
    DeviceBuffer<uint16_t> y(128 * 192);
    DeviceBuffer<int32_t> counts(2);
    const std::string dense = fanout::testing::error_of([&] {
        launch_gemm_fp8(x.ptr, s.ptr, w.ptr, s.ptr, y.ptr, 64, 192, 256, nullptr, nullptr, nullptr, {64, 192, 1});
    });
    EXPECT_NE(dense.find("block_m 64 × block_n 192"), std::string::npos) << dense;
    EXPECT_NE(dense.find(gemm_fp8_tile_list(true)), std::string::npos) << dense;
    const std::string masked = fanout::testing::error_of([&] {
        launch_grouped_gemm_fp8_masked(x.ptr, s.ptr, counts.ptr, 2, 64, w.ptr, s.ptr, 192, 256, y.ptr, 64, nullptr,
                                       nullptr, {128, 192, 1});
    });
    EXPECT_NE(masked.find("(have " + gemm_fp8_tile_list(false) + ")"), std::string::npos) << masked;
    // Sizes that would divide by zero are refused before anything does.
    for (const GemmConfig& bad : {GemmConfig{64, 0, 1}, GemmConfig{64, 64, 1, 0}, GemmConfig{64, 64, 0, 1}}) {
        const std::string msg = fanout::testing::error_of(
            [&] { launch_gemm_fp8(x.ptr, s.ptr, w.ptr, s.ptr, y.ptr, 64, 192, 256, nullptr, nullptr, nullptr, bad); });
        EXPECT_NE(msg.find("gemm_fp8: "), std::string::npos) << msg;
    }
}

TEST(GroupedGemmFp8Cuda, ContiguousMatchesCpuReference) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    const int E = 5, N = 320, K = 400;
    // Experts by 128-row block, -1 padding included, some experts with several blocks, some none.
    // In cluster pairs (blocks 0-1, 2-3, ...) the first list's pairs share a W tile, take expert 0's
    // beside padding (which computes expert 0's), straddle experts 4 and 1, and end in padding
    // without a peer (skipped); the second's straddle padding and expert 2, and experts 1 and 2, and
    // end in a block without a peer; the third has a pair of padding blocks (skipped).
    for (const std::vector<int32_t>& block_expert :
         {std::vector<int32_t>{3, 3, 0, -1, 4, 4, 4, 1, -1}, std::vector<int32_t>{2, -1, 1, 1, 1, 2, 0},
          std::vector<int32_t>{1, -1, -1, -1, 0, 1}})
        for (GemmConfig cfg : {GemmConfig{}, GemmConfig{64, 64, 1}, GemmConfig{128, 64, 1}, GemmConfig{64, 256, 1},
                               GemmConfig{128, 256, 1, 1}, GemmConfig{128, 128, 1, 2}, GemmConfig{64, 128, 1, 2}}) {
            const int rows = int(block_expert.size()) * 128;
            const Fp8Operands o(rows, N, K, 71, E);
            DeviceFp8 d(o);
            DeviceBuffer<int32_t> dbe(block_expert.size());
            dbe.upload(block_expert.data());
            DeviceBuffer<uint16_t> dy(size_t(rows) * N);
            dy.poison();
            launch_grouped_gemm_fp8_contiguous(d.x.ptr, d.sx.ptr, rows, dbe.ptr, d.w.ptr, d.sw.ptr, E, N, K, dy.ptr,
                                               nullptr, cfg);
            FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
            expect_contiguous_result(dy, block_expert, o, pool,
                                     "cfg " + std::to_string(cfg.block_m) + "x" + std::to_string(cfg.block_n) +
                                         " cluster " + std::to_string(cfg.cluster));
        }
    // 192-row tiles would straddle two experts' blocks: refused before anything runs.
    const std::vector<int32_t> block_expert = {0, 1};
    const int rows = 256;
    const Fp8Operands o(rows, N, K, 71, E);
    DeviceFp8 d(o);
    DeviceBuffer<int32_t> dbe(block_expert.size());
    dbe.upload(block_expert.data());
    DeviceBuffer<uint16_t> dy(size_t(rows) * N);
    const std::string msg = fanout::testing::error_of([&] {
        launch_grouped_gemm_fp8_contiguous(d.x.ptr, d.sx.ptr, rows, dbe.ptr, d.w.ptr, d.sw.ptr, E, N, K, dy.ptr,
                                           nullptr, GemmConfig{192, 128, 1});
    });
    EXPECT_NE(msg.find("128-row expert block"), std::string::npos) << msg;
}

// Masked layout: rows past each count untouched; captured once in a CUDA graph and replayed with
// other counts (the graph never sees them).
TEST(GroupedGemmFp8Cuda, MaskedMatchesCpuReferenceAndReplaysInAGraph) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    const int E = 6, max_m = 200, N = 272, K = 528;
    const Fp8Operands o(int64_t(E) * max_m, N, K, 81, E);
    DeviceFp8 d(o);
    DeviceBuffer<int32_t> dcounts(E);
    DeviceBuffer<uint16_t> dy(size_t(E) * max_m * N);
    cudaStream_t stream;
    FANOUT_CUDA_CHECK(cudaStreamCreate(&stream));
    // The default picks without a workspace (by the expected tokens per expert: 128 × 256 at 64;
    // K = 528 is too shallow to split, so 192 × 128 at 512 and 1,024), then forced shapes: among
    // them 128 × 128 unpaired and in pairs, which the gate+up takes past 148 tokens without a
    // workspace or under one wave.
    for (auto [cfg, expected_m] : {std::pair{GemmConfig{}, 64},
                                   {GemmConfig{}, 512},
                                   {GemmConfig{}, 1024},
                                   {GemmConfig{128, 128, 1}, 512},
                                   {GemmConfig{128, 128, 1, 2}, 1024},
                                   {GemmConfig{128, 256, 1, 2}, 64},
                                   {GemmConfig{64, 64, 1}, 64},
                                   {GemmConfig{64, 256, 1, 2}, 64},
                                   {GemmConfig{192, 128, 1}, 64},
                                   {GemmConfig{192, 128, 1, 2}, 64}}) {
        const cudaGraphExec_t exec = capture_graph(stream, [&] {
            launch_grouped_gemm_fp8_masked(d.x.ptr, d.sx.ptr, dcounts.ptr, E, max_m, d.w.ptr, d.sw.ptr, N, K, dy.ptr,
                                           expected_m, stream, nullptr, cfg);
        });
        SCOPED_TRACE("config " + std::to_string(cfg.block_m) + "x" + std::to_string(cfg.block_n) + "/" +
                     std::to_string(cfg.splits) + " cluster " + std::to_string(cfg.cluster) + ", expected_m " +
                     std::to_string(expected_m));
        for (const std::vector<int32_t>& counts :
             {std::vector<int32_t>{0, 1, 200, 64, 65, 0}, std::vector<int32_t>{7, 0, 0, 129, 3, 200},
              std::vector<int32_t>{0, 0, 0, 0, 0, 0}}) {
            dcounts.upload(counts.data());
            dy.poison();
            FANOUT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
            FANOUT_CUDA_CHECK(cudaStreamSynchronize(stream));
            expect_masked_result(
                dy, counts, max_m, N, [&](int e) { return o.reference_rows(int64_t(e) * max_m, counts[e], e, pool); },
                "graph");
        }
        cudaGraphExecDestroy(exec);
    }
    cudaStreamDestroy(stream);
}

// The grouped layouts' 256-wide tiles with several tiles per CTA (see
// GemmFp8Cuda.SeveralWideTilesPerCta). Masked: 64 experts, half of them of
// 65-128 rows, half of 129-136 (a second row block of 1-8 rows, its second warpgroup idle), × 5
// column blocks, the last 64 wide: some 500 tiles. Contiguous: 40 expert blocks, padding among
// them, × 5 column blocks.
TEST(GroupedGemmFp8Cuda, SeveralWideTilesPerCta) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    const int E = 64, max_m = 136, N = 1088, K = 384;
    const Fp8Operands o(int64_t(E) * max_m, N, K, 141, E);
    DeviceFp8 d(o);
    std::vector<int32_t> counts(E);
    for (int e = 0; e < E; ++e) counts[e] = e % 2 == 0 ? 65 + (e * 37) % 64 : 129 + e % 8;
    DeviceBuffer<int32_t> dcounts(E);
    dcounts.upload(counts.data());
    DeviceBuffer<uint16_t> dy(size_t(E) * max_m * N);
    cudaStream_t stream;
    FANOUT_CUDA_CHECK(cudaStreamCreate(&stream));
    std::vector<std::vector<float>> ref(E);
    for (int e = 0; e < E; ++e) ref[e] = o.reference_rows(int64_t(e) * max_m, counts[e], e, pool);
    for (GemmConfig cfg : {GemmConfig{128, 256, 1, 1}, GemmConfig{128, 256, 1, 2}, GemmConfig{64, 256, 1, 1},
                           GemmConfig{64, 256, 1, 2}}) {
        const std::string what =
            "masked " + std::to_string(cfg.block_m) + "x256 cluster " + std::to_string(cfg.cluster);
        dy.poison();
        launch_grouped_gemm_fp8_masked(d.x.ptr, d.sx.ptr, dcounts.ptr, E, max_m, d.w.ptr, d.sw.ptr, N, K, dy.ptr, 100,
                                       stream, nullptr, cfg);
        FANOUT_CUDA_CHECK(cudaStreamSynchronize(stream));
        expect_masked_result(
            dy, counts, max_m, N, [&](int e) { return ref[e]; }, what);
    }
    cudaStreamDestroy(stream);

    std::vector<int32_t> block_expert(40);
    for (int b = 0; b < 40; ++b) block_expert[b] = b % 7 == 3 ? -1 : (b * 5) % E;
    const int rows = 40 * 128;
    DeviceBuffer<int32_t> dbe(block_expert.size());
    dbe.upload(block_expert.data());
    const Fp8Operands c(rows, N, K, 151, E);
    DeviceFp8 dc(c);
    DeviceBuffer<uint16_t> dyc(size_t(rows) * N);
    for (GemmConfig cfg : {GemmConfig{128, 256, 1, 1}, GemmConfig{128, 256, 1, 2}, GemmConfig{64, 256, 1, 1},
                           GemmConfig{64, 256, 1, 2}}) {
        dyc.poison();
        launch_grouped_gemm_fp8_contiguous(dc.x.ptr, dc.sx.ptr, rows, dbe.ptr, dc.w.ptr, dc.sw.ptr, E, N, K, dyc.ptr,
                                           nullptr, cfg);
        FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
        expect_contiguous_result(
            dyc, block_expert, c, pool,
            "contiguous " + std::to_string(cfg.block_m) + "x256 cluster " + std::to_string(cfg.cluster));
    }
}

// Split K of a last, partial wave (with a workspace): per tile config (128 × 128, 128 × 256 and the
// three-warpgroup 192 × 128), unpaired and in cluster pairs, counts whose tiles (pair units) leave
// about 1, G/4, G/2 and 3G/5 past full waves of G (the persistent grid: one CTA or pair per
// multiprocessor or two), none, and 3 past two waves. K of 49 blocks splits 3 ways where G/R allows
// (17, 17 and a shorter last 15; each split at least 16 blocks but the last), else 2; unpaired, a
// remainder of G/2 < R <= 2G/3 splits 3 ways over two rounds of the grid. Nonzero experts (one or
// two row blocks: a pair's second CTA may have no rows, and a 192-row block reads past its
// expert's 256 rows; N = 264 is 2 or 3 column tiles) are spread among zero ones. Captured in a
// graph and replayed twice: the counters, the ticket and the grab counter must come back to zero.
// At least three of the remainders must be ones that split in one round (0 < R <= G/2), and
// unpaired one in two.
TEST(GroupedGemmFp8Cuda, MaskedSplitsTheLastWaveInK) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    const int E = 96, max_m = 256, N = 264, K = 6160;
    const Fp8Operands o(int64_t(E) * max_m, N, K, 97, E);
    DeviceFp8 d(o);
    std::vector<int32_t> count_of(E);
    std::vector<std::vector<float>> ref(E);
    for (int e = 0; e < E; ++e) {
        count_of[e] = 1 + (e * 37) % max_m;
        ref[e] = o.reference_rows(int64_t(e) * max_m, count_of[e], e, pool);
    }
    DeviceBuffer<int32_t> dcounts(E);
    DeviceBuffer<uint16_t> dy(size_t(E) * max_m * N);
    GemmWorkspace ws;
    cudaStream_t stream;
    FANOUT_CUDA_CHECK(cudaStreamCreate(&stream));
    for (const GemmConfig cfg : {GemmConfig{128, 128, 8}, GemmConfig{128, 256, 8}, GemmConfig{192, 128, 8},
                                 GemmConfig{128, 128, 8, 2}, GemmConfig{128, 256, 8, 2}, GemmConfig{192, 128, 8, 2}}) {
        // The grid's units: CTAs, or pairs (every SM in one, as on the H100 and H200; the kernel
        // counts the pairs that fit, and the test's remainders are only its coverage).
        const int G = device_sm_count() / cfg.cluster, n_blocks = (N + cfg.block_n - 1) / cfg.block_n;
        int splitting = 0, two_rounds = 0;  // remainders that split in one round, in two
        const cudaGraphExec_t exec = capture_graph(stream, [&] {
            launch_grouped_gemm_fp8_masked(d.x.ptr, d.sx.ptr, dcounts.ptr, E, max_m, d.w.ptr, d.sw.ptr, N, K, dy.ptr,
                                           max_m, stream, &ws, cfg);
        });
        for (const int target : {G + 1, G + G / 4, G + G / 2, G + 3 * G / 5, G, 2 * G + 3}) {
            // Experts in a spread order until their units reach the target (or all have tokens).
            std::vector<int32_t> counts(E, 0);
            int units = 0;
            for (int i = 0; i < E && units < target; ++i) {
                const int e = (i * 5) % E;
                counts[e] = count_of[e];
                units += ((count_of[e] + cfg.block_m - 1) / cfg.block_m + cfg.cluster - 1) / cfg.cluster * n_blocks;
            }
            if (units % G > 0 && units % G <= G / 2) ++splitting;
            if (cfg.cluster == 1 && 2 * (units % G) > G && 3 * (units % G) <= 2 * G) ++two_rounds;
            SCOPED_TRACE("config " + std::to_string(cfg.block_m) + "x" + std::to_string(cfg.block_n) + "/" +
                         std::to_string(cfg.splits) + "c" + std::to_string(cfg.cluster) + ", " + std::to_string(units) +
                         " units on " + std::to_string(G));
            dcounts.upload(counts.data());
            for (int replay = 0; replay < 2; ++replay) {
                dy.poison();
                FANOUT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
                FANOUT_CUDA_CHECK(cudaStreamSynchronize(stream));
                expect_masked_result(
                    dy, counts, max_m, N, [&](int e) { return ref[e]; }, "replay " + std::to_string(replay));
            }
        }
        EXPECT_GE(splitting, 3) << cfg.block_m << "x" << cfg.block_n << "c" << cfg.cluster << " on " << G;
        EXPECT_GE(two_rounds, cfg.cluster == 1 ? 1 : 0) << cfg.block_m << "x" << cfg.block_n << " on " << G;
        expect_workspace_at_zero(
            ws, std::to_string(cfg.block_m) + "x" + std::to_string(cfg.block_n) + "c" + std::to_string(cfg.cluster));
        cudaGraphExecDestroy(exec);
    }
    // A split cap without a workspace is refused (the default drops its cap instead).
    const std::string no_ws = fanout::testing::error_of([&] {
        launch_grouped_gemm_fp8_masked(d.x.ptr, d.sx.ptr, dcounts.ptr, E, max_m, d.w.ptr, d.sw.ptr, N, K, dy.ptr, max_m,
                                       stream, nullptr, GemmConfig{128, 128, 8, 2});
    });
    EXPECT_NE(no_ws.find("split K needs a GemmWorkspace"), std::string::npos) << no_ws;
    cudaStreamDestroy(stream);
}

// A dense split-K GEMM, a masked GEMM whose last wave splits, and the dense one again, on one
// workspace in one graph (as a layer's o_proj and gate+up share the device context's): grids of
// different sizes take their units from the workspace's counters (the ticket; unpaired masked
// split kernels the grab counter), which each launch must leave at zero, or the next one's CTAs
// start at the wrong units. The masked tiles are 3 past whole waves (K of 49
// blocks: 3-way splits), unpaired and in pairs. Replayed twice: every result is its reference
// and the workspace is back at zero.
TEST(GroupedGemmFp8Cuda, MaskedSplitAfterDenseSplitOnOneWorkspace) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    const Fp8Operands dense(64, 640, 2048, 101);  // 64 × 64 tiles in 4 splits: 40 units
    const GemmConfig dense_cfg{64, 64, 4, 1};
    const std::vector<float> dense_ref = dense.reference_rows(0, dense.M, 0, pool);
    DeviceFp8 dd(dense);
    const int max_m = 256, N = 384, K = 6160;  // 3 column tiles per expert
    GemmWorkspace ws;
    cudaStream_t stream;
    FANOUT_CUDA_CHECK(cudaStreamCreate(&stream));
    for (const GemmConfig cfg : {GemmConfig{128, 128, 8}, GemmConfig{128, 128, 8, 2}}) {
        // One unit per expert and column tile: unpaired, counts of one row block; in pairs, of one
        // or two (a pair's second CTA with rows, or none). 3E units: 1 to 3 past the waves.
        const int G = device_sm_count() / cfg.cluster, E = G / 3 + 1;
        SCOPED_TRACE("cluster " + std::to_string(cfg.cluster) + ", " + std::to_string(3 * E) + " units on " +
                     std::to_string(G));
        const Fp8Operands o(int64_t(E) * max_m, N, K, 103, E);
        DeviceFp8 d(o);
        std::vector<int32_t> counts(E);
        for (int e = 0; e < E; ++e) counts[e] = 1 + (e * 53) % (cfg.cluster * 128);
        DeviceBuffer<int32_t> dcounts(E);
        dcounts.upload(counts.data());
        DeviceBuffer<uint16_t> dy(size_t(E) * max_m * N), y1(dense_ref.size()), y2(dense_ref.size());
        const cudaGraphExec_t exec = capture_graph(stream, [&] {
            launch_gemm_fp8(dd.x.ptr, dd.sx.ptr, dd.w.ptr, dd.sw.ptr, y1.ptr, int(dense.M), int(dense.N), int(dense.K),
                            stream, nullptr, &ws, dense_cfg);
            launch_grouped_gemm_fp8_masked(d.x.ptr, d.sx.ptr, dcounts.ptr, E, max_m, d.w.ptr, d.sw.ptr, N, K, dy.ptr,
                                           max_m, stream, &ws, cfg);
            launch_gemm_fp8(dd.x.ptr, dd.sx.ptr, dd.w.ptr, dd.sw.ptr, y2.ptr, int(dense.M), int(dense.N), int(dense.K),
                            stream, nullptr, &ws, dense_cfg);
        });
        for (int replay = 0; replay < 2; ++replay) {
            const std::string what = "replay " + std::to_string(replay);
            dy.poison();
            y1.poison();
            y2.poison();
            FANOUT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
            FANOUT_CUDA_CHECK(cudaStreamSynchronize(stream));
            expect_masked_result(
                dy, counts, max_m, N, [&](int e) { return o.reference_rows(int64_t(e) * max_m, counts[e], e, pool); },
                what);
            for (const DeviceBuffer<uint16_t>* y : {&y1, &y2}) {
                std::vector<uint16_t> got(dense_ref.size());
                y->download(got.data());
                expect_close_bf16(got.data(), dense_ref.data(), got.size(),
                                  what + (y == &y1 ? ", dense before" : ", dense after"));
            }
            expect_workspace_at_zero(ws, what);
        }
        cudaGraphExecDestroy(exec);
    }
    cudaStreamDestroy(stream);
}

// The small widths of tiny models and per-head batched GEMMs: K below one 128-block (32, 64, 96)
// and N below one tile — k_b (N = kv_lora, K = nope), v_b (N = v, K = kv_lora), expert down. Groups
// of fewer than 128 rows, with the default (one CTA per tile) and in cluster pairs, whose second
// CTA's x box lies past the last expert's rows, wholly or in part (TMA fills zeros there; nothing
// of it may be stored).
TEST(GroupedGemmFp8Cuda, MaskedSmallWidths) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    for (const GemmConfig cfg : {GemmConfig{}, GemmConfig{128, 128, 1, 2}})
        for (auto [E, max_m, N, K] :
             {std::tuple{4, 70, 64, 32}, {4, 70, 32, 64}, {16, 9, 256, 96}, {16, 9, 192, 256}}) {
            SCOPED_TRACE("cluster " + std::to_string(cfg.cluster));
            const Fp8Operands o(int64_t(E) * max_m, N, K, 91 + K, E);
            DeviceFp8 d(o);
            std::vector<int32_t> counts;
            for (int e = 0; e < E; ++e) counts.push_back((e * 37 + 5) % (max_m + 1));
            DeviceBuffer<int32_t> dcounts(E);
            dcounts.upload(counts.data());
            DeviceBuffer<uint16_t> dy(size_t(E) * max_m * N);
            dy.poison();
            launch_grouped_gemm_fp8_masked(d.x.ptr, d.sx.ptr, dcounts.ptr, E, max_m, d.w.ptr, d.sw.ptr, N, K, dy.ptr,
                                           max_m, nullptr, nullptr, cfg);
            FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
            expect_masked_result(
                dy, counts, max_m, N, [&](int e) { return o.reference_rows(int64_t(e) * max_m, counts[e], e, pool); },
                "N " + std::to_string(N) + " K " + std::to_string(K));
        }
}

// silu·mul·quant on the device against the CPU reference over E groups of max_m rows, the first
// counts[e] of group e done and the rest left poisoned; `launch` runs the device kernel on the
// device gate_up, q and scales.
void check_silu_mul_quant(int E, int max_m, const std::vector<int32_t>& counts, int I,
                          const std::function<void(const uint16_t*, uint8_t*, float*)>& launch) {
    const auto v = fanout::testing::random_floats(size_t(E) * max_m * 2 * I, 91, 6.0f);
    std::vector<uint16_t> gu(v.size());
    Tensor gate_up = Tensor::zeros({E, max_m, 2 * I}, DType::kF32);
    for (size_t i = 0; i < v.size(); ++i) {
        gu[i] = f32_to_bf16(v[i]);
        gate_up.data_as<float>()[i] = bf16_to_f32(gu[i]);
    }
    const int64_t nb = ceil_div(I, 128);
    Tensor q = Tensor::zeros({E, max_m, I}, DType::kFP8E4M3), s = Tensor::zeros({E, max_m, nb}, DType::kF32);
    silu_mul_quant_masked(gate_up, counts, q, s, Stream{});
    DeviceBuffer<uint16_t> dgu(gu.size());
    DeviceBuffer<uint8_t> dq(size_t(E) * max_m * I);
    DeviceBuffer<float> ds(size_t(E) * max_m * nb);
    dgu.upload(gu.data());
    dq.poison();
    ds.poison();
    launch(dgu.ptr, dq.ptr, ds.ptr);
    FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint8_t> gq(dq.n);
    std::vector<float> gs(ds.n);
    dq.download(gq.data());
    ds.download(gs.data());
    int64_t checked = 0, want_checked = 0;
    for (int e = 0; e < E; ++e) {
        want_checked += int64_t(counts[e]) * I;
        for (int r = 0; r < max_m; ++r) {
            const size_t row = size_t(e) * max_m + r;
            for (int64_t b = 0; b < nb; ++b) {
                const float want = s.data_as<float>()[row * nb + b], have = gs[row * nb + b];
                if (r >= counts[e]) {
                    ASSERT_TRUE(std::isnan(have)) << "wrote past count: group " << e << " row " << r;
                    continue;
                }
                ASSERT_NEAR(have, want, 1e-6 * want) << "scale e " << e << " r " << r << " b " << b;
            }
            if (r >= counts[e]) continue;
            // Dequantized values within one e4m3 step (expf may differ in the last ulp).
            for (int i = 0; i < I; ++i) {
                const float sc = s.data_as<float>()[row * nb + i / 128];
                const float a = fp8e4m3_to_f32(gq[row * I + i]) * sc;
                const float b = fp8e4m3_to_f32(q.data_as<uint8_t>()[row * I + i]) * sc;
                ASSERT_LE(std::fabs(a - b), std::fabs(b) / 8 + 1e-6f) << "e " << e << " r " << r << " i " << i;
                ++checked;
            }
        }
    }
    EXPECT_EQ(checked, want_checked);
}

// A block per slot (no bound), then a block per stored row found from the counts' prefix: with
// the exact bound (43 rows) and a looser one; then 300 experts (the prefix in two rounds of 256).
TEST(SiluMulQuantCuda, MaskedMatchesCpuReference) {
    REQUIRE_GPU();
    for (const int I : {300, 2048 + 8})  // the scalar path, then the 16-byte one with a partial block
        for (const int64_t max_rows : {0, 43, 100}) {
            SCOPED_TRACE("I " + std::to_string(I) + ", row bound " + std::to_string(max_rows));
            const int E = 4, max_m = 37;
            const std::vector<int32_t> counts = {0, 37, 5, 1};
            check_silu_mul_quant(E, max_m, counts, I, [&](const uint16_t* gu, uint8_t* q, float* s) {
                DeviceBuffer<int32_t> dc(counts);
                launch_silu_mul_quant_masked(gu, dc.ptr, E, max_m, I, q, s, ScaleOrder::kRowMajor, nullptr, max_rows);
                FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
            });
        }
    std::mt19937 rng(3);
    std::vector<int32_t> counts(300);
    for (auto& c : counts) c = int32_t(rng() % 4);  // 0 .. max_m
    counts[299] = 3;                                // the last expert's rows come last
    int64_t stored = 0;
    for (int32_t c : counts) stored += c;
    check_silu_mul_quant(300, 3, counts, 256, [&](const uint16_t* gu, uint8_t* q, float* s) {
        DeviceBuffer<int32_t> dc(counts);
        launch_silu_mul_quant_masked(gu, dc.ptr, 300, 3, 256, q, s, ScaleOrder::kRowMajor, nullptr, stored);
        FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
    });
}

// One group (the shared experts' MLP) with M-major scales: the same values, each scale at
// [block][row]; rows past the count untouched. M-major over several groups is refused.
TEST(SiluMulQuantCuda, OneGroupWritesMMajorScales) {
    REQUIRE_GPU();
    const int max_m = 37, I = 2048 + 8;
    const int64_t nb = ceil_div(I, 128);
    const std::vector<int32_t> counts = {29};
    check_silu_mul_quant(1, max_m, counts, I, [&](const uint16_t* gu, uint8_t* q, float* s) {
        DeviceBuffer<int32_t> dc(counts);
        DeviceBuffer<float> sm(size_t(max_m) * nb);
        sm.poison();
        launch_silu_mul_quant_masked(gu, dc.ptr, 1, max_m, I, q, sm.ptr, ScaleOrder::kMMajor, nullptr);
        FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> rows = transposed(sm.download(), nb, max_m);  // back to [row][block]
        FANOUT_CUDA_CHECK(cudaMemcpy(s, rows.data(), rows.size() * sizeof(float), cudaMemcpyHostToDevice));
    });
    DeviceBuffer<uint16_t> gu(size_t(2) * 4 * 2 * I);
    DeviceBuffer<uint8_t> q(size_t(2) * 4 * I);
    DeviceBuffer<float> sc(size_t(2) * 4 * nb);
    DeviceBuffer<int32_t> dc(std::vector<int32_t>{1, 1});
    const std::string msg = fanout::testing::error_of(
        [&] { launch_silu_mul_quant_masked(gu.ptr, dc.ptr, 2, 4, I, q.ptr, sc.ptr, ScaleOrder::kMMajor, nullptr); });
    EXPECT_NE(msg.find("M-major scales for one group only"), std::string::npos) << msg;
}

// The contiguous layout's rows: every row of a block with an expert (its padding too), none of a
// -1 block — as the masked reference with each 128-row block a group of count 128 or 0.
TEST(SiluMulQuantCuda, ContiguousSkipsUnusedBlocks) {
    REQUIRE_GPU();
    const std::vector<int32_t> block_expert = {2, -1, 0, 0, -1};
    std::vector<int32_t> counts;
    for (int32_t e : block_expert) counts.push_back(e >= 0 ? 128 : 0);
    for (const int I : {300, 2048 + 8}) {
        check_silu_mul_quant(int(block_expert.size()), 128, counts, I, [&](const uint16_t* gu, uint8_t* q, float* s) {
            DeviceBuffer<int32_t> dbe(block_expert);
            launch_silu_mul_quant_contiguous(gu, dbe.ptr, int(block_expert.size()) * 128, I, q, s, nullptr);
            FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
        });
    }
}

TEST(ActQuantCuda, Bf16InputMatchesCpuReferenceBitForBit) {
    REQUIRE_GPU();
    const int M = 9, K = 7168 + 40;
    const auto v = fanout::testing::random_floats(size_t(M) * K, 101, 30.0f);
    std::vector<uint16_t> xb(v.size());
    Tensor x = Tensor::zeros({M, K}, DType::kF32);
    for (size_t i = 0; i < v.size(); ++i) {
        xb[i] = f32_to_bf16(v[i]);
        x.data_as<float>()[i] = bf16_to_f32(xb[i]);
    }
    const int64_t nb = ceil_div(K, kFp8Block);
    Tensor q = Tensor::zeros({M, K}, DType::kFP8E4M3), s = Tensor::zeros({M, nb}, DType::kF32);
    act_quant(x, q, s, Stream{});
    DeviceBuffer<uint16_t> dx(xb.size());
    DeviceBuffer<uint8_t> dq(size_t(M) * K);
    DeviceBuffer<float> ds(size_t(M * nb));
    dx.upload(xb.data());
    for (ScaleOrder order : kBothOrders) {
        dq.poison();
        ds.poison();
        launch_act_quant_bf16(dx.ptr, dq.ptr, ds.ptr, order, M, K, nullptr);
        FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<uint8_t> gq(dq.n);
        std::vector<float> gs(ds.n);
        dq.download(gq.data());
        ds.download(gs.data());
        for (int64_t m = 0; m < M; ++m)
            for (int64_t b = 0; b < nb; ++b) {
                const int64_t at = order == ScaleOrder::kRowMajor ? m * nb + b : b * M + m;  // [M][nb] or [nb][M]
                ASSERT_EQ(gs[size_t(at)], s.data_as<float>()[m * nb + b])
                    << order_name(order) << " scale " << m << "," << b;
            }
        for (size_t i = 0; i < gq.size(); ++i) ASSERT_EQ(gq[i], q.data_as<uint8_t>()[i]) << "value " << i;
    }
}

TEST(GemmBf16Cuda, MatchesDoublePrecisionReference) {
    REQUIRE_GPU();
    // The last: few output tiles down a long K, onto the residual.
    for (auto [M, N, K] : {std::tuple{1, 576, 7168}, {33, 130, 200}, {257, 1024, 512}, {40, 200, 7168}}) {
        const auto xf = fanout::testing::random_floats(size_t(M) * K, 111, 1.0f);
        const auto wf = fanout::testing::random_floats(size_t(N) * K, 112, 0.05f);
        const auto rf = fanout::testing::random_floats(size_t(M) * N, 113, 1.0f);
        std::vector<uint16_t> x(xf.size()), w(wf.size()), r(rf.size());
        for (size_t i = 0; i < x.size(); ++i) x[i] = f32_to_bf16(xf[i]);
        for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(wf[i]);
        for (size_t i = 0; i < r.size(); ++i) r[i] = f32_to_bf16(rf[i]);
        std::vector<float> ref(size_t(M) * N);
        for (int m = 0; m < M; ++m)
            for (int n = 0; n < N; ++n) {
                double acc = bf16_to_f32(r[size_t(m) * N + n]);
                for (int k = 0; k < K; ++k)
                    acc += double(bf16_to_f32(x[size_t(m) * K + k])) * bf16_to_f32(w[size_t(n) * K + k]);
                ref[size_t(m) * N + n] = float(acc);
            }
        DeviceBuffer<uint16_t> dx(x.size()), dw(w.size()), dr(r.size()), dy(ref.size());
        dx.upload(x.data());
        dw.upload(w.data());
        dr.upload(r.data());
        dy.poison();
        DeviceContext ctx(nullptr);  // the default stream: the copies around it are synchronous
        launch_gemm_bf16(ctx, dx.ptr, dw.ptr, dy.ptr, M, N, K, dr.ptr);
        FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<uint16_t> got(ref.size());
        dy.download(got.data());
        std::vector<float> g(got.size());
        for (size_t i = 0; i < g.size(); ++i) g[i] = bf16_to_f32(got[i]);
        EXPECT_LT(fanout::testing::rel_error(g.data(), ref.data(), ref.size()), 5e-3) << M << "x" << N << "x" << K;
    }
}

// DeepSeek-V3's grouped routing with a bias, and Mixtral's (one group, no bias), token by token
// against the CPU reference: the same experts in the same order, weights to float rounding.
TEST(MoeRouteCuda, MatchesCpuReference) {
    REQUIRE_GPU();
    const RouterParams v3{256, 8, 8, 4, true, 2.5f}, mixtral{8, 2, 1, 1, true, 1.0f}, odd{96, 6, 3, 2, false, 1.0f};
    const RouterParams small_groups{40, 3, 8, 3, true, 1.5f},
        singletons{12, 2, 12, 6, true, 1.0f};  // 5 and 1 per group
    for (const RouterParams& p : {v3, mixtral, odd, small_groups, singletons}) {
        for (int T : {1, 37, 300}) {
            const int E = p.num_experts, K = p.top_k;
            Tensor logits = fanout::testing::random_tensor({T, E}, 120 + T + E, 4.0f);
            const auto bias = fanout::testing::random_floats(size_t(E), 121 + E, 0.5f);
            const bool with_bias = p.n_group > 1;  // singletons: every group score is -inf, the first groups kept
            Tensor idx = Tensor::zeros({T, K}, DType::kI32), wt = Tensor::zeros({T, K}, DType::kF32);
            moe_route(logits, with_bias ? bias.data() : nullptr, p, idx, wt, Stream{});
            DeviceBuffer<float> dl(size_t(T) * E), db{size_t(E)}, dw(size_t(T) * K);
            DeviceBuffer<int> di(size_t(T) * K);
            dl.upload(logits.data_as<float>());
            db.upload(bias.data());
            di.poison();
            dw.poison();
            launch_moe_route(dl.ptr, with_bias ? db.ptr : nullptr, p, T, di.ptr, dw.ptr, nullptr);
            FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
            std::vector<int> gi(di.n);
            std::vector<float> gw(dw.n);
            di.download(gi.data());
            dw.download(gw.data());
            for (size_t i = 0; i < gi.size(); ++i) {
                ASSERT_EQ(gi[i], idx.data_as<int32_t>()[i]) << "E " << E << " T " << T << " entry " << i;
                ASSERT_NEAR(gw[i], wt.data_as<float>()[i], 1e-5f * std::fabs(wt.data_as<float>()[i]) + 1e-7f)
                    << "E " << E << " T " << T << " entry " << i;
            }
        }
    }
}

TEST(MoeRouteCuda, RejectsWhatItCannotRoute) {
    REQUIRE_GPU();
    const std::string msg = fanout::testing::error_of([] {
        launch_moe_route(nullptr, nullptr, RouterParams{1024, 8, 8, 4, true, 1.0f}, 1, nullptr, nullptr, nullptr);
    });
    EXPECT_NE(msg.find("experts=1024"), std::string::npos) << msg;
}

// The fused residual add + RMSNorm on bf16 rows against a double-precision reference: widths
// one value at a time and 8 to a thread, one slot per thread and two (past 8,192 columns).
TEST(RmsNormBf16Cuda, MatchesReferenceWithAndWithoutResidual) {
    REQUIRE_GPU();
    for (auto [M, D] : {std::pair{1, 1}, {5, 7}, {33, 576}, {3, 7168}, {2, 9002}, {3, 16384}}) {
        for (bool with_residual : {false, true}) {
            const auto xf = fanout::testing::random_floats(size_t(M) * D, 130 + D, 3.0f);
            const auto rf = fanout::testing::random_floats(size_t(M) * D, 131 + D, 3.0f);
            const auto w = fanout::testing::random_floats(size_t(D), 132 + D, 1.5f);
            std::vector<uint16_t> x(xf.size()), r(rf.size());
            for (size_t i = 0; i < x.size(); ++i) x[i] = f32_to_bf16(xf[i]), r[i] = f32_to_bf16(rf[i]);
            std::vector<float> want_y(x.size()), want_r(x.size());
            for (int m = 0; m < M; ++m) {
                double ss = 0;
                for (int d = 0; d < D; ++d) {
                    const size_t i = size_t(m) * D + d;
                    const float z = bf16_to_f32(x[i]) + (with_residual ? bf16_to_f32(r[i]) : 0.0f);
                    want_r[i] = z;
                    ss += double(z) * z;
                }
                const double inv = 1.0 / std::sqrt(ss / D + 1e-6);
                for (int d = 0; d < D; ++d) {
                    const size_t i = size_t(m) * D + d;
                    want_y[i] = float(want_r[i] * inv * w[d]);
                }
            }
            DeviceBuffer<uint16_t> dx(x.size()), dr(r.size()), dy(x.size());
            DeviceBuffer<float> dw(w.size());
            dx.upload(x.data());
            dr.upload(r.data());
            dw.upload(w.data());
            dy.poison();
            launch_rms_norm_bf16(dx.ptr, with_residual ? dr.ptr : nullptr, dw.ptr, 1e-6f, dy.ptr, M, D, nullptr);
            FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
            std::vector<uint16_t> gy(x.size()), gr(r.size());
            dy.download(gy.data());
            dr.download(gr.data());
            for (size_t i = 0; i < gy.size(); ++i) {
                const float y = bf16_to_f32(gy[i]);
                ASSERT_NEAR(y, want_y[i], std::fabs(want_y[i]) / 128 + 1e-6f) << M << "x" << D << " y " << i;
                const float res = bf16_to_f32(gr[i]);
                const float want = with_residual ? round_to_bf16(want_r[i]) : bf16_to_f32(r[i]);
                ASSERT_EQ(res, want) << M << "x" << D << " residual " << i;
            }
        }
    }
}

// The index of the first element whose bits differ, -1 when none (a failing EXPECT_EQ would
// print vectors of millions of elements).
template <typename T>
int64_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
    if (a.size() != b.size()) return 0;
    for (size_t i = 0; i < a.size(); ++i)
        if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return int64_t(i);
    return -1;
}

// Permute into the capped masked + spill layout and un-permute, against the CPU reference: rows,
// scales, counts, spill blocks and slots bit for bit (stable order, spills past the cap, padding
// and rows past a count untouched, non-local experts), on skewed routings of odd shapes; the
// combine to one bf16 rounding.
TEST(MoePermuteCuda, MatchesCpuReference) {
    REQUIRE_GPU();
    struct Case {
        int T, K, D, E, begin, local, cap;
        double skew;
        bool spills;
    };
    const int decode_cap = int(moe_masked_cap(300, 8, 64)), big_cap = int(moe_masked_cap(5000, 8, 64));
    const Case cases[] = {
        {37, 8, 7168, 64, 0, 32, 6, 1.5, true},            // capped, hot experts spill; 16-byte rows
        {300, 8, 2048, 64, 0, 32, decode_cap, 1.5, true},  // the decode cap
        {5, 2, 200, 64, 16, 32, 3, 0.0, false},            // rows not a multiple of 16: byte copies
        {129, 4, 130, 16, 4, 9, 0, 1.0, true},             // cap 0: all contiguous
        {77, 6, 7168, 64, 0, 64, 77, 1.5, false},          // cap = T: all masked, no spill region
        {1, 8, 7168, 256, 0, 256, 1, 0.0, false},          // one decode token, 256 local experts
        {5000, 8, 1040, 64, 0, 32, 0, 1.2, true},          // T·K = 40000: many rank passes
        {5000, 8, 1040, 64, 0, 48, big_cap, 1.2, true},    // ... capped
        {300, 3, 2064, 600, 50, 300, 2, 0.7, true},        // more local experts than threads in a block
    };
    for (const Case& c : cases) {
        const int nb = int(ceil_div(c.D, 128)), spill_rows = int(moe_spill_rows(c.T, c.K, c.local, c.cap));
        const size_t rows = size_t(c.local) * c.cap + spill_rows;
        const std::string what = "T " + std::to_string(c.T) + " K " + std::to_string(c.K) + " D " +
                                 std::to_string(c.D) + " local " + std::to_string(c.local) + " cap " +
                                 std::to_string(c.cap);
        const auto idx = skewed_routing(c.T, c.K, c.E, 140 + c.T, c.skew);
        std::mt19937 rng(c.T);
        std::vector<uint8_t> x(size_t(c.T) * c.D);
        for (auto& v : x) v = uint8_t(rng() % 0x7e);
        const auto sx = fanout::testing::random_floats(size_t(c.T) * nb, 141, 1.0f);
        std::vector<uint8_t> ox(rows * c.D, 0xee);
        std::vector<float> os(rows * nb, -1.0f);
        std::vector<int32_t> counts(c.local), blocks(spill_rows / 128), slot(idx.size());
        moe_permute_cpu(x.data(), sx.data(), idx.data(), c.T, c.K, c.D, c.begin, c.local, c.cap, spill_rows, ox.data(),
                        os.data(), counts.data(), blocks.data(), slot.data());
        int64_t spilled = 0;
        for (int32_t r : slot) spilled += r >= int64_t(c.local) * c.cap;
        EXPECT_EQ(spilled > 0, c.spills) << what << ": " << spilled << " choices spilled";
        DeviceBuffer<uint8_t> dx(x), dox(ox);  // the outputs start as the reference's poison
        DeviceBuffer<float> dsx(sx), dos(os);
        DeviceBuffer<int32_t> didx(idx), dcounts(counts.size()), dblocks(blocks.size()), dslot(slot.size());
        dcounts.poison();
        dblocks.poison();
        dslot.poison();
        launch_moe_permute(dx.ptr, dsx.ptr, didx.ptr, c.T, c.K, c.D, c.begin, c.local, c.cap, spill_rows, dox.ptr,
                           dos.ptr, dcounts.ptr, dblocks.ptr, dslot.ptr, nullptr);
        FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_EQ(first_difference(dcounts.download(), counts), -1) << what << ": counts";
        if (!blocks.empty()) {  // (no download of nothing)
            EXPECT_EQ(first_difference(dblocks.download(), blocks), -1) << what << ": spill_block_expert";
        }
        EXPECT_EQ(first_difference(dslot.download(), slot), -1) << what << ": slot";
        EXPECT_EQ(first_difference(dox.download(), ox), -1) << what << ": rows";
        EXPECT_EQ(first_difference(dos.download(), os), -1) << what << ": scales";

        // Combine: expert outputs y for every row, weights, and a base (the shared expert).
        const auto yf = fanout::testing::random_floats(rows * c.D, 142, 2.0f);
        const auto bf = fanout::testing::random_floats(size_t(c.T) * c.D, 143, 2.0f);
        const auto w = fanout::testing::random_floats(idx.size(), 144, 1.0f);
        std::vector<uint16_t> y(yf.size()), base(bf.size()), want(bf.size());
        for (size_t i = 0; i < y.size(); ++i) y[i] = f32_to_bf16(yf[i]);
        for (size_t i = 0; i < base.size(); ++i) base[i] = f32_to_bf16(bf[i]);
        moe_unpermute_cpu(y.data(), slot.data(), w.data(), c.T, c.K, c.D, base.data(), want.data());
        DeviceBuffer<uint16_t> dy(y), dbase(base);
        DeviceBuffer<float> dw(w);
        launch_moe_unpermute(dy.ptr, dslot.ptr, dw.ptr, c.T, c.K, c.D, dbase.ptr, dbase.ptr, nullptr);  // in place
        FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = dbase.download();
        for (size_t i = 0; i < got.size(); ++i) {
            const float a = bf16_to_f32(got[i]), b = bf16_to_f32(want[i]);
            ASSERT_LE(std::fabs(a - b), std::fabs(b) / 128 + 1e-5f) << what << " element " << i;
        }
    }
}

// A spill region below moe_spill_rows is refused before anything runs.
TEST(MoePermuteCuda, RefusesASpillRegionTooSmall) {
    REQUIRE_GPU();
    DeviceBuffer<int32_t> p(16);
    const std::string msg = fanout::testing::error_of([&] {
        launch_moe_permute(nullptr, nullptr, p.ptr, 4, 2, 128, 0, 2, 1, 0, nullptr, nullptr, p.ptr, p.ptr, p.ptr,
                           nullptr);
    });
    EXPECT_NE(msg.find("spill_rows 0"), std::string::npos) << msg;
}

// The routed experts of one MoE layer composed from the kernels above, as the GPU model runs
// them: quantize x → permute → grouped gate+up (one GEMM, [gate; up] rows) → silu·mul·quant →
// grouped down → weighted un-permute onto a base — the masked kernels over the capped part, the
// contiguous ones over the spill region — for the pure masked layout, a cap the hot experts
// overflow, and cap 0 (all contiguous). Against the same chain on the CPU references (bf16
// rounding where the GPU stores bf16); FP8 requantization of h can flip a value by one e4m3 step,
// so the bound is on the relative error of the whole output. Every device buffer starts poisoned
// (NaN in fp8, bf16 and f32), so a row no choice names that leaked into the output would show.
TEST(MoeExpertsCuda, ComposedChainMatchesCpuChain) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    const int T = 50, D = 384, I = 256, E = 16, K = 4;
    const int nbd = D / 128, nbi = I / 128;
    // Routing: K distinct experts per token, skewed (expert 0 in nearly every token), random weights.
    const auto idx = skewed_routing(T, K, E, 150, 1.0);
    const auto wts = fanout::testing::random_floats(idx.size(), 151, 1.0f);
    const Fp8Operands w13(1, 2 * I, D, 152, E), w2(1, D, I, 153, E);  // only their w / sw are used
    const auto xf = fanout::testing::random_floats(size_t(T) * D, 154, 3.0f);
    const auto bf = fanout::testing::random_floats(size_t(T) * D, 155, 1.0f);
    std::vector<uint16_t> x(xf.size()), base(bf.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = f32_to_bf16(xf[i]), base[i] = f32_to_bf16(bf[i]);

    // CPU chain.
    Tensor xt = Tensor::zeros({T, D}, DType::kF32), xq = Tensor::zeros({T, D}, DType::kFP8E4M3),
           xs = Tensor::zeros({T, nbd}, DType::kF32);
    for (size_t i = 0; i < x.size(); ++i) xt.data_as<float>()[i] = bf16_to_f32(x[i]);
    act_quant(xt, xq, xs, Stream{});
    std::vector<float> want(size_t(T) * D);
    for (size_t i = 0; i < want.size(); ++i) want[i] = bf16_to_f32(base[i]);
    std::vector<float> gu(2 * I), y(D);
    for (int t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k) {
            const int e = idx[size_t(t) * K + k];
            gemm_fp8_cpu(xq.data_as<uint8_t>() + size_t(t) * D, xs.data_as<float>() + size_t(t) * nbd,
                         w13.w.data() + size_t(e) * 2 * I * D, w13.sw.data() + size_t(e) * (2 * I / 128) * nbd,
                         gu.data(), 1, 2 * I, D, Stream{&pool});
            Tensor g = Tensor::zeros({1, 1, 2 * I}, DType::kF32), hq = Tensor::zeros({1, 1, I}, DType::kFP8E4M3),
                   hs = Tensor::zeros({1, 1, nbi}, DType::kF32);
            for (int i = 0; i < 2 * I; ++i) g.data_as<float>()[i] = round_to_bf16(gu[i]);
            const std::vector<int32_t> one = {1};
            silu_mul_quant_masked(g, one, hq, hs, Stream{});
            gemm_fp8_cpu(hq.data_as<uint8_t>(), hs.data_as<float>(), w2.w.data() + size_t(e) * D * I,
                         w2.sw.data() + size_t(e) * (D / 128) * nbi, y.data(), 1, D, I, Stream{&pool});
            for (int d = 0; d < D; ++d) want[size_t(t) * D + d] += wts[size_t(t) * K + k] * round_to_bf16(y[d]);
        }

    // GPU chain.
    DeviceBuffer<uint16_t> dx(x);
    DeviceBuffer<uint8_t> dxq(x.size());
    DeviceBuffer<float> dxs(size_t(T) * nbd), dw(wts);
    DeviceBuffer<int32_t> didx(idx);
    DeviceFp8 d13(w13), d2(w2);
    launch_act_quant_bf16(dx.ptr, dxq.ptr, dxs.ptr, ScaleOrder::kRowMajor, T, D, nullptr);
    for (const int cap : {T, 8, 0}) {
        const int spill = int(moe_spill_rows(T, K, E, cap));
        const int64_t masked = int64_t(E) * cap, rows = masked + spill;
        DeviceBuffer<uint16_t> dout(base), dgu(size_t(rows) * 2 * I), dy(size_t(rows) * D);
        DeviceBuffer<uint8_t> dpx(size_t(rows) * D), dhq(size_t(rows) * I);
        DeviceBuffer<float> dps(size_t(rows) * nbd), dhs(size_t(rows) * nbi);
        DeviceBuffer<int32_t> dcounts(E), dblocks(size_t(spill / 128)), dslot(idx.size());
        for (auto* b : {&dgu, &dy}) b->poison();
        for (auto* b : {&dpx, &dhq}) b->poison();
        for (auto* b : {&dps, &dhs}) b->poison();
        launch_moe_permute(dxq.ptr, dxs.ptr, didx.ptr, T, K, D, 0, E, cap, spill, dpx.ptr, dps.ptr, dcounts.ptr,
                           dblocks.ptr, dslot.ptr, nullptr);
        if (cap > 0) {
            launch_grouped_gemm_fp8_masked(dpx.ptr, dps.ptr, dcounts.ptr, E, cap, d13.w.ptr, d13.sw.ptr, 2 * I, D,
                                           dgu.ptr, T * K / E, nullptr);
            launch_silu_mul_quant_masked(dgu.ptr, dcounts.ptr, E, cap, I, dhq.ptr, dhs.ptr, ScaleOrder::kRowMajor,
                                         nullptr);
            launch_grouped_gemm_fp8_masked(dhq.ptr, dhs.ptr, dcounts.ptr, E, cap, d2.w.ptr, d2.sw.ptr, D, I, dy.ptr,
                                           T * K / E, nullptr);
        }
        if (spill > 0) {
            launch_grouped_gemm_fp8_contiguous(dpx.ptr + masked * D, dps.ptr + masked * nbd, spill, dblocks.ptr,
                                               d13.w.ptr, d13.sw.ptr, E, 2 * I, D, dgu.ptr + masked * 2 * I, nullptr);
            launch_silu_mul_quant_contiguous(dgu.ptr + masked * 2 * I, dblocks.ptr, spill, I, dhq.ptr + masked * I,
                                             dhs.ptr + masked * nbi, nullptr);
            launch_grouped_gemm_fp8_contiguous(dhq.ptr + masked * I, dhs.ptr + masked * nbi, spill, dblocks.ptr,
                                               d2.w.ptr, d2.sw.ptr, E, D, I, dy.ptr + masked * D, nullptr);
        }
        launch_moe_unpermute(dy.ptr, dslot.ptr, dw.ptr, T, K, D, dout.ptr, dout.ptr, nullptr);
        FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
        const auto slot = dslot.download();
        const int64_t spilled = std::count_if(slot.begin(), slot.end(), [&](int32_t r) { return r >= masked; });
        EXPECT_EQ(spilled > 0, cap < T) << "cap " << cap << ": " << spilled << " choices spilled";
        const auto got = dout.download();
        std::vector<float> gotf(got.size());
        for (size_t i = 0; i < got.size(); ++i) gotf[i] = bf16_to_f32(got[i]);
        const double err = fanout::testing::rel_error(gotf.data(), want.data(), want.size());
        std::printf("MoE experts chain, cap %d (%lld spilled): ||gpu - cpu|| / ||cpu|| = %.2e\n", cap,
                    static_cast<long long>(spilled), err);
        EXPECT_LT(err, 2e-2) << "cap " << cap;
    }
}

}  // namespace
}  // namespace fanout::ops

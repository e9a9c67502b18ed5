// `fanout bench kernels`: see kernels_bench.h. Every timing is the best of 5 replays of a CUDA
// graph of back-to-back calls (as the anchors were taken). Dense operands are the same buffers
// each call, so shapes whose weights fit the 60 MB L2 run cache-warm, as in the anchors. Two
// options time them as a layer runs them instead: --cold rotates each call over copies of W that
// together exceed the L2 three times (every layer streams its own weights from HBM; x stays one
// buffer, as the activations a GEMM reads were just written), and --serial keeps each call from
// overlapping the next (in a layer a GEMM's neighbours are other kernels). The grouped points
// stream 0.5–1.4 GB of expert weights and cannot run warm. Operands are random e4m3 (never zeros).
// Timing only: the kernels' numbers are checked by ops_cuda_test.
#include "kernels_bench.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fanout/core/cuda_check.h"
#include "fanout/core/dtype.h"
#include "fanout/core/error.h"
#include "fanout/ops/cublas_check.h"
#include "fanout/ops/device_context.h"
#include "fanout/ops/fp8_quant.h"
#include "fanout/ops/gemm.h"
#include "fanout/ops/gemm_stream_k.h"
#include "fanout/ops/grouped_gemm_cuda.h"
#include "fanout/ops/model_glue_cuda.h"
#include "gpu_timing.h"

void launch_copy16(const void* src, void* dst, size_t bytes, cudaStream_t stream);  // copy_kernel.cu
void launch_empty(cudaStream_t stream);                                             // copy_kernel.cu
void launch_read16(const void* src, size_t bytes, int* sink, cudaStream_t stream);  // copy_kernel.cu

namespace fanout::bench {
namespace {

struct Shape {
    int64_t n, k;
    const char* name;
    double deepgemm_us[5];  // REFERENCE.md §3, at M = 64, 128, 256, 1024, 4096 (0: not measured there)
    bool in_sum = true;     // one of the six shapes the sums (and REFERENCE.md) cover
};
constexpr int64_t kMs[5] = {64, 128, 256, 1024, 4096};
constexpr Shape kShapes[8] = {
    {2112, 7168, "fused qkv_a", {10.5, 11.3, 13.4, 32.5, 95.7}},
    {24576, 1536, "q_b", {11.3, 12.0, 21.4, 64.7, 239.2}},
    {32768, 512, "kv_b", {7.2, 9.2, 13.0, 37.9, 130.9}},
    {7168, 16384, "o_proj", {38.4, 46.3, 61.6, 201.7, 672.2}},
    {4096, 7168, "shared gate+up", {12.0, 13.2, 17.7, 45.7, 171.7}},
    {7168, 2048, "shared down", {6.6, 8.8, 11.1, 30.2, 93.8}},
    // The first three (dense) layers' MLP (intermediate 18432): outside the six-shape sums.
    {36864, 7168, "dense gate+up", {0, 0, 0, 0, 0}, false},
    {7168, 18432, "dense down", {0, 0, 0, 0, 0}, false},
};

// The seed's grouped operating points: DeepGEMM masked on an H200
// (../shared/bench/anchors/deepgemm_vs_cublaslt_h200.json), gate/up then down, and the rows it ran
// on (each group's count drawn in [0.7, 1.3] × expected, valid_m in all).
struct GroupedPoint {
    int ep;
    double deepgemm_us[2];
    int valid_m;
};
constexpr GroupedPoint kGroupedPoints[5] = {{8, {263.22, 144.45}, 2174},
                                            {16, {154.62, 87.35}, 2090},
                                            {32, {133.71, 68.15}, 2086},
                                            {64, {112.96, 63.0}, 2132},
                                            {128, {114.46, 63.59}, 2417}};

constexpr int64_t kGroupedShapes[2][2] = {{4096, 7168}, {7168, 2048}};  // (N, K)

// Random e4m3 bytes generated on the host in 64 MB pieces (a GB of expert weights included), as
// --data asks: uniform in ±64, or normal with σ = 448/4 (as a block quantization of Gaussian values
// writes them: amax near e4m3's 448), or all zero. Under the power limit the tensor cores' draw,
// and so the clock every long GEMM runs at, depends on the bits they multiply.
std::unique_ptr<DevicePtr<uint8_t>> random_fp8(size_t n, uint64_t seed, KernelsBenchOptions::Data data) {
    auto d = std::make_unique<DevicePtr<uint8_t>>(n);
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> uniform(-64.0f, 64.0f);
    std::normal_distribution<float> normal(0.0f, 112.0f);
    std::vector<uint8_t> table(1 << 16);
    for (auto& v : table) {
        switch (data) {
            case KernelsBenchOptions::Data::kUniform:
                v = f32_to_fp8e4m3(uniform(rng));
                break;
            case KernelsBenchOptions::Data::kNormal:
                v = f32_to_fp8e4m3(std::clamp(normal(rng), -448.0f, 448.0f));
                break;
            case KernelsBenchOptions::Data::kZeros:
                v = 0;
                break;
        }
    }
    const size_t piece = size_t{64} << 20;
    std::vector<uint8_t> h(std::min(n, piece));
    for (size_t off = 0; off < n; off += piece) {
        const size_t len = std::min(piece, n - off);
        for (size_t i = 0; i < len; ++i) h[i] = table[rng() & 0xffff];
        FANOUT_CUDA_CHECK(cudaMemcpy(d->p + off, h.data(), len, cudaMemcpyHostToDevice));
    }
    return d;
}

std::unique_ptr<DevicePtr<float>> random_scales(size_t n, uint64_t seed) {
    auto d = std::make_unique<DevicePtr<float>>(n);
    std::vector<float> h(n);
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> dist(0.5f, 1.5f);
    for (auto& v : h) v = dist(rng) / 448.0f;
    FANOUT_CUDA_CHECK(cudaMemcpy(d->p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

// One FP8 GEMM through cuBLASLt; `blockwise` picks VEC128 / BLK128x128 scales, else tensor-wise.
// Column-major view: C[N, M] = Aᵀ · B with A = W ([K, N] column-major, transposed) and B = x.
struct CublasFp8 {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    cublasLtMatmulHeuristicResult_t algo{};
    bool ok = false;

    CublasFp8(cublasLtHandle_t lt, int64_t m, int64_t n, int64_t k, bool blockwise, const float* sa, const float* sb,
              size_t workspace) {
        FANOUT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
        FANOUT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
        FANOUT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof(nt)));
        if (blockwise) {
            const cublasLtMatmulMatrixScale_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
            const cublasLtMatmulMatrixScale_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
            FANOUT_CUBLAS_CHECK(
                cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode)));
            FANOUT_CUBLAS_CHECK(
                cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode)));
        }
        FANOUT_CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)));
        FANOUT_CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)));
        FANOUT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, n, k));
        FANOUT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, m, k));
        FANOUT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, n, m, n));
        cublasLtMatmulPreference_t pref;
        FANOUT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        FANOUT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                 &workspace, sizeof(workspace)));
        int found = 0;
        const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &algo, &found);
        ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
        cublasLtMatmulPreferenceDestroy(pref);
    }
    ~CublasFp8() {
        if (la) cublasLtMatrixLayoutDestroy(la);
        if (lb) cublasLtMatrixLayoutDestroy(lb);
        if (lc) cublasLtMatrixLayoutDestroy(lc);
        if (desc) cublasLtMatmulDescDestroy(desc);
    }
    CublasFp8(const CublasFp8&) = delete;
    CublasFp8& operator=(const CublasFp8&) = delete;
    void run(cublasLtHandle_t lt, const void* w, const void* x, void* y, void* ws, size_t wsize, cudaStream_t s,
             const cublasLtMatmulAlgo_t* with = nullptr) {
        const float one = 1.0f, zero = 0.0f;
        FANOUT_CUBLAS_CHECK(cublasLtMatmul(lt, desc, &one, w, la, x, lb, &zero, y, lc, y, lc,
                                           with != nullptr ? with : &algo.algo, ws, wsize, s));
    }
};

struct Context {
    cudaStream_t stream = nullptr;
    cublasLtHandle_t lt = nullptr;
    size_t wsize = size_t{32} << 20;
    std::unique_ptr<DevicePtr<uint8_t>> ws;
    double bw_gbs = 0, read_gbs = 0, peak_tflops = 0;
    KernelsBenchOptions::Data data = KernelsBenchOptions::Data::kUniform;  // the FP8 operands' values
    int draws = 1;                                                         // grouped masked: routing draws
    bool hot = false;  // grouped masked: each timing after sustained work (heat), not an idle pause
    ops::GemmWorkspace gemm_ws{size_t{256} << 20};

    double floor_us(double flops, double bytes) const {
        return std::max(bytes / (bw_gbs * 1e3), flops / (peak_tflops * 1e6));
    }
    nlohmann::json figures(double us, double flops, double bytes) const {
        return {{"us", us},
                {"tflops", flops / us / 1e6},
                {"gbs", bytes / us / 1e3},
                {"pct_mem_roofline", 100 * bytes / (bw_gbs * 1e3) / us},
                {"pct_fp8_roofline", 100 * flops / (peak_tflops * 1e6) / us}};
    }
};

void measure_ceilings(Context& c) {
    const size_t copy_bytes = size_t{2} << 30;
    DevicePtr<uint8_t> c0(copy_bytes), c1(copy_bytes);
    FANOUT_CUDA_CHECK(cudaMemset(c0.p, 1, copy_bytes));
    const double copy_us = time_graph_us(c.stream, 10, [&] {
        launch_copy16(c0.p, c1.p, copy_bytes, c.stream);
        FANOUT_CUDA_CHECK(cudaGetLastError());
    });
    c.bw_gbs = 2.0 * copy_bytes / copy_us / 1e3;
    DevicePtr<int> sink(1);
    const double read_us = time_graph_us(c.stream, 10, [&] {
        launch_read16(c0.p, copy_bytes, sink.p, c.stream);
        FANOUT_CUDA_CHECK(cudaGetLastError());
    });
    c.read_gbs = double(copy_bytes) / read_us / 1e3;
    const int64_t big = 8192;
    auto ba = random_fp8(size_t(big * big), 1, c.data), bb = random_fp8(size_t(big * big), 2, c.data);
    DevicePtr<uint16_t> bc(size_t(big * big));
    auto unit = random_scales(1, 3);
    CublasFp8 peak(c.lt, big, big, big, false, unit->p, unit->p, c.wsize);
    FANOUT_CHECK(peak.ok, "cuBLASLt has no tensor-wise FP8 algorithm for 8192^3");
    const double peak_us =
        time_graph_us(c.stream, 10, [&] { peak.run(c.lt, ba->p, bb->p, bc.p, c.ws->p, c.wsize, c.stream); });
    c.peak_tflops = 2.0 * big * big * big / peak_us / 1e6;
}

// "128x256/2c2": block_m × block_n, K splits ("sk": stream-K), and the cluster size when it is 2.
std::string config_name(const ops::GemmConfig& g) {
    return std::to_string(g.block_m) + "x" + std::to_string(g.block_n) + "/" +
           (g.stream_k ? std::string("sk") : std::to_string(g.splits)) +
           (g.cluster > 1 ? std::string("c").append(std::to_string(g.cluster)) : std::string());
}

// Long FP8 GEMMs at prefill sizes hold the GPU at its power limit, and its clock falls within
// tens of milliseconds: whichever of two kernels is timed second after a pause reads 10–15% slower
// (o_proj at M = 4096: the same cuBLASLt algorithm 613 µs first, 700 µs right after). So every
// dense and grouped timing starts from the same state: an idle pause first.
void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(150)); }

// The opposite start (--hot): ~0.2 s of fn back to back, so the timing that follows runs at the
// clock the power limit leaves under sustained work, as a layer's GEMMs do in its replays.
template <typename Fn>
void heat(cudaStream_t s, Fn&& fn) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    while (std::chrono::steady_clock::now() < until) {
        for (int i = 0; i < 50; ++i) fn();
        FANOUT_CUDA_CHECK(cudaStreamSynchronize(s));
    }
}

// An algorithm's configuration: id, tile, stages, split-K, CTA swizzle and cluster shape ids
// (cublasLt.h's enums).
nlohmann::json lt_algo_config(const cublasLtMatmulAlgo_t& a) {
    const auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr, auto v) {
        size_t written = 0;
        return cublasLtMatmulAlgoConfigGetAttribute(&a, attr, &v, sizeof(v), &written) == CUBLAS_STATUS_SUCCESS
                   ? nlohmann::json(v)
                   : nlohmann::json();
    };
    return {{"id", get(CUBLASLT_ALGO_CONFIG_ID, int32_t{})},
            {"tile", get(CUBLASLT_ALGO_CONFIG_TILE_ID, uint32_t{})},
            {"stages", get(CUBLASLT_ALGO_CONFIG_STAGES_ID, uint32_t{})},
            {"splitk", get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, uint32_t{})},
            {"swizzle", get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, uint32_t{})},
            {"cluster", get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, uint16_t{})}};
}

// Every configuration of g's algorithms that cuBLASLt accepts for its shape, built by hand (the
// heuristic returns one): each algorithm id for these types, in each tile below, with 128-deep
// stages (as many as fit) and the cluster shapes auto, 1×1, 2×1, 1×2 and 2×2.
std::vector<cublasLtMatmulAlgo_t> lt_candidates(cublasLtHandle_t lt, const CublasFp8& g, size_t wsize) {
    std::vector<cublasLtMatmulAlgo_t> out;
    int ids[64], n_ids = 0;
    if (cublasLtMatmulAlgoGetIds(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF,
                                 CUDA_R_16BF, 64, ids, &n_ids) != CUBLAS_STATUS_SUCCESS)
        return out;
    for (int i = 0; i < n_ids; ++i) {
        cublasLtMatmulAlgo_t a{};
        if (cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF,
                                   CUDA_R_16BF, ids[i], &a) != CUBLAS_STATUS_SUCCESS)
            continue;
        const auto list = [&](cublasLtMatmulAlgoCapAttributes_t cap) {
            size_t bytes = 0;
            std::vector<uint32_t> v;
            if (cublasLtMatmulAlgoCapGetAttribute(&a, cap, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS || bytes == 0)
                return v;
            v.resize(bytes / sizeof(uint32_t));
            if (cublasLtMatmulAlgoCapGetAttribute(&a, cap, v.data(), bytes, &bytes) != CUBLAS_STATUS_SUCCESS) v.clear();
            return v;
        };
        // Tiles from 64 × 128 up, whether the algorithm lists them or not (on sm_90 the block-scaled
        // algorithm lists tiles up to 128 × 64 and 64 × 128, yet its heuristic picks 128 × 128; the
        // smaller ones it lists were all slower at M = 1,024 and 4,096): the check decides.
        const std::vector<uint32_t> stages = list(CUBLASLT_ALGO_CAP_STAGES_IDS);
        const uint32_t tiles[] = {
            CUBLASLT_MATMUL_TILE_64x128,  CUBLASLT_MATMUL_TILE_128x64,  CUBLASLT_MATMUL_TILE_128x128,
            CUBLASLT_MATMUL_TILE_128x256, CUBLASLT_MATMUL_TILE_256x128, CUBLASLT_MATMUL_TILE_128x192,
            CUBLASLT_MATMUL_TILE_192x128, CUBLASLT_MATMUL_TILE_128x160, CUBLASLT_MATMUL_TILE_160x128};
        // K 128 a stage (one scale block), as many stages as fit: an algorithm without it is skipped.
        const uint32_t st = CUBLASLT_MATMUL_STAGES_128xAUTO;
        if (std::find(stages.begin(), stages.end(), st) == stages.end()) continue;
        for (uint32_t tile : tiles)
            for (uint16_t cl : {uint16_t{CUBLASLT_CLUSTER_SHAPE_AUTO}, uint16_t{CUBLASLT_CLUSTER_SHAPE_1x1x1},
                                uint16_t{CUBLASLT_CLUSTER_SHAPE_2x1x1}, uint16_t{CUBLASLT_CLUSTER_SHAPE_1x2x1},
                                uint16_t{CUBLASLT_CLUSTER_SHAPE_2x2x1}}) {
                cublasLtMatmulAlgo_t c = a;
                const uint32_t one = 1;
                if (cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile)) !=
                        CUBLAS_STATUS_SUCCESS ||
                    cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_STAGES_ID, &st, sizeof(st)) !=
                        CUBLAS_STATUS_SUCCESS ||
                    cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof(one)) !=
                        CUBLAS_STATUS_SUCCESS ||
                    cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cl, sizeof(cl)) !=
                        CUBLAS_STATUS_SUCCESS)
                    continue;
                cublasLtMatmulHeuristicResult_t r{};
                if (cublasLtMatmulAlgoCheck(lt, g.desc, g.la, g.lb, g.lc, g.lc, &c, &r) == CUBLAS_STATUS_SUCCESS &&
                    r.workspaceSize <= wsize)
                    out.push_back(c);
            }
    }
    return out;
}

// cuBLASLt as a user without a grouped kernel runs experts: one block-scaled GEMM per expert e
// over rows [first_row[e], first_row[e] + rows[e]) of x, y and sx (row-major scales), against
// expert e's slice of the stacked w / sw. -1 when cuBLASLt has no algorithm for some expert.
double time_cublaslt_per_expert(Context& c, const uint8_t* w, const float* sw, const uint8_t* x, const float* sx,
                                uint16_t* y, int64_t N, int64_t K, const std::vector<int64_t>& first_row,
                                const std::vector<int64_t>& rows) {
    const int64_t nbk = (K + 127) / 128, nbn = (N + 127) / 128;
    std::vector<std::unique_ptr<CublasFp8>> per;
    bool ok = true;
    for (size_t e = 0; e < rows.size(); ++e) {
        per.push_back(std::make_unique<CublasFp8>(c.lt, rows[e], N, K, true, sw + e * nbn * nbk,
                                                  sx + size_t(first_row[e]) * nbk, c.wsize));
        if (!per.back()->ok)
            std::printf("  (cuBLASLt: no block-scaled algorithm for M %lld N %lld K %lld)\n", (long long)rows[e],
                        (long long)N, (long long)K);
        ok = ok && per.back()->ok;
    }
    if (!ok) return -1;
    return time_graph_us(c.stream, 5, [&] {
        for (size_t e = 0; e < rows.size(); ++e)
            per[e]->run(c.lt, w + e * N * K, x + size_t(first_row[e]) * K, y + size_t(first_row[e]) * N, c.ws->p,
                        c.wsize, c.stream);
    });
}

size_t l2_bytes() {
    int dev = 0, bytes = 0;
    FANOUT_CUDA_CHECK(cudaGetDevice(&dev));
    FANOUT_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, dev));
    return size_t(bytes);
}

nlohmann::json bench_dense(Context& c, const KernelsBenchOptions& opts) {
    const bool sweep = opts.sweep;
    nlohmann::json rows = nlohmann::json::array();
    std::printf("dense FP8 GEMM, y[M,N] = x[M,K]·W[N,K]^T (bf16 out)%s%s\n",
                opts.cold ? "; W from HBM: each call its own copy (--cold)" : "",
                opts.serial ? "; calls do not overlap (--serial)" : "");
    std::printf("%-15s %5s %9s %-9s %7s %6s %6s %6s %9s %9s %8s%s\n", "shape", "M", "fanout", "tile", "TFLOP/s", "GB/s",
                "%mem", "%fp8", "cuBLASLt", "DeepGEMM", "floor", sweep ? "  sweep best" : "");
    double sums[5] = {}, cub_sums[5] = {}, dg_sums[5] = {}, floor_sums[5] = {}, best_sums[5] = {};
    const int sms = ops::device_sm_count();
    const ops::GemmConfig forced = opts.config.empty() ? ops::GemmConfig{} : parse_gemm_config(opts.config);
    ops::DeviceContext dctx(c.stream);
    // --serial: an empty kernel after each call, so no call overlaps the next; its own time,
    // measured alone, comes off.
    const double empty_us = opts.serial ? time_graph_us(c.stream, 50, [&] { launch_empty(c.stream); }) : 0.0;
    const auto timed = [&](int calls, const auto& fn) {
        if (!opts.serial) return time_graph_us(c.stream, calls, fn);
        return time_graph_us(c.stream, calls,
                             [&] {
                                 fn();
                                 launch_empty(c.stream);
                             }) -
               empty_us;
    };
    // The Ms to time, as (index into kMs, M); an --m outside kMs (a decode batch: M = 2 for one
    // request with MTP) runs alone, with no anchor and outside the sums.
    std::vector<std::pair<int, int64_t>> ms;
    for (int mi = 0; mi < 5; ++mi)
        if (opts.m == 0 || opts.m == kMs[mi]) ms.emplace_back(mi, kMs[mi]);
    if (ms.empty()) ms.emplace_back(-1, int64_t{opts.m});
    for (const Shape& sh : kShapes) {
        if (!opts.shape.empty() && opts.shape != sh.name) continue;
        auto w = random_fp8(size_t(sh.n * sh.k), 3, c.data);
        // --cold: copies of W, each call the next (the graphs capture each call's pointer).
        const size_t w_bytes = size_t(sh.n * sh.k);
        const size_t copies = opts.cold ? std::max<size_t>(2, (3 * l2_bytes() + w_bytes - 1) / w_bytes) : 1;
        std::vector<std::unique_ptr<DevicePtr<uint8_t>>> w_copies;
        std::vector<const uint8_t*> w_ring{w->p};
        while (w_ring.size() < copies) {
            w_copies.push_back(std::make_unique<DevicePtr<uint8_t>>(w_bytes));
            FANOUT_CUDA_CHECK(cudaMemcpy(w_copies.back()->p, w->p, w_bytes, cudaMemcpyDeviceToDevice));
            w_ring.push_back(w_copies.back()->p);
        }
        size_t call = 0;
        const auto next_w = [&] { return w_ring[call++ % w_ring.size()]; };
        auto sw = random_scales(size_t((sh.n + 127) / 128) * size_t((sh.k + 127) / 128), 4);
        for (const auto& [mi, M] : ms) {
            const double anchor_us = mi >= 0 ? sh.deepgemm_us[mi] : 0.0;
            auto x = random_fp8(size_t(M * sh.k), 5, c.data);
            auto sx = random_scales(size_t(M) * size_t((sh.k + 127) / 128), 6);
            DevicePtr<uint16_t> y(size_t(M * sh.n));
            CublasFp8 g(c.lt, M, sh.n, sh.k, true, sw->p, sx->p, c.wsize);
            settle();
            const double cub_us =
                g.ok ? timed(50, [&] { g.run(c.lt, next_w(), x->p, y.p, c.ws->p, c.wsize, c.stream); }) : -1;
            // --lt-search: the same algorithms in every configuration cuBLASLt accepts, each from an
            // idle pause, beside the heuristic's.
            nlohmann::json lt_all = nlohmann::json::array();
            double lt_best_us = cub_us;
            nlohmann::json lt_best = g.ok ? lt_algo_config(g.algo.algo) : nlohmann::json();
            size_t lt_count = 0;
            if (opts.lt_search && g.ok) {
                for (const cublasLtMatmulAlgo_t& a : lt_candidates(c.lt, g, c.wsize)) {
                    settle();
                    const double t =
                        timed(20, [&] { g.run(c.lt, next_w(), x->p, y.p, c.ws->p, c.wsize, c.stream, &a); });
                    lt_all.push_back({{"algo", lt_algo_config(a)}, {"us", t}});
                    ++lt_count;
                    if (t < lt_best_us) lt_best_us = t, lt_best = lt_algo_config(a);
                }
            }
            auto run = [&](ops::GemmConfig cfg, int calls) {
                return timed(calls, [&] {
                    ops::launch_gemm_fp8(x->p, sx->p, next_w(), sw->p, y.p, int(M), int(sh.n), int(sh.k), c.stream,
                                         nullptr, &c.gemm_ws, cfg);
                });
            };
            const ops::GemmConfig table =
                forced.block_m != 0 ? forced : ops::pick_gemm_config(int(M), int(sh.n), int(sh.k), sms, true);
            // The model's launch (DeviceContext): cuBLASLt where the table says so, x's scales in
            // the order the model's quantization writes for this shape (M-major for cuBLASLt, which
            // reads them as they are; the tile kernels, direct and swept, read row-major). The
            // scales are random, so one buffer serves either order.
            const ops::ScaleOrder order = ops::gemm_fp8_scale_order(int(M), int(sh.n), int(sh.k), sms);
            const bool via_lt = table.cublaslt && ops::launch_gemm_fp8_cublaslt(dctx, x->p, sx->p, order, w->p, sw->p,
                                                                                y.p, int(M), int(sh.n), int(sh.k));
            auto dispatch = [&] {
                return timed(50, [&] {
                    ops::launch_gemm_fp8(dctx, x->p, sx->p, order, next_w(), sw->p, y.p, int(M), int(sh.n), int(sh.k));
                });
            };
            settle();
            const double us = via_lt ? dispatch() : run(table, 50);
            if (via_lt) settle();
            const double tile_us = via_lt ? run(table, 50) : us;  // the tile kernel the table would fall back to
            const double flops = 2.0 * M * sh.n * sh.k, bytes = double(M * sh.k + sh.n * sh.k + 2 * M * sh.n);
            const double floor_us = c.floor_us(flops, bytes);
            nlohmann::json row = {
                {"shape", sh.name},
                {"M", M},
                {"N", sh.n},
                {"K", sh.k},
                {"config", via_lt ? "cuBLASLt" : config_name(table)},
                {"fallback_config", config_name(table)},
                {"fallback_us", tile_us},
                {"fanout", c.figures(us, flops, bytes)},
                {"cublaslt_us", cub_us},
                {"cublaslt_algo", g.ok ? lt_algo_config(g.algo.algo) : nlohmann::json()},
                {"deepgemm_us_reference_md", anchor_us > 0 ? nlohmann::json(anchor_us) : nlohmann::json()},
                {"roofline_floor_us", floor_us},
                {"w_cold", opts.cold},
                {"serial", opts.serial}};
            double best_us = us;
            ops::GemmConfig best = table;
            if (sweep) {
                nlohmann::json all = nlohmann::json::array();
                const int nkb = int((sh.k + 127) / 128);
                for (int cluster : {1, 2})
                    for (int bm : {64, 128, 192})
                        for (int bn : {64, 128, 192, 256})
                            for (int splits : {1, 2, 4, 8, 0}) {  // 0: stream-K
                                if (splits > 1 && nkb / splits < 2) continue;
                                if (!ops::gemm_fp8_tile_exists(bm, bn, true)) continue;
                                ops::GemmConfig cfg{bm, bn, std::max(splits, 1), cluster};
                                cfg.stream_k = splits == 0;
                                const size_t tiles = size_t((M + bm - 1) / bm) * size_t((sh.n + bn - 1) / bn);
                                if (splits > 1 && tiles * splits * bm * bn > c.gemm_ws.partial_floats) continue;
                                if (cfg.stream_k) {  // built for this tile, its partials in the workspace
                                    if (!ops::gemm_fp8_stream_k_tile(bm, bn)) continue;
                                    const int m_units = (int((M + bm - 1) / bm) + cluster - 1) / cluster;
                                    const ops::StreamKPlan plan = ops::plan_stream_k(  // a CTA per SM
                                        m_units * int((sh.n + bn - 1) / bn), sms / cluster, nkb, ops::kMinStreamKShare);
                                    if (plan.tiles == 0) continue;  // whole waves, or K too shallow to share
                                    if (size_t(plan.tiles) * cluster * plan.slots * bm * bn > c.gemm_ws.partial_floats)
                                        continue;
                                }
                                const double t = run(cfg, 20);
                                all.push_back({{"config", config_name(cfg)}, {"us", t}});
                                if (t < best_us) best_us = t, best = cfg;
                            }
                row["sweep"] = all;
                row["sweep_best"] = {{"config", config_name(best)}, {"us", best_us}};
            }
            std::printf("%-15s %5lld %6.1f us %-9s %7.0f %6.0f %5.0f%% %5.0f%% %6.1f us %6.1f us %5.1f us", sh.name,
                        (long long)M, us, via_lt ? "cuBLASLt" : config_name(table).c_str(), flops / us / 1e6,
                        bytes / us / 1e3, 100 * bytes / (c.bw_gbs * 1e3) / us, 100 * flops / (c.peak_tflops * 1e6) / us,
                        cub_us, anchor_us, floor_us);
            if (sweep) std::printf("  %6.1f us %s", best_us, config_name(best).c_str());
            if (via_lt) std::printf("  (tile %s %.1f us)", config_name(table).c_str(), tile_us);
            if (opts.lt_search) {
                row["cublaslt_search"] = lt_all;
                row["cublaslt_search_best"] = {{"algo", lt_best}, {"us", lt_best_us}};
                std::printf("  [cuBLASLt, best of %zu: %.1f us %s]", lt_count, lt_best_us, lt_best.dump().c_str());
            }
            std::printf("\n");
            rows.push_back(row);
            if (!sh.in_sum || mi < 0) continue;
            sums[mi] += us;
            best_sums[mi] += best_us;
            cub_sums[mi] += cub_us;
            dg_sums[mi] += anchor_us;
            floor_sums[mi] += floor_us;
        }
    }
    std::printf("\nsum over the six shapes (µs): M      fanout  cuBLASLt  DeepGEMM   floor%s\n",
                sweep ? "  sweep-best" : "");
    nlohmann::json sum_rows = nlohmann::json::array();
    for (int mi = 0; mi < 5; ++mi) {
        if (opts.m != 0 && opts.m != kMs[mi]) continue;  // not timed
        std::printf("                             %5lld %8.1f %9.1f %9.1f %7.1f", (long long)kMs[mi], sums[mi],
                    cub_sums[mi], dg_sums[mi], floor_sums[mi]);
        if (sweep) std::printf(" %10.1f", best_sums[mi]);
        std::printf("\n");
        sum_rows.push_back({{"M", kMs[mi]},
                            {"fanout_us", sums[mi]},
                            {"cublaslt_us", cub_sums[mi]},
                            {"deepgemm_us_reference_md", dg_sums[mi]},
                            {"roofline_floor_us", floor_sums[mi]},
                            {"sweep_best_us", sweep ? best_sums[mi] : -1.0}});
    }
    return {{"rows", rows}, {"sums", sum_rows}};
}

// The masked configs timed beside the table's pick at each grouped point: each tile unpaired and
// in pairs, without and with the last-wave split.
constexpr ops::GemmConfig kMaskedVariants[] = {{128, 128, 1},    {64, 256, 1},     {128, 256, 1},    {128, 128, 1, 2},
                                               {128, 256, 1, 2}, {192, 128, 1},    {192, 128, 1, 2}, {128, 128, 8},
                                               {128, 256, 8},    {128, 128, 8, 2}, {128, 256, 8, 2}, {192, 128, 8}};

nlohmann::json bench_grouped(Context& c) {
    std::printf("\ngrouped masked FP8 GEMM at the seed's decode points (batch 128/GPU, query 2, top-8 of 256)%s\n",
                c.hot ? "; each timing after 0.2 s of sustained work (--hot)" : "");
    std::printf("%-5s %-9s %7s %7s %9s %7s %6s %6s %6s %9s %9s %8s\n", "EP", "N x K", "experts", "tokens", "fanout",
                "TFLOP/s", "GB/s", "%mem", "%fp8", "cuBLASLt", "DeepGEMM", "floor");
    nlohmann::json rows = nlohmann::json::array();
    for (const GroupedPoint& pt : kGroupedPoints) {
        const int E = 256 / pt.ep, expected = 128 * 2 * 8 * pt.ep / 256;
        const int max_m = expected * 3 / 2;
        const std::vector<int32_t> counts = anchor_counts(E, expected, pt.valid_m, static_cast<uint32_t>(pt.ep));
        const int64_t valid = pt.valid_m;
        DevicePtr<int32_t> dcounts(E);
        FANOUT_CUDA_CHECK(cudaMemcpy(dcounts.p, counts.data(), E * sizeof(int32_t), cudaMemcpyHostToDevice));
        double total_us = 0, total_dg = 0;
        for (int si = 0; si < 2; ++si) {
            const int64_t N = kGroupedShapes[si][0], K = kGroupedShapes[si][1];
            const int64_t nbk = (K + 127) / 128, nbn = (N + 127) / 128;
            auto w = random_fp8(size_t(E) * N * K, 10 + si, c.data);
            auto sw = random_scales(size_t(E) * nbn * nbk, 11);
            auto x = random_fp8(size_t(E) * max_m * K, 12, c.data);
            auto sx = random_scales(size_t(E) * max_m * nbk, 13);
            DevicePtr<uint16_t> y(size_t(E) * max_m * N);
            // Each timing from an idle pause, as the dense rows': these GEMMs hold the GPU at its
            // power limit, and without the pause only the row's first timing (after the operands'
            // set-up) ran at the full clock — 2-18 µs under the same config timed later (run135:
            // nvidia-smi saw the SM clock at 1,350-1,500 MHz under them, 1,980 idle, throttled by
            // the software power cap).
            // With --hot each timing follows sustained work instead (heat).
            auto run = [&](ops::GemmConfig cfg) {
                const auto call = [&] {
                    ops::launch_grouped_gemm_fp8_masked(x->p, sx->p, dcounts.p, E, max_m, w->p, sw->p, int(N), int(K),
                                                        y.p, expected, c.stream, &c.gemm_ws, cfg);
                };
                if (c.hot)
                    heat(c.stream, call);
                else
                    settle();
                return time_graph_us(c.stream, 20, call);
            };
            // The table's pick (config 0) and then every variant, on the counts in dcounts.
            const auto time_configs = [&] {
                std::vector<double> t{run({})};
                for (const ops::GemmConfig& cfg : kMaskedVariants) t.push_back(run(cfg));
                return t;
            };
            const auto name_of = [](size_t v) {
                return v == 0 ? std::string("table") : config_name(kMaskedVariants[v - 1]);
            };
            // per_draw[d][v]: the anchor's counts first.
            std::vector<std::vector<double>> per_draw{time_configs()};
            const double us = per_draw[0][0];
            nlohmann::json variants = nlohmann::json::array();
            std::string best_name = "table";
            double best_us = us;
            for (size_t v = 1; v < per_draw[0].size(); ++v) {
                variants.push_back({{"config", name_of(v)}, {"us", per_draw[0][v]}});
                if (per_draw[0][v] < best_us) best_us = per_draw[0][v], best_name = name_of(v);
            }
            // The table's config again, after the variants: the spread of one config's timings.
            const double again_us = run({});
            // --draws: the same on other routing draws of the same total (seeds past the anchor's),
            // then the anchor's counts back for the rest of the point.
            nlohmann::json draws = nlohmann::json::array();
            std::string draws_line;  // printed under the point's row
            if (c.draws > 1) {
                for (int d = 1; d < c.draws; ++d) {
                    const std::vector<int32_t> drawn =
                        anchor_counts(E, expected, pt.valid_m, static_cast<uint32_t>(pt.ep + 1000 * d));
                    FANOUT_CUDA_CHECK(cudaMemcpy(dcounts.p, drawn.data(), E * sizeof(int32_t), cudaMemcpyHostToDevice));
                    per_draw.push_back(time_configs());
                    nlohmann::json timed = nlohmann::json::array();
                    for (size_t v = 0; v < per_draw[d].size(); ++v)
                        timed.push_back({{"config", name_of(v)}, {"us", per_draw[d][v]}});
                    draws.push_back({{"seed", pt.ep + 1000 * d},
                                     {"most_rows", *std::max_element(drawn.begin(), drawn.end())},
                                     {"configs", timed}});
                }
                FANOUT_CUDA_CHECK(cudaMemcpy(dcounts.p, counts.data(), E * sizeof(int32_t), cudaMemcpyHostToDevice));
                draws_line = fmt::format("      over {} draws, mean (min-max) us:", c.draws);
                for (size_t v = 0; v < per_draw[0].size(); ++v) {
                    double sum = 0, lo = per_draw[0][v], hi = lo;
                    for (const std::vector<double>& t : per_draw)
                        sum += t[v], lo = std::min(lo, t[v]), hi = std::max(hi, t[v]);
                    draws_line += fmt::format(" {} {:.1f} ({:.1f}-{:.1f}){}", name_of(v), sum / per_draw.size(), lo, hi,
                                              v + 1 < per_draw[0].size() ? ";" : "");
                }
            }
            // cuBLASLt with each expert's count known on the host, rounded up to a multiple of 16
            // rows (cuBLASLt's block-scaled FP8 finds no algorithm otherwise).
            std::vector<int64_t> first_row, seg_rows;
            for (int e = 0; e < E; ++e) {
                first_row.push_back(int64_t(e) * max_m);
                seg_rows.push_back(std::min(max_m, (counts[e] + 15) / 16 * 16));
            }
            settle();
            const double cub_us = time_cublaslt_per_expert(c, w->p, sw->p, x->p, sx->p, y.p, N, K, first_row, seg_rows);
            const double flops = 2.0 * valid * N * K, bytes = double(E * N * K + valid * K + 2 * valid * N);
            const double floor_us = c.floor_us(flops, bytes);
            std::printf(
                "EP%-3d %4lldx%-4lld %7d %7lld %6.1f us %7.0f %6.0f %5.0f%% %5.0f%% %6.1f us %6.1f us %5.1f us"
                "   best %s %.1f us, table again %.1f us\n",
                pt.ep, (long long)N, (long long)K, E, (long long)valid, us, flops / us / 1e6, bytes / us / 1e3,
                100 * bytes / (c.bw_gbs * 1e3) / us, 100 * flops / (c.peak_tflops * 1e6) / us, cub_us,
                pt.deepgemm_us[si], floor_us, best_name.c_str(), best_us, again_us);
            if (!draws_line.empty()) std::printf("%s\n", draws_line.c_str());
            rows.push_back({{"kind", "grouped_masked"},
                            {"ep", pt.ep},
                            {"experts", E},
                            {"expected_m", expected},
                            {"max_m", max_m},
                            {"valid_m", valid},
                            {"N", N},
                            {"K", K},
                            {"fanout", c.figures(us, flops, bytes)},
                            {"cublaslt_per_expert_us", cub_us},
                            {"deepgemm_us_anchor", pt.deepgemm_us[si]},
                            {"roofline_floor_us", floor_us},
                            {"variants", variants},
                            {"table_again_us", again_us},
                            {"draws", draws}});
            total_us += us;
            total_dg += pt.deepgemm_us[si];
        }
        // The activation between the two GEMMs: bf16 gate_up [E, max_m, 4096] -> fp8 [E, max_m, 2048] + scales.
        const int I = 2048;
        auto gu = random_fp8(size_t(E) * max_m * 2 * I * 2, 14, c.data);  // random bytes as bf16 bit patterns
        DevicePtr<uint8_t> q(size_t(E) * max_m * I);
        DevicePtr<float> s(size_t(E) * max_m * (I / 128));
        settle();
        const double act_us = time_graph_us(c.stream, 20, [&] {
            ops::launch_silu_mul_quant_masked(reinterpret_cast<const uint16_t*>(gu->p), dcounts.p, E, max_m, I, q.p,
                                              s.p, ops::ScaleOrder::kRowMajor, c.stream);
        });
        const double act_bytes = double(valid) * (2 * I * 2 + I + (I / 128) * 4);
        std::printf(
            "EP%-3d silu·mul·quant %lld rows: %.1f us, %.0f GB/s (%.0f%% of copy); GEMMs %.1f us vs DeepGEMM %.1f us\n",
            pt.ep, (long long)valid, act_us, act_bytes / act_us / 1e3, 100 * act_bytes / act_us / 1e3 / c.bw_gbs,
            total_us, total_dg);
        rows.push_back({{"kind", "silu_mul_quant_masked"},
                        {"ep", pt.ep},
                        {"valid_m", valid},
                        {"us", act_us},
                        {"gbs", act_bytes / act_us / 1e3},
                        {"gemms_us", total_us},
                        {"gemms_deepgemm_us", total_dg}});
    }
    return rows;
}

// Prefill through the contiguous layout: 4,096 prompt tokens on each rank of an EP group, top-8 of
// 256, so 32,768 routed rows arrive at every rank, spread over its experts (each count uniform in
// ±25% of the mean) and padded to 128 per expert. DeepGEMM's contiguous kernel was not measured on
// this machine, so there is no anchor: beside the floor stand cuBLASLt (a GEMM per expert) and the
// dense GEMM of the same rows against one weight (the model's dispatch), which grouping should
// match.
nlohmann::json bench_grouped_contiguous(Context& c) {
    std::printf("\ngrouped contiguous FP8 GEMM at prefill (4,096 tokens per rank, top-8 of 256)\n");
    std::printf("%-5s %-9s %7s %7s %7s %9s %7s %6s %9s %9s %8s\n", "EP", "N x K", "experts", "rows", "padded", "fanout",
                "TFLOP/s", "%fp8", "dense", "cuBLASLt", "floor");
    nlohmann::json rows_out = nlohmann::json::array();
    const int sms = ops::device_sm_count();
    ops::DeviceContext dctx(c.stream);
    for (const int ep : {8, 32, 64}) {
        const int E = 256 / ep, mean = 128 * ep;
        std::mt19937 rng(100 + ep);
        std::uniform_int_distribution<int> dist(mean * 3 / 4, mean * 5 / 4);
        std::vector<int32_t> counts(E), block_expert;
        int64_t valid = 0;
        for (int e = 0; e < E; ++e) {
            valid += counts[e] = dist(rng);
            for (int b = 0; b < (counts[e] + 127) / 128; ++b) block_expert.push_back(e);
        }
        const int64_t rows = int64_t(block_expert.size()) * 128;
        DevicePtr<int32_t> dblocks(block_expert.size());
        FANOUT_CUDA_CHECK(
            cudaMemcpy(dblocks.p, block_expert.data(), block_expert.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
        for (int si = 0; si < 2; ++si) {
            const int64_t N = kGroupedShapes[si][0], K = kGroupedShapes[si][1];
            const int64_t nbk = (K + 127) / 128, nbn = (N + 127) / 128;
            auto w = random_fp8(size_t(E) * N * K, 20 + si, c.data);
            auto sw = random_scales(size_t(E) * nbn * nbk, 21);
            auto x = random_fp8(size_t(rows) * K, 22, c.data);
            auto sx = random_scales(size_t(rows) * nbk, 23);
            DevicePtr<uint16_t> y(size_t(rows) * N);
            auto run = [&](ops::GemmConfig cfg) {
                settle();
                return time_graph_us(c.stream, 5, [&] {
                    ops::launch_grouped_gemm_fp8_contiguous(x->p, sx->p, int(rows), dblocks.p, w->p, sw->p, E, int(N),
                                                            int(K), y.p, c.stream, cfg);
                });
            };
            const double us = run({});
            const double unpaired_us = run({128, 256, 1, 1});  // the default's tile without cluster pairs
            // The same rows through one weight, as the model dispatches a dense GEMM of this size
            // (the random scales serve either order).
            const ops::ScaleOrder order = ops::gemm_fp8_scale_order(int(rows), int(N), int(K), sms);
            settle();
            const double dense_us = time_graph_us(c.stream, 5, [&] {
                ops::launch_gemm_fp8(dctx, x->p, sx->p, order, w->p, sw->p, y.p, int(rows), int(N), int(K));
            });
            // cuBLASLt: one GEMM per expert over its padded segment.
            std::vector<int64_t> first_row, seg_rows;
            for (int e = 0, row = 0; e < E; ++e) {
                first_row.push_back(row);
                seg_rows.push_back(int64_t((counts[e] + 127) / 128) * 128);
                row += int(seg_rows.back());
            }
            settle();
            const double cub_us = time_cublaslt_per_expert(c, w->p, sw->p, x->p, sx->p, y.p, N, K, first_row, seg_rows);
            const double flops = 2.0 * valid * N * K, bytes = double(E * N * K + valid * K + 2 * valid * N);
            const double floor_us = c.floor_us(flops, bytes);
            std::printf(
                "EP%-3d %4lldx%-4lld %7d %7lld %7lld %6.1f us %7.0f %5.0f%% %6.1f us %6.1f us %5.1f us   unpaired "
                "%.1f us\n",
                ep, (long long)N, (long long)K, E, (long long)valid, (long long)rows, us, flops / us / 1e6,
                100 * flops / (c.peak_tflops * 1e6) / us, dense_us, cub_us, floor_us, unpaired_us);
            rows_out.push_back({{"kind", "grouped_contiguous"},
                                {"ep", ep},
                                {"experts", E},
                                {"valid_m", valid},
                                {"padded_rows", rows},
                                {"N", N},
                                {"K", K},
                                {"fanout", c.figures(us, flops, bytes)},
                                {"tile_128x256_unpaired_us", unpaired_us},
                                {"dense_same_rows_us", dense_us},
                                {"cublaslt_per_expert_us", cub_us},
                                {"roofline_floor_us", floor_us}});
        }
    }
    return rows_out;
}

}  // namespace

const char* data_name(KernelsBenchOptions::Data d) {
    for (const auto& [name, value] : kDataNames)
        if (value == d) return name;
    return "?";
}

std::vector<int32_t> anchor_counts(int E, int expected, int valid, uint32_t seed) {
    const int lo = expected * 7 / 10, hi = anchor_count_max(expected);
    FANOUT_CHECK(E >= 1 && int64_t{E} * lo <= valid && valid <= int64_t{E} * hi,
                 "anchor_counts: {} rows cannot be {} groups of {}..{}", valid, E, lo, hi);
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> dist(lo, hi);
    std::vector<int32_t> counts(static_cast<size_t>(E));
    int64_t total = 0;
    for (auto& v : counts) total += v = dist(rng);
    for (size_t e = 0; total != valid; e = (e + 1) % counts.size()) {
        const int step = total < valid ? 1 : -1;
        if (counts[e] + step < lo || counts[e] + step > hi) continue;
        counts[e] += step;
        total += step;
    }
    return counts;
}

ops::GemmConfig parse_gemm_config(const std::string& text) {
    ops::GemmConfig g;
    int at = 0, more = 0;
    bool ok = std::sscanf(text.c_str(), "%dx%d/%n", &g.block_m, &g.block_n, &at) == 2 && at > 0;
    if (ok && text.compare(size_t(at), 2, "sk") == 0) {  // stream-K
        g.stream_k = true;
        at += 2;
    } else if (ok) {
        ok = std::sscanf(text.c_str() + at, "%d%n", &g.splits, &more) == 1;
        at += more;
    }
    if (ok && at < int(text.size())) {
        char c = 0;
        ok = std::sscanf(text.c_str() + at, "%c%d%n", &c, &g.cluster, &more) == 2 && c == 'c' &&
             at + more == int(text.size());
    }
    FANOUT_CHECK(ok && g.block_m > 0 && g.block_n > 0 && g.splits > 0 && g.cluster > 0,
                 "bad GEMM config '{}': expected BMxBN/SPLITS[cCLUSTER] or BMxBN/sk[cCLUSTER] (stream-K), e.g. "
                 "128x256/1c2",
                 text);
    return g;
}

GpuCeilings measure_gpu_ceilings() {
    Context c;
    FANOUT_CUDA_CHECK(cudaStreamCreate(&c.stream));
    FANOUT_CUBLAS_CHECK(cublasLtCreate(&c.lt));
    c.ws = std::make_unique<DevicePtr<uint8_t>>(c.wsize);
    measure_ceilings(c);
    GpuCeilings g;
    g.copy_gbs = c.bw_gbs;
    g.fp8_tflops = c.peak_tflops;
    // The bf16 tensor-core rate through the BF16 GEMM the model uses (cuBLASLt), 8192³.
    const int64_t big = 8192;
    DevicePtr<uint16_t> a(size_t(big * big)), b(size_t(big * big)), y(size_t(big * big));
    // Random operands: constant ones draw less power and clock higher than a real GEMM.
    ops::launch_random_bf16(a.p, size_t(big * big), 1.0f, 1, c.stream);
    ops::launch_random_bf16(b.p, size_t(big * big), 1.0f, 2, c.stream);
    ops::DeviceContext blas(c.stream);
    const double us = time_graph_us(c.stream, 5, [&] { ops::launch_gemm_bf16(blas, a.p, b.p, y.p, big, big, big); });
    g.bf16_tflops = 2.0 * big * big * big / us / 1e6;
    cublasLtDestroy(c.lt);
    cudaStreamDestroy(c.stream);
    return g;
}

int run_kernels_bench(const KernelsBenchOptions& opts) {
    require_gpu("fanout bench kernels");
    Context c;
    c.data = opts.data;
    c.draws = opts.draws;
    c.hot = opts.hot;
    FANOUT_CUDA_CHECK(cudaStreamCreate(&c.stream));
    FANOUT_CUBLAS_CHECK(cublasLtCreate(&c.lt));
    c.ws = std::make_unique<DevicePtr<uint8_t>>(c.wsize);
    cudaDeviceProp prop{};
    FANOUT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    measure_ceilings(c);
    std::printf(
        "%s, %d SMs: copy %.0f GB/s (read + write), read %.0f GB/s, cuBLASLt tensor-wise FP8 %.0f TFLOP/s "
        "(8192^3)\n\n",
        prop.name, prop.multiProcessorCount, c.bw_gbs, c.read_gbs, c.peak_tflops);
    nlohmann::json out = {{"benchmark", "kernels"},
                          {"gpu", prop.name},
                          {"copy_gbs", c.bw_gbs},
                          {"read_gbs", c.read_gbs},
                          {"fp8_tensorwise_tflops", c.peak_tflops},
                          {"data", data_name(opts.data)},
                          {"grouped_masked_hot", opts.hot}};
    if (opts.dense) out["dense"] = bench_dense(c, opts);
    if (opts.grouped) {
        out["grouped"] = bench_grouped(c);
        out["grouped_contiguous"] = bench_grouped_contiguous(c);
    }
    if (!opts.json_out.empty()) {
        std::ofstream(opts.json_out) << out.dump(2) << "\n";
        std::printf("wrote %s\n", opts.json_out.c_str());
    }
    cublasLtDestroy(c.lt);
    cudaStreamDestroy(c.stream);
    return 0;
}

}  // namespace fanout::bench

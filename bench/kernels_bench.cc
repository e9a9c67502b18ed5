// kernels_bench: fanout's FP8 block-scaled GEMM beside the cuBLASLt anchor (issue 5), measured on
// this GPU in the same run as its ceilings: y[M, N] (bf16) = x[M, K] · W[N, K]ᵀ with e4m3 operands, activation scales per 1×128
// (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F) and weight scales per 128×128 (BLK128x128_32F) — the
// library a user would pick — over the six DeepSeek-V3 shapes of REFERENCE.md §3 at M = 64 … 4096,
// beside DeepGEMM's figures from REFERENCE.md. Ceilings: a 16-byte-access copy kernel's bandwidth
// (bytes read + written) and cuBLASLt's tensor-wise FP8 rate on 8192³. Every timing is the best of 5
// replays of a CUDA graph of 50 calls (as the anchors were taken); operands are random e4m3, the
// same buffers each call (shapes whose weights fit the 60 MB L2 run cache-warm, as in the anchors).
// fanout's kernel (`launch_gemm_fp8`, the plain SIMT one until the tensor-core kernels land) runs
// on the same operands. Timing only: the kernels' numbers are checked by ops_cuda_test.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "fanout/core/cuda_check.h"
#include "fanout/core/dtype.h"
#include "fanout/core/error.h"
#include "fanout/ops/gemm.h"

void launch_copy16(const void* src, void* dst, size_t bytes, cudaStream_t stream);  // copy_kernel.cu

namespace {

#define CUBLAS_CHECK(stmt)                                                                              \
    do {                                                                                               \
        const cublasStatus_t st_ = (stmt);                                                             \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                              \
            ::fanout::throw_api_error(__FILE__, __LINE__, "cuBLASLt", #stmt, static_cast<int>(st_),     \
                                      cublasLtGetStatusString(st_));                                   \
    } while (0)

struct Shape {
    int64_t n, k;
    const char* name;
    double deepgemm_us[5];  // REFERENCE.md §3, at M = 64, 128, 256, 1024, 4096
};
constexpr int64_t kMs[5] = {64, 128, 256, 1024, 4096};
constexpr Shape kShapes[6] = {
    {2112, 7168, "fused qkv_a", {10.5, 11.3, 13.4, 32.5, 95.7}},
    {24576, 1536, "q_b", {11.3, 12.0, 21.4, 64.7, 239.2}},
    {32768, 512, "kv_b", {7.2, 9.2, 13.0, 37.9, 130.9}},
    {7168, 16384, "o_proj", {38.4, 46.3, 61.6, 201.7, 672.2}},
    {4096, 7168, "shared gate+up", {12.0, 13.2, 17.7, 45.7, 171.7}},
    {7168, 2048, "shared down", {6.6, 8.8, 11.1, 30.2, 93.8}},
};

template <typename Fn>
double time_graph_us(cudaStream_t s, int calls, Fn&& fn) {
    for (int i = 0; i < 3; ++i) fn();
    FANOUT_CUDA_CHECK(cudaStreamSynchronize(s));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    FANOUT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < calls; ++i) fn();
    FANOUT_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    FANOUT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t a, b;
    FANOUT_CUDA_CHECK(cudaEventCreate(&a));
    FANOUT_CUDA_CHECK(cudaEventCreate(&b));
    float best = 1e30f;
    for (int r = 0; r < 5; ++r) {
        FANOUT_CUDA_CHECK(cudaEventRecord(a, s));
        FANOUT_CUDA_CHECK(cudaGraphLaunch(exec, s));
        FANOUT_CUDA_CHECK(cudaEventRecord(b, s));
        FANOUT_CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        FANOUT_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        best = std::min(best, ms);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return best * 1000.0 / calls;
}

// Fewer graph calls for the slow plain kernel at large M (its time is in milliseconds there).
int own_calls(int64_t m) { return m >= 1024 ? 3 : 20; }

void* device_random_fp8(size_t n, uint64_t seed) {
    std::vector<uint8_t> h(n);
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    for (auto& v : h) v = fanout::f32_to_fp8e4m3(d(rng) * 64.0f);
    void* p = nullptr;
    FANOUT_CUDA_CHECK(cudaMalloc(&p, n));
    FANOUT_CUDA_CHECK(cudaMemcpy(p, h.data(), n, cudaMemcpyHostToDevice));
    return p;
}

float* device_scales(size_t n) {
    std::vector<float> h(n);
    std::mt19937_64 rng(n);
    std::uniform_real_distribution<float> d(0.5f, 1.5f);
    for (auto& v : h) v = d(rng) / 448.0f;
    float* p = nullptr;
    FANOUT_CUDA_CHECK(cudaMalloc(&p, n * sizeof(float)));
    FANOUT_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    return p;
}

// One FP8 GEMM through cuBLASLt; `blockwise` picks VEC128 / BLK128x128 scales, else tensor-wise.
// Column-major view: C[N, M] = Aᵀ · B with A = W ([K, N] column-major, transposed) and B = x.
struct Fp8Gemm {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    cublasLtMatmulHeuristicResult_t algo{};
    bool ok = false;

    Fp8Gemm(cublasLtHandle_t lt, int64_t m, int64_t n, int64_t k, bool blockwise, const float* sa, const float* sb,
            size_t workspace) {
        CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof(nt)));
        if (blockwise) {
            const cublasLtMatmulMatrixScale_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
            const cublasLtMatmulMatrixScale_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode)));
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode)));
        }
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, n, k));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, m, k));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, n, m, n));
        cublasLtMatmulPreference_t pref;
        CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                          sizeof(workspace)));
        int found = 0;
        const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &algo, &found);
        ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
        cublasLtMatmulPreferenceDestroy(pref);
    }
    ~Fp8Gemm() {
        if (la) cublasLtMatrixLayoutDestroy(la);
        if (lb) cublasLtMatrixLayoutDestroy(lb);
        if (lc) cublasLtMatrixLayoutDestroy(lc);
        if (desc) cublasLtMatmulDescDestroy(desc);
    }
    void run(cublasLtHandle_t lt, const void* w, const void* x, void* y, void* ws, size_t wsize, cudaStream_t s) {
        const float one = 1.0f, zero = 0.0f;
        CUBLAS_CHECK(cublasLtMatmul(lt, desc, &one, w, la, x, lb, &zero, y, lc, y, lc, &algo.algo, ws, wsize, s));
    }
};

}  // namespace

int main(int argc, char** argv) {
    const std::string json_out = argc > 1 ? argv[1] : "kernels_bench.json";
    try {
        cudaStream_t s;
        FANOUT_CUDA_CHECK(cudaStreamCreate(&s));
        cublasLtHandle_t lt;
        CUBLAS_CHECK(cublasLtCreate(&lt));
        const size_t wsize = 32u << 20;
        void* ws = nullptr;
        FANOUT_CUDA_CHECK(cudaMalloc(&ws, wsize));
        cudaDeviceProp prop{};
        FANOUT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));

        // Ceilings.
        const size_t copy_bytes = size_t{2} << 30;
        void *c0 = nullptr, *c1 = nullptr;
        FANOUT_CUDA_CHECK(cudaMalloc(&c0, copy_bytes));
        FANOUT_CUDA_CHECK(cudaMalloc(&c1, copy_bytes));
        FANOUT_CUDA_CHECK(cudaMemset(c0, 1, copy_bytes));
        const double copy_us = time_graph_us(s, 10, [&] {
            launch_copy16(c0, c1, copy_bytes, s);
            FANOUT_CUDA_CHECK(cudaGetLastError());
        });
        const double bw_gbs = 2.0 * copy_bytes / copy_us / 1e3;
        cudaFree(c0);
        cudaFree(c1);
        const int64_t big = 8192;
        void* ba = device_random_fp8(size_t(big * big), 1);
        void* bb = device_random_fp8(size_t(big * big), 2);
        void* bc = nullptr;
        FANOUT_CUDA_CHECK(cudaMalloc(&bc, size_t(big * big) * 2));
        float* unit = device_scales(1);
        Fp8Gemm peak(lt, big, big, big, false, unit, unit, wsize);
        FANOUT_CHECK(peak.ok, "cuBLASLt has no tensor-wise FP8 algorithm for 8192^3");
        const double peak_us = time_graph_us(s, 10, [&] { peak.run(lt, ba, bb, bc, ws, wsize, s); });
        const double peak_tflops = 2.0 * big * big * big / peak_us / 1e6;
        cudaFree(ba);
        cudaFree(bb);
        cudaFree(bc);
        std::printf("%s: copy %.0f GB/s (read + write), cuBLASLt tensor-wise FP8 %.0f TFLOP/s (8192^3)\n\n", prop.name,
                    bw_gbs, peak_tflops);

        nlohmann::json rows = nlohmann::json::array();
        std::printf("%-16s %5s %10s %9s %9s %8s %8s %10s %8s %12s\n", "shape", "M", "cuBLASLt", "TFLOP/s", "GB/s", "%mem",
                    "%fp8", "DeepGEMM", "floor", "fanout");
        double sums[5] = {}, dg_sums[5] = {}, floor_sums[5] = {}, own_sums[5] = {};
        for (const Shape& sh : kShapes) {
            void* w = device_random_fp8(size_t(sh.n * sh.k), 3);
            float* sw = device_scales(size_t((sh.n + 127) / 128 + 4) * size_t((sh.k + 127) / 128 + 4));
            for (int mi = 0; mi < 5; ++mi) {
                const int64_t M = kMs[mi];
                void* x = device_random_fp8(size_t(M * sh.k), 4);
                float* sx = device_scales(size_t(M + 128) * size_t((sh.k + 127) / 128 + 4));
                void* y = nullptr;
                FANOUT_CUDA_CHECK(cudaMalloc(&y, size_t(M * sh.n) * 2));
                Fp8Gemm g(lt, M, sh.n, sh.k, true, sw, sx, wsize);
                double us = -1;
                if (g.ok) us = time_graph_us(s, 50, [&] { g.run(lt, w, x, y, ws, wsize, s); });
                const double own_us = time_graph_us(s, own_calls(M), [&] {
                    fanout::ops::launch_gemm_fp8(static_cast<const uint8_t*>(x), sx, static_cast<const uint8_t*>(w), sw,
                                                 static_cast<uint16_t*>(y), int(M), int(sh.n), int(sh.k), s);
                });
                const double flops = 2.0 * M * sh.n * sh.k, bytes = double(M * sh.k + sh.n * sh.k + 2 * M * sh.n);
                const double floor_us = std::max(bytes / (bw_gbs * 1e3), flops / (peak_tflops * 1e6));
                std::printf("%-16s %5lld %8.1f us %9.1f %9.0f %7.0f%% %7.0f%% %8.1f us %6.1f us %9.1f us%s\n", sh.name,
                            (long long)M, us, flops / us / 1e6, bytes / us / 1e3, 100 * bytes / (bw_gbs * 1e3) / us,
                            100 * flops / (peak_tflops * 1e6) / us, sh.deepgemm_us[mi], floor_us, own_us,
                            g.ok ? "" : "  (no blockwise algorithm)");
                rows.push_back({{"shape", sh.name}, {"N", sh.n}, {"K", sh.k}, {"M", M}, {"cublaslt_us", us},
                                {"tflops", flops / us / 1e6}, {"gbs", bytes / us / 1e3},
                                {"roofline_floor_us", floor_us}, {"deepgemm_us_reference_md", sh.deepgemm_us[mi]},
                                {"fanout_gemm_fp8_us", own_us}});
                sums[mi] += us;
                own_sums[mi] += own_us;
                dg_sums[mi] += sh.deepgemm_us[mi];
                floor_sums[mi] += floor_us;
                cudaFree(x);
                cudaFree(sx);
                cudaFree(y);
            }
            cudaFree(w);
            cudaFree(sw);
        }
        std::printf("\nsum over the six shapes: ");
        for (int mi = 0; mi < 5; ++mi)
            std::printf("M=%lld cuBLASLt %.1f / DeepGEMM %.1f / floor %.1f / fanout %.1f us; ", (long long)kMs[mi],
                        sums[mi], dg_sums[mi], floor_sums[mi], own_sums[mi]);
        std::printf("\n");
        nlohmann::json out = {{"benchmark", "kernels_fp8_gemm"},
                              {"gpu", prop.name},
                              {"copy_gbs", bw_gbs},
                              {"fp8_tensorwise_tflops", peak_tflops},
                              {"rows", rows}};
        std::ofstream(json_out) << out.dump(2) << "\n";
        std::printf("wrote %s\n", json_out.c_str());
        cublasLtDestroy(lt);
        cudaFree(ws);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
    return 0;
}

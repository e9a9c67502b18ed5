// The MoE router's GEMM (logits f32 [M, 256] = x bf16 [M, 7,168] · W bf16 [256, 7,168]ᵀ) through
// cuBLASLt: the heuristic's first algorithm (what DeviceContext::blas_plan runs), every algorithm
// the heuristic offers, and the first one with its split-K count forced (ALGO_CONFIG_SPLITK_NUM,
// checked by cublasLtMatmulAlgoCheck). Each timing: a CUDA graph of 20 calls, best of 5 replays.
// Twenty-second session, issue 19 item 5 (the layer's `gate` reads 10-13 µs against a ~2 µs floor).
// Build: nvcc -O2 -std=c++17 -o build/gate_probe docs/bench/tbl19/gate_probe.cu -lcublasLt
// Run:   build/gate_probe
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                          \
    do {                                                                               \
        auto e_ = (x);                                                                 \
        if (e_ != 0) {                                                                 \
            std::printf("%s:%d %s -> %d\n", __FILE__, __LINE__, #x, static_cast<int>(e_)); \
            std::exit(1);                                                              \
        }                                                                              \
    } while (0)

static cublasLtHandle_t h;
static void* ws;
static const size_t kWs = size_t{32} << 20;

struct Plan {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
};

static Plan make_plan(int M, int N, int K) {
    Plan p;
    CK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t t = CUBLAS_OP_T;
    CK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    CK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, K, N, K));
    CK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, K, M, K));
    CK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, N, M, N));
    return p;
}

static float time_algo(const Plan& p, const cublasLtMatmulAlgo_t& algo, const void* w, const void* x, float* y,
                       cudaStream_t s) {
    const float one = 1.0f, zero = 0.0f;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < 20; ++i)
        if (cublasLtMatmul(h, p.desc, &one, w, p.a, x, p.b, &zero, y, p.c, y, p.c, &algo, ws, kWs, s) != 0) {
            cudaStreamEndCapture(s, &g);
            cudaGetLastError();
            return -1.0f;
        }
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float best = 1e9f;
    for (int r = 0; r < 6; ++r) {
        cudaEventRecord(e0, s);
        CK(cudaGraphLaunch(ge, s));
        cudaEventRecord(e1, s);
        CK(cudaEventSynchronize(e1));
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        if (r > 0 && ms < best) best = ms;
    }
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    return best * 1000.0f / 20.0f;
}

static void describe(const cublasLtMatmulAlgo_t& a, char* out, size_t n) {
    int id = 0, tile = 0, split = 0, red = 0, stages = 0;
    size_t w;
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof(split), &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof(red), &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &w);
    std::snprintf(out, n, "algo %d tile %d splitk %d reduction %d stages %d", id, tile, split, red, stages);
}

int main() {
    CK(cublasLtCreate(&h));
    CK(cudaMalloc(&ws, kWs));
    const int N = 256, K = 7168, kMaxM = 512;
    std::vector<__nv_bfloat16> hx(size_t{kMaxM} * K), hw(size_t{N} * K);
    srand(1);
    for (auto& v : hx) v = __float2bfloat16((rand() % 2001 - 1000) / 1000.0f);
    for (auto& v : hw) v = __float2bfloat16((rand() % 2001 - 1000) / 30000.0f);
    void *x, *w;
    float* y;
    CK(cudaMalloc(&x, hx.size() * 2));
    CK(cudaMalloc(&w, hw.size() * 2));
    CK(cudaMalloc(&y, size_t{kMaxM} * N * 4));
    CK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(w, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int M : {16, 64, 128, 256, 512}) {
        Plan p = make_plan(M, N, K);
        cublasLtMatmulPreference_t pref;
        CK(cublasLtMatmulPreferenceCreate(&pref));
        CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWs, sizeof(kWs)));
        cublasLtMatmulHeuristicResult_t res[32];
        int found = 0;
        CK(cublasLtMatmulAlgoGetHeuristic(h, p.desc, p.a, p.b, p.c, p.c, pref, 32, res, &found));
        std::printf("M %d N %d K %d: %d algorithms offered\n", M, N, K, found);
        char d[128];
        for (int i = 0; i < found; ++i) {
            describe(res[i].algo, d, sizeof d);
            std::printf("  #%-2d %-60s ws %7zu waves %5.2f  %7.2f us\n", i, d, res[i].workspaceSize,
                        res[i].wavesCount, time_algo(p, res[i].algo, w, x, y, s));
        }
        // DeviceContext::blas_plan's rule (device_context.cc, split_k): where the first offer fills
        // under half of the GPU, the first offer that takes a split, ~one wave of splits (<= 16,
        // >= 256 of K each), f32 partials in the workspace.
        if (res[0].wavesCount < 0.5f) {
            for (int i = 0; i < found && i < 8; ++i) {
                int support = 0;
                size_t wr;
                cublasLtMatmulAlgoCapGetAttribute(&res[i].algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &support,
                                                  sizeof(support), &wr);
                if (!support || !(res[i].wavesCount > 0.0f)) continue;
                int split = static_cast<int>(res[i].wavesCount < 1.0f / 16 ? 16 : 1.0f / res[i].wavesCount);
                while (split > 1 && K / split < 256) --split;
                if (split < 2) continue;
                cublasLtMatmulAlgo_t a = res[i].algo;
                const uint32_t red = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
                cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof(split));
                cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof(red));
                cublasLtMatmulHeuristicResult_t chk{};
                if (cublasLtMatmulAlgoCheck(h, p.desc, p.a, p.b, p.c, p.c, &a, &chk) != 0 || chk.workspaceSize > kWs)
                    continue;
                describe(a, d, sizeof d);
                std::printf("  blas_plan's rule: offer #%d, %s  %7.2f us\n", i, d, time_algo(p, a, w, x, y, s));
                break;
            }
        }
        for (int split : {2, 4, 7, 8, 14, 16, 28, 32}) {
            cublasLtMatmulAlgo_t a = res[0].algo;
            cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof(split));
            for (uint32_t red : {CUBLASLT_REDUCTION_SCHEME_INPLACE, CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE,
                                 CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE}) {
                cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof(red));
                cublasLtMatmulHeuristicResult_t chk{};
                if (cublasLtMatmulAlgoCheck(h, p.desc, p.a, p.b, p.c, p.c, &a, &chk) != 0) {
                    std::printf("  first, split %2d reduction %u: not supported\n", split, red);
                    continue;
                }
                std::printf("  first, split %2d reduction %u: ws %7zu waves %5.2f  %7.2f us\n", split, red,
                            chk.workspaceSize, chk.wavesCount, time_algo(p, a, w, x, y, s));
            }
        }
        cublasLtMatmulPreferenceDestroy(pref);
    }
    std::printf("floor at 4.4 TB/s read: W %.2f us\n", double(N) * K * 2 / 4.4e6);
    return 0;
}

// Probe: cuBLASLt algorithms for the MoE router's gate, y[M,256] f32 = x[M,7168] bf16 · W[256,7168]^T,
// the heuristic's results and split-K variants of them, each timed (graph of 20 launches).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>
#define CK(x)                                                               \
    do {                                                                    \
        auto e = (x);                                                       \
        if (e != 0) {                                                       \
            std::printf("error %d at %s:%d\n", int(e), __FILE__, __LINE__); \
            return 1;                                                       \
        }                                                                   \
    } while (0)
int main() {
    cublasLtHandle_t lt;
    CK(cublasLtCreate(&lt));
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    const int N = 256, K = 7168;
    void *x, *w, *y, *ws;
    size_t wsb = 32 << 20;
    CK(cudaMalloc(&x, 256 * K * 2));
    CK(cudaMalloc(&w, N * K * 2));
    CK(cudaMalloc(&y, 256 * N * 4));
    CK(cudaMalloc(&ws, wsb));
    CK(cudaMemset(x, 0x3c, 256 * K * 2));
    CK(cudaMemset(w, 0x3c, N * K * 2));
    for (int M : {16, 64, 128, 256}) {
        cublasLtMatmulDesc_t d;
        CK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t t = CUBLAS_OP_T;
        CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
        cublasLtMatrixLayout_t a, b, c;
        CK(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, K, N, K));
        CK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, K, M, K));
        CK(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, N, M, N));
        cublasLtMatmulPreference_t pref;
        CK(cublasLtMatmulPreferenceCreate(&pref));
        CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
        cublasLtMatmulHeuristicResult_t r[16];
        int found = 0;
        CK(cublasLtMatmulAlgoGetHeuristic(lt, d, a, b, c, c, pref, 16, r, &found));
        auto time = [&](const cublasLtMatmulAlgo_t& algo) -> double {
            const float one = 1, zero = 0;
            if (cublasLtMatmul(lt, d, &one, w, a, x, b, &zero, y, c, y, c, &algo, ws, wsb, s) != 0) return -1;
            cudaGraph_t g;
            cudaGraphExec_t ge;
            cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
            for (int i = 0; i < 20; ++i) cublasLtMatmul(lt, d, &one, w, a, x, b, &zero, y, c, y, c, &algo, ws, wsb, s);
            cudaStreamEndCapture(s, &g);
            cudaGraphInstantiate(&ge, g, 0);
            cudaGraphLaunch(ge, s);
            cudaStreamSynchronize(s);
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0);
            cudaEventCreate(&e1);
            double best = 1e30;
            for (int rep = 0; rep < 5; ++rep) {
                cudaEventRecord(e0, s);
                cudaGraphLaunch(ge, s);
                cudaEventRecord(e1, s);
                cudaEventSynchronize(e1);
                float ms;
                cudaEventElapsedTime(&ms, e0, e1);
                best = std::min(best, ms * 1000.0 / 20);
            }
            cudaGraphExecDestroy(ge);
            cudaGraphDestroy(g);
            return best;
        };
        for (int i = 0; i < found; ++i) {
            int id = 0, tile = 0, splitk = 0;
            size_t wr;
            cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &wr);
            cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &wr);
            cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk),
                                                 &wr);
            std::printf("M %3d heuristic #%d id %d tile %d splitk %d: %.2f us\n", M, i, id, tile, splitk,
                        time(r[i].algo));
            for (int sk : {2, 4, 8, 16, 32}) {
                cublasLtMatmulAlgo_t al = r[i].algo;
                if (cublasLtMatmulAlgoConfigSetAttribute(&al, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof(sk)) != 0)
                    continue;
                uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
                cublasLtMatmulAlgoConfigSetAttribute(&al, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                                     sizeof(scheme));
                cublasLtMatmulHeuristicResult_t chk{};
                if (cublasLtMatmulAlgoCheck(lt, d, a, b, c, c, &al, &chk) != 0) {
                    continue;
                }
                std::printf("M %3d   #%d splitk %2d (output-type reduction): %.2f us\n", M, i, sk, time(al));
                scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
                cublasLtMatmulAlgoConfigSetAttribute(&al, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                                     sizeof(scheme));
                if (cublasLtMatmulAlgoCheck(lt, d, a, b, c, c, &al, &chk) == 0)
                    std::printf("M %3d   #%d splitk %2d (compute-type reduction, workspace): %.2f us\n", M, i, sk,
                                time(al));
            }
        }
    }
    return 0;
}

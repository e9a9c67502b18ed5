// The BF16 GEMM (gemm.h) through cuBLASLt: a column-major view, D[N, M] = Wᵀ · x with W read
// transposed, C = the residual with beta = 1 when there is one. The heuristic's algorithm is
// cached per shape, the handle and a 32 MB workspace per host thread.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <tuple>

#include "fanout/core/cuda_check.h"
#include "fanout/core/error.h"
#include "fanout/ops/cublas_check.h"
#include "fanout/ops/gemm.h"

namespace fanout::ops {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    ~Plan() {
        if (a) cublasLtMatrixLayoutDestroy(a);
        if (b) cublasLtMatrixLayoutDestroy(b);
        if (c) cublasLtMatrixLayoutDestroy(c);
        if (desc) cublasLtMatmulDescDestroy(desc);
    }
};

struct Context {
    cublasLtHandle_t handle = nullptr;
    void* workspace = nullptr;
    std::map<std::tuple<int, int, int, bool>, std::unique_ptr<Plan>> plans;
    Context() {
        FANOUT_CUBLAS_CHECK(cublasLtCreate(&handle));
        FANOUT_CUDA_CHECK(cudaMalloc(&workspace, kWorkspaceBytes));
    }
    ~Context() {
        plans.clear();
        cudaFree(workspace);
        cublasLtDestroy(handle);
    }

    // f32_out: D in f32 (the router's logits), else bf16.
    const Plan& plan(int M, int N, int K, bool f32_out) {
        auto& slot = plans[{M, N, K, f32_out}];
        if (slot) return *slot;
        auto p = std::make_unique<Plan>();
        FANOUT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t t = CUBLAS_OP_T;
        FANOUT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
        FANOUT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, K, N, K));
        FANOUT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, K, M, K));
        FANOUT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, f32_out ? CUDA_R_32F : CUDA_R_16BF, N, M, N));
        cublasLtMatmulPreference_t pref;
        FANOUT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        FANOUT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                 &kWorkspaceBytes, sizeof(kWorkspaceBytes)));
        cublasLtMatmulHeuristicResult_t result{};
        int found = 0;
        const cublasStatus_t st =
            cublasLtMatmulAlgoGetHeuristic(handle, p->desc, p->a, p->b, p->c, p->c, pref, 1, &result, &found);
        cublasLtMatmulPreferenceDestroy(pref);
        FANOUT_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0, "cuBLASLt has no BF16 algorithm for M {} N {} K {}", M,
                     N, K);
        p->algo = result.algo;
        slot = std::move(p);
        return *slot;
    }
};

}  // namespace

void launch_gemm_bf16(const uint16_t* x, const uint16_t* w, uint16_t* y, int M, int N, int K, void* cuda_stream,
                      const uint16_t* residual) {
    FANOUT_CHECK(M >= 0 && N > 0 && K > 0, "gemm_bf16: bad shape M {} N {} K {}", M, N, K);
    if (M == 0) return;
    thread_local Context ctx;
    const Plan& p = ctx.plan(M, N, K, false);
    const float one = 1.0f, zero = 0.0f;
    const void* c = residual != nullptr ? static_cast<const void*>(residual) : static_cast<const void*>(y);
    FANOUT_CUBLAS_CHECK(cublasLtMatmul(ctx.handle, p.desc, &one, w, p.a, x, p.b, residual != nullptr ? &one : &zero, c,
                                       p.c, y, p.c, &p.algo, ctx.workspace, kWorkspaceBytes,
                                       static_cast<cudaStream_t>(cuda_stream)));
}

void launch_gemm_bf16_f32(const uint16_t* x, const uint16_t* w, float* y, int M, int N, int K, void* cuda_stream) {
    FANOUT_CHECK(M >= 0 && N > 0 && K > 0, "gemm_bf16_f32: bad shape M {} N {} K {}", M, N, K);
    if (M == 0) return;
    thread_local Context ctx;
    const Plan& p = ctx.plan(M, N, K, true);
    const float one = 1.0f, zero = 0.0f;
    FANOUT_CUBLAS_CHECK(cublasLtMatmul(ctx.handle, p.desc, &one, w, p.a, x, p.b, &zero, y, p.c, y, p.c, &p.algo,
                                       ctx.workspace, kWorkspaceBytes, static_cast<cudaStream_t>(cuda_stream)));
}

}  // namespace fanout::ops

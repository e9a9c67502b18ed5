#include "fanout/ops/device_context.h"

#include "fanout/core/cuda_check.h"
#include "fanout/core/error.h"
#include "fanout/ops/cublas_check.h"

namespace fanout::ops {

BlasPlan::~BlasPlan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (desc) cublasLtMatmulDescDestroy(desc);
}

DeviceContext::DeviceContext() {
    FANOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    owns_stream_ = true;
    init();
}

DeviceContext::DeviceContext(cudaStream_t stream) : stream_(stream) { init(); }

void DeviceContext::init() {
    FANOUT_CUDA_CHECK(cudaGetDevice(&device_));
    FANOUT_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_));
    FANOUT_CUBLAS_CHECK(cublasLtCreate(&blas_));
    FANOUT_CUDA_CHECK(cudaMalloc(&blas_workspace_, kBlasWorkspaceBytes));
}

DeviceContext::~DeviceContext() {
    plans_.clear();
    cudaFree(blas_workspace_);
    if (blas_) cublasLtDestroy(blas_);
    if (owns_stream_) cudaStreamDestroy(stream_);
}

size_t DeviceContext::workspace_bytes() {
    return kBlasWorkspaceBytes + GemmWorkspace::kDefaultBytes + MlaWorkspace::kDefaultBytes;
}

const BlasPlan& DeviceContext::blas_plan(int M, int N, int K, bool f32_out) {
    auto& slot = plans_[{M, N, K, f32_out}];
    if (slot) return *slot;
    // A column-major view: D[N, M] = Wᵀ · x with W read transposed.
    auto p = std::make_unique<BlasPlan>();
    FANOUT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T;
    FANOUT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    FANOUT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, K, N, K));
    FANOUT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, K, M, K));
    FANOUT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, f32_out ? CUDA_R_32F : CUDA_R_16BF, N, M, N));
    cublasLtMatmulPreference_t pref;
    FANOUT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = kBlasWorkspaceBytes;
    FANOUT_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(blas_, p->desc, p->a, p->b, p->c, p->c, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    FANOUT_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0, "cuBLASLt has no BF16 algorithm for M {} N {} K {}", M, N,
                 K);
    p->algo = result.algo;
    slot = std::move(p);
    return *slot;
}

}  // namespace fanout::ops

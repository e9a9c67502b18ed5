// The BF16 GEMM (gemm.h) through cuBLASLt on a DeviceContext (its handle, workspace and cached
// per-shape plan): C = the residual with beta = 1 when there is one.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "fanout/core/error.h"
#include "fanout/ops/cublas_check.h"
#include "fanout/ops/device_context.h"
#include "fanout/ops/gemm.h"

namespace fanout::ops {

void launch_gemm_bf16(DeviceContext& ctx, const uint16_t* x, const uint16_t* w, uint16_t* y, int M, int N, int K,
                      const uint16_t* residual) {
    FANOUT_CHECK(M >= 0 && N > 0 && K > 0, "gemm_bf16: bad shape M {} N {} K {}", M, N, K);
    if (M == 0) return;
    const BlasPlan& p = ctx.blas_plan(M, N, K, false);
    const float one = 1.0f, zero = 0.0f;
    const void* c = residual != nullptr ? static_cast<const void*>(residual) : static_cast<const void*>(y);
    FANOUT_CUBLAS_CHECK(cublasLtMatmul(ctx.blas_handle(), p.desc, &one, w, p.a, x, p.b,
                                       residual != nullptr ? &one : &zero, c, p.c, y, p.c, &p.algo,
                                       ctx.blas_workspace(), DeviceContext::kBlasWorkspaceBytes, ctx.stream()));
}

void launch_gemm_bf16_batched(DeviceContext& ctx, const StridedBatchedGemm& g) {
    FANOUT_CHECK(g.batch >= 1 && g.M >= 0 && g.N > 0 && g.K > 0 && g.ldx >= g.K && g.ldw >= g.K && g.ldy >= g.N,
                 "gemm_bf16_batched: bad shape batch {} M {} N {} K {} or row strides x {} w {} y {}", g.batch, g.M,
                 g.N, g.K, g.ldx, g.ldw, g.ldy);
    if (g.M == 0) return;
    const auto aligned = [](const void* ptr) { return ptr != nullptr && reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
    FANOUT_CHECK(aligned(g.x) && aligned(g.w) && aligned(g.y),
                 "gemm_bf16_batched: x, W and y must be device pointers on 16-byte boundaries");
    const BlasPlan& p = ctx.blas_batched_plan(g);
    const float one = 1.0f, zero = 0.0f;
    FANOUT_CUBLAS_CHECK(cublasLtMatmul(ctx.blas_handle(), p.desc, &one, g.w, p.a, g.x, p.b, &zero, g.y, p.c, g.y, p.c,
                                       &p.algo, ctx.blas_workspace(), DeviceContext::kBlasWorkspaceBytes,
                                       ctx.stream()));
}

void launch_gemm_bf16_f32(DeviceContext& ctx, const uint16_t* x, const uint16_t* w, float* y, int M, int N, int K) {
    FANOUT_CHECK(M >= 0 && N > 0 && K > 0, "gemm_bf16_f32: bad shape M {} N {} K {}", M, N, K);
    if (M == 0) return;
    if (gemv_bf16_f32_fits(x, w, M, N, K)) return launch_gemv_bf16_f32(x, w, y, M, N, K, ctx.stream());
    const BlasPlan& p = ctx.blas_plan(M, N, K, true);
    const float one = 1.0f, zero = 0.0f;
    FANOUT_CUBLAS_CHECK(cublasLtMatmul(ctx.blas_handle(), p.desc, &one, w, p.a, x, p.b, &zero, y, p.c, y, p.c, &p.algo,
                                       ctx.blas_workspace(), DeviceContext::kBlasWorkspaceBytes, ctx.stream()));
}

}  // namespace fanout::ops

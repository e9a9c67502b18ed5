// The FP8 block-scaled GEMM (gemm.h) through cuBLASLt where the tile table measured it faster
// (prefill sizes), and the DeviceContext launch that chooses between it and gemm_fp8_sm90.cu.
//
// cuBLASLt (12.9+, sm_90) takes DeepSeek's two scale granularities directly: W's per 128×128 block
// (BLK128x128_32F: [N/128][K/128] row-major, K's block count a multiple of 4 — the checkpoint's
// weight_scale_inv as it is when K % 512 == 0) and x's per 1×128 (VEC128_32F), but x's in the
// M-major order [K/128][M], the transpose of act_quant's [M][K/128]: one small kernel first
// (launch_transpose_scales).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "fanout/core/error.h"
#include "fanout/ops/cublas_check.h"
#include "fanout/ops/device_context.h"
#include "fanout/ops/fp8_quant.h"
#include "fanout/ops/gemm.h"

namespace fanout::ops {
namespace {

// cuBLASLt's heuristic picked the plan's algorithm for its default operand alignment.
bool aligned256(const void* p) { return reinterpret_cast<uintptr_t>(p) % 256 == 0; }

}  // namespace

bool launch_gemm_fp8_cublaslt(DeviceContext& ctx, const uint8_t* x, const float* sx, const uint8_t* w, const float* sw,
                              uint16_t* y, int M, int N, int K, const uint16_t* residual) {
    if (M <= 0 || N <= 0 || K <= 0 || K % 512 != 0 || N % 8 != 0) return false;
    const int kb = K / 128;
    if (size_t(M) * kb > DeviceContext::kFp8ScaleScratchFloats) return false;
    if (!aligned256(x) || !aligned256(w) || !aligned256(y) || reinterpret_cast<uintptr_t>(sw) % 16 != 0 ||
        (residual != nullptr && !aligned256(residual)))
        return false;
    const BlasPlan* p = ctx.blas_fp8_plan(M, N, K);
    if (p == nullptr) return false;
    float* sxt = ctx.fp8_scale_scratch();
    launch_transpose_scales(sx, sxt, M, kb, ctx.stream());
    FANOUT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof(sw)));
    const float* sxt_c = sxt;
    FANOUT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sxt_c, sizeof(sxt_c)));
    const float one = 1.0f, zero = 0.0f;
    const void* c = residual != nullptr ? static_cast<const void*>(residual) : static_cast<const void*>(y);
    FANOUT_CUBLAS_CHECK(cublasLtMatmul(ctx.blas_handle(), p->desc, &one, w, p->a, x, p->b,
                                       residual != nullptr ? &one : &zero, c, p->c, y, p->c, &p->algo,
                                       ctx.blas_workspace(), DeviceContext::kBlasWorkspaceBytes, ctx.stream()));
    return true;
}

void launch_gemm_fp8(DeviceContext& ctx, const uint8_t* x, const float* sx, const uint8_t* w, const float* sw,
                     uint16_t* y, int M, int N, int K, const uint16_t* residual) {
    if (M <= 0 || N <= 0) return;
    const GemmConfig cfg = pick_gemm_config(M, N, K, ctx.sm_count(), true);
    if (cfg.cublaslt && launch_gemm_fp8_cublaslt(ctx, x, sx, w, sw, y, M, N, K, residual)) return;
    launch_gemm_fp8(x, sx, w, sw, y, M, N, K, ctx.stream(), residual, &ctx.gemm_workspace(), cfg);
}

}  // namespace fanout::ops

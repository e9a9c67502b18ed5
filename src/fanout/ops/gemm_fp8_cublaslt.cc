// The FP8 block-scaled GEMM (gemm.h) through cuBLASLt where the tile table measured it faster
// (prefill sizes), and the DeviceContext launch that chooses between it and gemm_fp8_sm90.cu.
//
// cuBLASLt (12.9+, sm_90) takes DeepSeek's two scale granularities directly: W's per 128×128 block
// (BLK128x128_32F: [N/128][K/128] row-major, K's block count a multiple of 4 — the checkpoint's
// weight_scale_inv as it is when K % 512 == 0) and x's per 1×128 (VEC128_32F), but x's in the
// M-major order [K/128][M] (ScaleOrder::kMMajor). The model's quantizations write that order in
// front of the projections cuBLASLt runs (gemm_fp8_scale_order); row-major scales are transposed
// first (launch_transpose_scales), and so are M-major ones when the tile kernel runs instead.
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

bool launch_gemm_fp8_cublaslt(DeviceContext& ctx, const uint8_t* x, const float* sx, ScaleOrder sx_order,
                              const uint8_t* w, const float* sw, uint16_t* y, int M, int N, int K,
                              const uint16_t* residual) {
    if (M <= 0 || !gemm_fp8_cublaslt_shape(N, K)) return false;
    const int kb = K / 128;
    const bool transpose = sx_order == ScaleOrder::kRowMajor;
    if (transpose && size_t(M) * kb > DeviceContext::kFp8ScaleScratchFloats) return false;
    const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    if (!aligned256(x) || !aligned256(w) || !aligned256(y) || !aligned16(sw) || (!transpose && !aligned16(sx)) ||
        (residual != nullptr && !aligned256(residual)))
        return false;
    const BlasPlan* p = ctx.blas_fp8_plan(M, N, K);
    if (p == nullptr) return false;
    const float* sxt = sx;
    if (transpose) {
        launch_transpose_scales(sx, ctx.fp8_scale_scratch(), M, kb, ctx.stream());
        sxt = ctx.fp8_scale_scratch();
    }
    FANOUT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof(sw)));
    FANOUT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sxt, sizeof(sxt)));
    const float one = 1.0f, zero = 0.0f;
    const void* c = residual != nullptr ? static_cast<const void*>(residual) : static_cast<const void*>(y);
    FANOUT_CUBLAS_CHECK(cublasLtMatmul(ctx.blas_handle(), p->desc, &one, w, p->a, x, p->b,
                                       residual != nullptr ? &one : &zero, c, p->c, y, p->c, &p->algo,
                                       ctx.blas_workspace(), DeviceContext::kBlasWorkspaceBytes, ctx.stream()));
    return true;
}

void launch_gemm_fp8(DeviceContext& ctx, const uint8_t* x, const float* sx, ScaleOrder sx_order, const uint8_t* w,
                     const float* sw, uint16_t* y, int M, int N, int K, const uint16_t* residual) {
    if (M <= 0 || N <= 0) return;
    const GemmConfig cfg = pick_gemm_config(M, N, K, ctx.sm_count(), true);
    if (cfg.cublaslt && launch_gemm_fp8_cublaslt(ctx, x, sx, sx_order, w, sw, y, M, N, K, residual)) return;
    if (sx_order == ScaleOrder::kMMajor) {  // the tile kernel reads them row-major
        const int kb = static_cast<int>(ceil_div(K, kFp8Block));
        FANOUT_CHECK(size_t(M) * kb <= DeviceContext::kFp8ScaleScratchFloats,
                     "gemm_fp8: M-major scales of {} rows × {} K blocks exceed the scale scratch ({} floats)", M, kb,
                     DeviceContext::kFp8ScaleScratchFloats);
        launch_transpose_scales(sx, ctx.fp8_scale_scratch(), kb, M, ctx.stream());  // [kb][M] -> [M][kb]
        sx = ctx.fp8_scale_scratch();
    }
    launch_gemm_fp8(x, sx, w, sw, y, M, N, K, ctx.stream(), residual, &ctx.gemm_workspace(), cfg);
}

}  // namespace fanout::ops

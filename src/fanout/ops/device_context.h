// One GPU stream's context: what every launch of a model step, a benchmark or a test needs
// besides its operands — the device and its SM count, the stream, cuBLASLt's handle with its
// workspace and per-shape plans, the FP8 GEMMs' split-K and scale scratch and the MLA decode's
// partials, the work counters of persistent kernels.
// Scratch belongs to the context: launches on two streams at once use two contexts (they must not
// share it); one context serves any sequence of launches on its stream — the two microbatches of
// the GPU runner's schedule, which take turns on one stream, included — CUDA graphs too. The
// model runner (model/deepseek_v3_cuda.h) owns one and hands it to its layers; the EP backends
// take its stream.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <tuple>

#include "fanout/ops/gemm.h"
#include "fanout/ops/mla_attention_cuda.h"

namespace fanout::ops {

// A cuBLASLt matmul for one shape: descriptors and the heuristic's algorithm.
struct BlasPlan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    BlasPlan() = default;
    BlasPlan(const BlasPlan&) = delete;
    BlasPlan& operator=(const BlasPlan&) = delete;
    ~BlasPlan();
};

// The alignment (bytes, 2…16) every batch's bf16 matrix keeps when the first is 16-byte aligned:
// the largest power of two dividing both strides' bytes, at most 16.
uint32_t strided_alignment(int64_t ld, int64_t stride);

// The launches a context has scratch for: every kernel, or GEMMs only — a side stream that runs an
// MLP (the MoE layer's shared expert) leaves out the MLA decode's 40 MB of partials.
enum class ContextScratch { kAll, kGemms };

class DeviceContext {
  public:
    static constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;
    // On the current device with a stream of its own (non-blocking).
    explicit DeviceContext(ContextScratch scratch = ContextScratch::kAll);
    // On the current device over `stream`, borrowed (nullptr: the legacy default stream — tests
    // that mix these launches with synchronous copies).
    explicit DeviceContext(cudaStream_t stream);
    ~DeviceContext();
    DeviceContext(const DeviceContext&) = delete;
    DeviceContext& operator=(const DeviceContext&) = delete;

    int device() const { return device_; }
    int sm_count() const { return sm_count_; }
    cudaStream_t stream() const { return stream_; }

    cublasLtHandle_t blas_handle() const { return blas_; }
    void* blas_workspace() const { return blas_workspace_; }
    // y[M, N] = x[M, K] · Wᵀ in bf16 with bf16 or (f32_out) f32 output: made on first use.
    const BlasPlan& blas_plan(int M, int N, int K, bool f32_out);
    // The strided-batched bf16 GEMM's plan for g's shape and strides (its pointers are not read).
    const BlasPlan& blas_batched_plan(const StridedBatchedGemm& g);
    // cuBLASLt's block-scaled FP8 plan for y[M, N] = x[M, K] · Wᵀ (bf16 out, beta = 1 with a
    // residual), or nullptr when its heuristic has no algorithm for the shape (remembered too).
    // The scale pointers are set by each launch (launch_gemm_fp8_cublaslt).
    const BlasPlan* blas_fp8_plan(int M, int N, int K);
    // Scratch for x's scales transposed into the order the GEMM that runs reads: M-major for
    // cuBLASLt's VEC128 scales, row-major for the tile kernel (gemm_fp8_cublaslt.cc).
    static constexpr size_t kFp8ScaleScratchFloats = size_t{4} << 20;
    float* fp8_scale_scratch() const { return fp8_scale_scratch_; }
    // Two device ints, zero, for a persistent kernel that hands out its work items by atomics (the
    // MHA-form prefill): such a kernel leaves them zero when it ends.
    int* work_counters() const { return work_counters_; }
    GemmWorkspace& gemm_workspace() { return gemm_ws_; }
    // Empty (0 bytes: the attention never splits its keys) in a kGemms context.
    MlaWorkspace& mla_workspace() { return mla_ws_; }

    // Device bytes a context allocates (its workspaces), for memory plans.
    static size_t workspace_bytes(ContextScratch scratch = ContextScratch::kAll);

  private:
    void init(bool own_stream);
    void release();  // what the constructor made (each handle at most once)
    int device_ = 0, sm_count_ = 0;
    cudaStream_t stream_ = nullptr;
    bool owns_stream_ = false;
    cublasLtHandle_t blas_ = nullptr;
    void* blas_workspace_ = nullptr;
    float* fp8_scale_scratch_ = nullptr;
    int* work_counters_ = nullptr;
    std::map<std::tuple<int, int, int, bool>, std::unique_ptr<BlasPlan>> plans_;
    std::map<std::tuple<int, int, int>, std::unique_ptr<BlasPlan>> fp8_plans_;  // null: no algorithm
    std::map<std::tuple<int, int, int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>,
             std::unique_ptr<BlasPlan>>
        batched_plans_;
    GemmWorkspace gemm_ws_;
    MlaWorkspace mla_ws_;
};

}  // namespace fanout::ops

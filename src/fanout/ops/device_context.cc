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

DeviceContext::DeviceContext(ContextScratch scratch)
    : mla_ws_(scratch == ContextScratch::kAll ? MlaWorkspace::kDefaultBytes : 0) {
    init(true);
}

DeviceContext::DeviceContext(cudaStream_t stream) : stream_(stream) { init(false); }

// A failure part way (out of memory at the cuBLASLt workspace) releases what was made before it:
// the destructor does not run for a constructor that throws, and a server that retries with a
// smaller configuration would otherwise keep the leftovers.
void DeviceContext::init(bool own_stream) {
    try {
        if (own_stream) {
            FANOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
            owns_stream_ = true;
        }
        FANOUT_CUDA_CHECK(cudaGetDevice(&device_));
        FANOUT_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_));
        FANOUT_CUBLAS_CHECK(cublasLtCreate(&blas_));
        FANOUT_CUDA_CHECK(cudaMalloc(&blas_workspace_, kBlasWorkspaceBytes));
        FANOUT_CUDA_CHECK(cudaMalloc(&fp8_scale_scratch_, kFp8ScaleScratchFloats * sizeof(float)));
        FANOUT_CUDA_CHECK(cudaMalloc(&work_counters_, 2 * sizeof(int)));
        // On the context's stream: a non-blocking stream does not wait for the legacy one.
        FANOUT_CUDA_CHECK(cudaMemsetAsync(work_counters_, 0, 2 * sizeof(int), stream_));
    } catch (...) {
        release();
        throw;
    }
}

void DeviceContext::release() {
    plans_.clear();
    batched_plans_.clear();
    fp8_plans_.clear();
    cudaFree(blas_workspace_);
    cudaFree(fp8_scale_scratch_);
    cudaFree(work_counters_);
    blas_workspace_ = nullptr;
    fp8_scale_scratch_ = nullptr;
    work_counters_ = nullptr;
    if (blas_) cublasLtDestroy(blas_);
    blas_ = nullptr;
    if (owns_stream_) cudaStreamDestroy(stream_);
    owns_stream_ = false;
}

DeviceContext::~DeviceContext() { release(); }

size_t DeviceContext::workspace_bytes(ContextScratch scratch) {
    return kBlasWorkspaceBytes + kFp8ScaleScratchFloats * sizeof(float) + 2 * sizeof(int) +
           GemmWorkspace::kDefaultBytes + (scratch == ContextScratch::kAll ? MlaWorkspace::kDefaultBytes : 0);
}

namespace {
// The heuristic's first algorithm for p's descriptors (bf16 or f32 output); false when it has
// none. `align`: the bytes every A, B, C / D address is a multiple of (0: the default, 256).
bool find_algo(cublasLtHandle_t blas, BlasPlan& p, const uint32_t* align = nullptr) {
    struct Pref {  // destroyed on every path out
        cublasLtMatmulPreference_t p = nullptr;
        ~Pref() {
            if (p) cublasLtMatmulPreferenceDestroy(p);
        }
    } holder;
    FANOUT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&holder.p));
    const cublasLtMatmulPreference_t pref = holder.p;
    const size_t ws = DeviceContext::kBlasWorkspaceBytes;
    FANOUT_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    if (align != nullptr) {
        const cublasLtMatmulPreferenceAttributes_t attr[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; i < 4; ++i)
            FANOUT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr[i], &align[i], sizeof(uint32_t)));
    }
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(blas, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) return false;
    p.algo = result.algo;
    return true;
}

// find_algo or a clear error.
void pick_algo(cublasLtHandle_t blas, BlasPlan& p, const char* what, int M, int N, int K,
               const uint32_t* align = nullptr) {
    FANOUT_CHECK(find_algo(blas, p, align), "cuBLASLt has no {} algorithm for M {} N {} K {}", what, M, N, K);
}

}  // namespace

uint32_t strided_alignment(int64_t ld, int64_t stride) {
    uint32_t a = 16;
    while (a > 2 && ((2 * ld) % a != 0 || (2 * stride) % a != 0)) a /= 2;
    return a;
}

namespace {
void set_batch(cublasLtMatrixLayout_t l, int batch, int64_t stride) {
    FANOUT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
    FANOUT_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
}
}  // namespace

const BlasPlan& DeviceContext::blas_batched_plan(const StridedBatchedGemm& g) {
    auto& slot = batched_plans_[{g.batch, g.M, g.N, g.K, g.ldx, g.stride_x, g.ldw, g.stride_w, g.ldy, g.stride_y}];
    if (slot) return *slot;
    // Column-major, as blas_plan: D[N, M] (ld ldy) = W[K, N]ᵀ (ld ldw) · x[K, M] (ld ldx), per batch.
    auto p = std::make_unique<BlasPlan>();
    FANOUT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T;
    FANOUT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    FANOUT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, g.K, g.N, g.ldw));
    FANOUT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, g.K, g.M, g.ldx));
    FANOUT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_16BF, g.N, g.M, g.ldy));
    set_batch(p->a, g.batch, g.stride_w);
    set_batch(p->b, g.batch, g.stride_x);
    set_batch(p->c, g.batch, g.stride_y);
    // Strides that are not multiples of 16 bytes move the batches' addresses off 16-byte alignment:
    // the heuristic is told (strided_alignment), and the launch checks the pointers against it.
    const uint32_t y_align = strided_alignment(g.ldy, g.stride_y);
    const uint32_t align[4] = {strided_alignment(g.ldw, g.stride_w), strided_alignment(g.ldx, g.stride_x), y_align,
                               y_align};
    pick_algo(blas_, *p, "strided-batched BF16", g.M, g.N, g.K, align);
    slot = std::move(p);
    return *slot;
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
    pick_algo(blas_, *p, "BF16", M, N, K);
    slot = std::move(p);
    return *slot;
}

const BlasPlan* DeviceContext::blas_fp8_plan(int M, int N, int K) {
    const auto key = std::make_tuple(M, N, K);
    if (const auto it = fp8_plans_.find(key); it != fp8_plans_.end()) return it->second.get();
    // Column-major, as blas_plan: D[N, M] = W[K, N]ᵀ · x[K, M], W's scales per 128×128 block, x's
    // per 128 values of a row. Any step refused — a cuBLASLt or GPU without these scale modes
    // included — leaves no plan (the tile kernel runs), remembered like a heuristic without an
    // algorithm. The heuristic assumes its default 256-byte operand alignment, which the launch
    // checks.
    auto p = std::make_unique<BlasPlan>();
    const cublasOperation_t t = CUBLAS_OP_T;
    const cublasLtMatmulMatrixScale_t w_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                                      x_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    const float* stand_in = fp8_scale_scratch_;  // each launch sets its scales' addresses
    const auto ok = [](cublasStatus_t st) { return st == CUBLAS_STATUS_SUCCESS; };
    const bool made =
        ok(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)) &&
        ok(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t))) &&
        ok(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &w_mode, sizeof(w_mode))) &&
        ok(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &x_mode, sizeof(x_mode))) &&
        ok(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &stand_in,
                                          sizeof(stand_in))) &&
        ok(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &stand_in,
                                          sizeof(stand_in))) &&
        ok(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, K, N, K)) &&
        ok(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, K, M, K)) &&
        ok(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_16BF, N, M, N)) && find_algo(blas_, *p);
    if (!made) p.reset();
    auto& slot = fp8_plans_[key];
    slot = std::move(p);
    return slot.get();
}

}  // namespace fanout::ops

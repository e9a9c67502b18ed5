// What the standalone probes beside it (tma_read_probe.cu, chain_probe.cu) share: a CUDA-error
// check for main-like functions, K-major byte tensor maps in the FP8 GEMM's 128-byte swizzle, and
// timing a launch the way `fanout bench kernels` does. Not part of the build.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>

// Returns 1 from the calling function on a CUDA error, after printing it.
#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e = (x);                                                                    \
        if (e != cudaSuccess) {                                                                 \
            std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
            return 1;                                                                           \
        }                                                                                       \
    } while (0)

namespace probe {

inline PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;

// Finds the driver's cuTensorMapEncodeTiled; false (and a line) when there is none.
inline bool init_encode() {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        f == nullptr) {
        std::printf("no cuTensorMapEncodeTiled\n");
        return false;
    }
    encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
    return true;
}

// [rows, K] bytes, boxes of box_rows x 128 bytes, 128-byte swizzle (as the GEMM's x and W).
inline bool make_map(CUtensorMap* m, const void* base, uint64_t rows, uint64_t K, uint32_t box_rows) {
    cuuint64_t dims[2] = {K, rows}, strides[1] = {K};
    cuuint32_t box[2] = {128, box_rows}, elem[2] = {1, 1};
    return encode(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box, elem,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// µs per call of `launch(i)` (which launches on `st`): two warm-up calls, then `calls` back to back
// captured as one CUDA graph, best of 5 replays (as `fanout bench kernels` times its GEMMs), or
// with calls = 1 one launch between two events, best of 6.
template <typename F>
float time_us(cudaStream_t st, int calls, F&& launch) {
    for (int i = 0; i < 2; ++i) launch(i);
    cudaStreamSynchronize(st);
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    float best = 1e30f;
    if (calls == 1) {
        for (int rep = 0; rep < 6; ++rep) {
            cudaEventRecord(a, st);
            launch(rep);
            cudaEventRecord(b, st);
            cudaEventSynchronize(b);
            float ms = 0;
            cudaEventElapsedTime(&ms, a, b);
            best = std::min(best, ms);
        }
    } else {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal);
        for (int i = 0; i < calls; ++i) launch(i);
        cudaStreamEndCapture(st, &g);
        cudaGraphInstantiate(&ge, g, 0);
        for (int rep = 0; rep < 5; ++rep) {
            cudaEventRecord(a, st);
            cudaGraphLaunch(ge, st);
            cudaEventRecord(b, st);
            cudaEventSynchronize(b);
            float ms = 0;
            cudaEventElapsedTime(&ms, a, b);
            best = std::min(best, ms);
        }
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return best * 1000.0f / calls;
}

}  // namespace probe

#include "fanout/ops/tensor_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <string>

#include "fanout/core/error.h"

namespace fanout::ops {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void* f = nullptr;
        cudaDriverEntryPointQueryResult q{};
        const cudaError_t e =
            cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
        FANOUT_CHECK(e == cudaSuccess && q == cudaDriverEntryPointSuccess && f != nullptr,
                     "the CUDA driver has no cuTensorMapEncodeTiled (TMA needs driver >= 12.0): {}",
                     cudaGetErrorString(e));
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
    }();
    return fn;
}

}  // namespace

CUtensorMap make_tensor_map(const TensorMapSpec& s, const char* what) {
    FANOUT_CHECK(s.rank >= 1 && s.rank <= 5, "tensor map for {}: rank {} outside 1..5", what, s.rank);
    CUtensorMap m;
    cuuint64_t dims[5], strides[4];
    cuuint32_t box[5], elem[5];
    for (int i = 0; i < s.rank; ++i) dims[i] = s.dims[i], box[i] = s.box[i], elem[i] = 1;
    for (int i = 0; i + 1 < s.rank; ++i) strides[i] = s.strides[i];
    const CUresult r =
        encoder()(&m, s.type, static_cast<cuuint32_t>(s.rank), const_cast<void*>(s.base), dims, strides, box, elem,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, s.swizzle, s.promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        std::string shape, boxes;
        for (int i = 0; i < s.rank; ++i) {
            shape += fmt::format("{}{}", i ? " × " : "", s.dims[i]);
            if (i > 0) shape += fmt::format(" (stride {} B)", s.strides[i - 1]);
            boxes += fmt::format("{}{}", i ? " × " : "", s.box[i]);
        }
        FANOUT_FAIL(
            "cuTensorMapEncodeTiled refused the tensor map for {} (CUDA driver error {}): dims {}, box {}, base {}",
            what, static_cast<int>(r), shape, boxes, s.base);
    }
    return m;
}

}  // namespace fanout::ops

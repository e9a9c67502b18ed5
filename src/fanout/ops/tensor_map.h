// Tensor maps (TMA descriptors) for the sm_90 kernels, encoded on the host through the driver's
// cuTensorMapEncodeTiled (fetched once through the runtime, so nothing links libcuda). Every map
// here uses the 128-byte swizzle the kernels' wgmma descriptors assume; loads past a dimension's
// end fill zeros and stores past it are dropped.
//
// Fmt-free on purpose: included from .cu files.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace fanout::ops {

struct TensorMapSpec {
    CUtensorMapDataType type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    int elem_bytes = 2;
    const void* base = nullptr;  // 16-byte aligned
    int rank = 2;                // 1..5
    uint64_t dims[5] = {};       // elements, innermost first
    uint64_t strides[4] = {};    // bytes between consecutive indices of dims 1..rank-1 (multiples of 16)
    uint32_t box[5] = {};        // box extents, innermost first (box[0] · elem_bytes ≤ 128 for the swizzle)
    CUtensorMapL2promotion promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
    CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
};

// Throws fanout::Error naming `what`, the dims, strides and the driver's error when the driver
// refuses the map (misaligned base or strides, box too large, no TMA in the driver).
CUtensorMap make_tensor_map(const TensorMapSpec& spec, const char* what);

}  // namespace fanout::ops

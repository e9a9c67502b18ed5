// FP8 block-quantization constants shared by the CPU ops and the CUDA kernels (fmt-free, so
// .cu files can include it).
#pragma once

#include <cstdint>

#include "fanout/core/dtype.h"

namespace fanout::ops {

constexpr int64_t kFp8Block = 128;         // 1×128 activation blocks, 128×128 weight blocks
constexpr float kActQuantMinAmax = 1e-4f;  // DeepSeek's act_quant floor on a block's amax

}  // namespace fanout::ops

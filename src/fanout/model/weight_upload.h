// The GPU runner's weights on the device: the weight plan (weight_plan.h) streamed into one
// device arena through pinned staging buffers, and the DeviceLayers that view it (CUDA builds).
#pragma once

#include <vector>

#include "fanout/model/cuda_layer.h"
#include "fanout/model/weight_plan.h"

namespace fanout::model {

struct DeviceModelWeights {
    DeviceArray<uint8_t> arena;            // every weight; the arrays below are views into it
    DeviceArray<uint16_t> embed, lm_head;  // bf16 [vocab, hidden]
    DeviceArray<float> final_norm;
    std::vector<DeviceLayer> layers;  // the decoder layers (the MTP layer is not run on the GPU yet)
};

// Plans `w`'s weights, allocates the arena on the current device and streams them into it,
// checking the values of `w.unchecked` on the way (an Error names the tensor, file and element).
DeviceModelWeights upload_model_weights(const io::ModelConfig& c, const ModelWeights& w,
                                        const LoadProgress& progress = {}, StreamStats* stats = nullptr);

}  // namespace fanout::model

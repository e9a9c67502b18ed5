// The GPU runner's weights on the device: the weight plan (weight_plan.h) streamed into one
// device arena through pinned staging buffers, and the DeviceLayers that view it (CUDA builds).
#pragma once

#include <optional>
#include <vector>

#include "fanout/model/cuda_layer.h"
#include "fanout/model/weight_plan.h"

namespace fanout::model {

// The MTP layer on the device (MtpWeights): embed → enorm | hnorm of the previous hidden state →
// eh_proj → the decoder layer → head_norm → head.
struct DeviceMtp {
    DeviceArray<float> enorm, hnorm, head_norm;
    DeviceWeight eh_proj;  // [D, 2D]
    DeviceLayer layer;
    DeviceArray<uint16_t> embed, head;  // bf16 [vocab, hidden]: the model's when it has none of its own
};

struct DeviceModelWeights {
    DeviceArray<uint8_t> arena;            // every weight; the arrays below are views into it
    DeviceArray<uint16_t> embed, lm_head;  // bf16 [vocab, hidden]
    DeviceArray<float> final_norm;
    std::vector<DeviceLayer> layers;  // the decoder layers
    std::optional<DeviceMtp> mtp;     // the MTP layer, when uploaded
};

// Plans `w`'s weights (with the MTP layer when with_mtp), allocates the arena on the current
// device and streams them into it, checking the values of `w.unchecked` on the way (an Error names
// the tensor, file and element).
DeviceModelWeights upload_model_weights(const io::ModelConfig& c, const ModelWeights& w,
                                        const LoadProgress& progress = {}, StreamStats* stats = nullptr,
                                        bool with_mtp = false);

}  // namespace fanout::model

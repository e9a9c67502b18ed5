// Hardware presets for the deployment planner (issue 8), from the vendors' datasheets; the
// planner's calibration replaces the rates with measured ones where a benchmark JSON exists.
#pragma once

#include <string>

namespace fanout::plan {

struct Hardware {
    std::string name;
    double hbm_bytes;   // device memory
    double hbm_bw;      // bytes/s
    double fp8_flops;   // dense, FLOP/s
    double bf16_flops;  // dense, FLOP/s
    double nvlink_bw;   // bytes/s per GPU per direction
    double ib_bw;       // bytes/s per GPU (one 400 Gb/s NIC per GPU)
    int gpus_per_node;
};

Hardware h100_sxm();  // 80 GB HBM3 3.35 TB/s; FP8 1979, BF16 989 TFLOP/s; NVLink 450 GB/s; IB 50 GB/s
Hardware h200_sxm();  // 141 GB HBM3e 4.8 TB/s; the H100's rates and links

// "h100" or "h200"; throws fanout::Error naming the preset otherwise.
Hardware hardware_preset(const std::string& name);

}  // namespace fanout::plan

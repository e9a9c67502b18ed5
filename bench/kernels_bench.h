// `fanout bench kernels` (CUDA builds): the FP8 block-scaled GEMMs of issue 5 on this GPU, each
// figure beside the ceilings measured in the same run (a 16-byte copy kernel's bandwidth and
// cuBLASLt's tensor-wise FP8 rate), cuBLASLt block-scaled FP8 timed on the same operands, and
// the DeepGEMM anchors of REFERENCE.md §3.
//  * dense: the six DeepSeek-V3 shapes at M = 64 … 4096, fanout with its measured tile table
//    (and, with --sweep, every tile shape and split, to re-measure that table);
//  * grouped masked: the seed's EP8 … EP128 decode points (batch 128 per GPU, query length 2:
//    256/EP experts × 8·EP tokens each), gate/up 4096×7168 and down 7168×2048, beside cuBLASLt
//    run expert by expert with the counts known on the host (what a user without a grouped kernel
//    does); plus the fused silu·mul·quant kernel at each point.
#pragma once

#include <string>

namespace fanout::bench {

struct KernelsBenchOptions {
    std::string json_out = "kernels_bench.json";
    bool sweep = false;     // time every tile shape and split of the dense GEMM
    bool dense = true;
    bool grouped = true;
};

// Prints tables; writes JSON when json_out is set. Returns 0, or throws fanout::Error.
int run_kernels_bench(const KernelsBenchOptions& opts);

}  // namespace fanout::bench

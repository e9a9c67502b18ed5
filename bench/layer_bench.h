// `fanout bench layer` (CUDA builds): one DeepSeek-V3 decoder layer at the real widths with random
// FP8 weights, TP1, run by the GPU runner's own layer code (model/cuda_layer.h) — the seed's
// latency breakdown, kernel by kernel, each beside its roofline floor from this GPU's measured
// ceilings.
//
// One GPU emulates one rank of EP-N: the layer holds 256/N experts and its grouped GEMMs receive
// m = batch · query · 8 · N / 256 tokens per expert, what N-way dispatch would deliver; the local
// router, permute and un-permute run on the real routing of the step. Dispatch and combine
// (communication) are not included — `fanout bench comm` measures them.
#pragma once

#include <string>
#include <vector>

namespace fanout::bench {

struct LayerBenchOptions {
    std::vector<int> batches = {1, 2, 4, 8, 16, 32, 64, 128};  // requests per GPU
    std::vector<int> eps = {8, 16, 32, 64, 128};               // emulated EP sizes
    int query_len = 2;                                         // MTP: one draft token
    int kv_len = 5000;                                         // cached positions per request
    int replays = 20;                                          // timed graph replays per point
    std::string json_out = "layer_bench.json";
};

// Prints the tables; writes opts.json_out when set. Returns 0, or throws fanout::Error.
int run_layer_bench(const LayerBenchOptions& opts);

}  // namespace fanout::bench

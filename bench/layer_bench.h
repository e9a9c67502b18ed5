// `fanout bench layer` (CUDA builds): one DeepSeek-V3 decoder layer at the real widths with random
// FP8 weights, TP1, run by the GPU runner's own layer code (model/cuda_layer.h) — the seed's
// latency breakdown, kernel by kernel, each beside its roofline floor from this GPU's measured
// ceilings.
//
// One GPU emulates one rank of EP-N: the layer holds 256/N experts and runs its expert-parallel
// path on the emulated EP backend (emulated_ep.h), whose dispatch delivers m = batch · query · 8 ·
// N / 256 tokens to every local expert, what N-way dispatch would; the router runs on the step's
// real routing. Dispatch and combine move nothing there (communication is not included —
// `fanout bench comm` measures it); the combined rows join the residual as they would. With
// --comm nvlink|nccl the same layer then runs as EP-G over G visible GPUs, one rank per GPU, with
// the real backend's dispatch and combine in it.
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
    // "emulated" only, or also real dispatch / combine ("nvlink", "nccl") across `gpus` GPUs
    // (0: every visible one), EP = that many ranks.
    std::string comm = "emulated";
    int gpus = 0;
    // Also each emulated MoE point as two microbatches (the seed's schedule on the layer's stages:
    // both halves' attention and dispatch send, both expert halves, both combines), beside the one-
    // batch layer: with the emulated backend nothing is in flight, so this is the split's cost —
    // what the hidden communication must outweigh for the schedule to pay.
    bool microbatch = false;
    // Attention in the MHA form, as the model runs prefill chunks (every request's context gathered
    // and expanded by kv_b, the wgmma flash attention over all requests in one launch) instead of
    // the absorbed form; needs query_len > 4 (a prefill chunk) and the emulated backend only.
    bool mha = false;
    // One-token decode requests (at kv_len context) ahead of each point's requests in the same
    // step — continuous batching's mixed step; with `mha` they run the absorbed form and the
    // chunks the MHA form, as the model does. Emulated backend only.
    int decodes = 0;
    // The KV cache's entries: "bf16", or "fp8" (the same random values in FP8 entries; the
    // attention and the append read and write them as the model does with --kv-dtype fp8).
    std::string kv_dtype = "bf16";
    std::string json_out = "layer_bench.json";
};

// Prints the tables; writes opts.json_out when set. Returns 0, or throws fanout::Error.
int run_layer_bench(const LayerBenchOptions& opts);

}  // namespace fanout::bench

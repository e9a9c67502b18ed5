// `fanout bench mla` (CUDA builds): the absorbed-MLA decode attention kernel
// (ops/mla_attention_cuda.h) at DeepSeek-V3's widths — kv_lora 512, rope 64, bf16 paged cache of
// 64-position blocks — beside the bf16 tensor-core ceiling measured in the same run (cuBLASLt
// through ops::launch_gemm_bf16 on 8192³). The point is batch 128 × query 2 × kv 5000 ×
// 128 heads: 356 GFLOP counting 2·(576 + 512) flops per (query row, position).
// Then the MHA-form prefill attention (ops/mha_prefill_cuda.h: causal, requests' chunks over
// kv_b-expanded K/V, nope 128 + rope 64, v 128) at `prefill_shapes` through the wgmma kernel,
// FLOPs counted over the causal part only (2·(192 + 128) per visible (query, key) pair and head);
// issue 19 asks for ≥ 450 TFLOP/s at 128 heads × 4,096 tokens.
// Timing only: the kernels' numbers are checked by mla_cuda_test and mha_prefill_cuda_test.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace fanout::bench {

struct MlaBenchOptions {
    std::vector<int> batches = {1, 8, 32, 64, 128};  // requests per step
    int query_len = 2;                               // query tokens per request (decode 1, MTP 2)
    int kv_len = 5000;                               // cached positions per request
    int heads = 128;                                 // query heads on this GPU (128 at TP1)
    int calls = 20;                                  // back-to-back calls per timed graph (best of 5 replays)
    bool head_major = false;  // q_lat and the output as the layer holds them, [H, T, 512] (else [T, H, 512])
    std::string json_out = "mla_bench.json";  // "" = no file
    // Prefill points "heads:tokens:prefix[:requests]" (each request: tokens queries over prefix +
    // tokens keys; several requests go in one launch); empty: none.
    std::vector<std::string> prefill_shapes = {"128:4096:0", "128:4096:12288", "16:8192:0",   "128:512:0",
                                               "128:1024:0", "128:1024:0:4",   "128:512:0:8", "16:4096:0"};
};

// One point, with the bf16 cache and then the FP8 cache holding the same values: a row each of µs
// per call, TFLOP/s, GB/s of cache read, and for FP8 its output's relative error against the bf16
// cache's; `peak_tflops` (0 = unknown) adds the fraction of the bf16 ceiling. Prints the rows to
// `table_out` (may be null) and returns them (a JSON array). `head_major`: MlaBenchOptions's.
nlohmann::json run_mla_bench_point(int batch, int query_len, int kv_len, int heads, int calls, bool head_major,
                                   double peak_tflops, FILE* table_out);

// The bf16 ceiling, then every batch of `opts`; prints the table, writes opts.json_out when set,
// and returns the JSON (every figure).
nlohmann::json run_mla_bench(const MlaBenchOptions& opts, FILE* table_out = stdout);

}  // namespace fanout::bench

// `fanout bench kernels` (CUDA builds): the FP8 block-scaled GEMMs of issue 5 on this GPU, each
// figure beside the ceilings measured in the same run (a 16-byte copy kernel's bandwidth and
// cuBLASLt's tensor-wise FP8 rate), cuBLASLt block-scaled FP8 timed on the same operands, and
// the DeepGEMM anchors of REFERENCE.md §3.
//  * dense: the six DeepSeek-V3 shapes at M = 64 … 4096, fanout with its measured tile table
//    (and, with --sweep, every tile shape and split, to re-measure that table); with --cold each
//    call reads W from HBM, as the model's GEMMs do (every layer has its own weights), with
//    --serial no call overlaps the next, and --m times any M (M = 2: one request with MTP);
//  * grouped masked: the seed's EP8 … EP128 decode points (batch 128 per GPU, query length 2:
//    256/EP experts × 8·EP tokens each), gate/up 4096×7168 and down 7168×2048, beside cuBLASLt
//    run expert by expert with the counts known on the host (what a user without a grouped kernel
//    does); with --draws, every config over several routing draws of the same total (how a
//    config's wave fit holds up when the counts move); with --hot fanout's configs are timed at
//    the power-limited clock of sustained work instead of from an idle pause (cuBLASLt's column
//    still from the pause); plus the fused silu·mul·quant kernel at each point;
//  * grouped contiguous: prefill at EP8, EP32 and EP64 (4,096 tokens per rank, top-8 of 256: 32,768
//    routed rows per rank, padded to 128 per expert), beside cuBLASLt expert by expert and the
//    dense GEMM of the same rows against one weight (no DeepGEMM anchor for this layout).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fanout/ops/gemm.h"

namespace fanout::bench {

struct KernelsBenchOptions {
    std::string json_out = "kernels_bench.json";
    bool sweep = false;   // time every tile shape and split of the dense GEMM
    bool cold = false;    // dense: each call reads its own copy of W, the copies together past the L2
    bool serial = false;  // dense: an empty kernel between calls, so none overlaps the next (its time subtracted)
    bool dense = true;
    bool grouped = true;
    std::string shape;       // dense: only this shape ("o_proj", ...; "" = all six)
    int m = 0;               // dense: only this M (0 = all five)
    std::string config;      // dense: this tile config instead of the table, e.g. "128x256/1" or "128x128/2c2"
    bool lt_search = false;  // dense: also time cuBLASLt's block-scaled algorithm in every tile and cluster shape
    enum class Data { kUniform, kNormal, kZeros };
    Data data = Data::kUniform;  // the FP8 operands' values (random_fp8)
    // grouped masked: each point's configs also timed on this many routing draws in all (the
    // anchor's counts, then other seeds' counts with the same total), each config's mean and
    // range printed; 1: the anchor's counts only.
    int draws = 1;
    // grouped masked: each of fanout's timings after ~0.2 s of the same GEMM back to back instead
    // of an idle pause, so at the clock the power limit leaves under sustained work (as in a
    // layer's replays); cuBLASLt's per-expert column is still timed after the pause.
    bool hot = false;
};

// --data's spellings.
inline constexpr std::pair<const char*, KernelsBenchOptions::Data> kDataNames[] = {
    {"uniform", KernelsBenchOptions::Data::kUniform},
    {"normal", KernelsBenchOptions::Data::kNormal},
    {"zeros", KernelsBenchOptions::Data::kZeros}};
const char* data_name(KernelsBenchOptions::Data d);

// The grouped points' per-group row counts: E counts drawn uniform in [0.7, 1.3] × expected, as
// the DeepGEMM anchors drew theirs, then moved one row at a time, round robin and within that
// range, until they total `valid` (the anchor's rows), so both time the same work. `bench layer`'s
// emulated dispatch draws its experts' rows the same way (emulated_ep.h).
std::vector<int32_t> anchor_counts(int E, int expected, int valid, uint32_t seed);
// The most rows anchor_counts gives one group.
constexpr int anchor_count_max(int expected) { return static_cast<int>(ops::modelled_most_rows(expected)); }

// "128x256/2c2" -> {128, 256, 2, 2}; throws fanout::Error naming the text when malformed.
ops::GemmConfig parse_gemm_config(const std::string& text);

// This GPU's ceilings, measured: a 16-byte copy kernel's bandwidth (read + write), cuBLASLt's
// tensor-wise FP8 rate and its BF16 rate, both on 8192³.
struct GpuCeilings {
    double copy_gbs = 0, fp8_tflops = 0, bf16_tflops = 0;
};
GpuCeilings measure_gpu_ceilings();

// Prints tables; writes JSON when json_out is set. Returns 0, or throws fanout::Error.
int run_kernels_bench(const KernelsBenchOptions& opts);

}  // namespace fanout::bench

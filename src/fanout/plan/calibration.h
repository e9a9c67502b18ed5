// Calibration of the planner's efficiency profile on fanout's own benchmark JSON (issue 8).
//
// A file's "benchmark" key says what it holds:
//   "kernels"  `fanout bench kernels` (docs/bench/kernels_bench_h200.json): dense.rows[] {N, K, M,
//              fanout.us} refit the GEMM roofline, grouped[] kind "grouped_masked" {N, K, experts,
//              valid_m, fanout.us} the grouped one, copy_gbs the elementwise bandwidth (without it,
//              kind "silu_mul_quant_masked" {valid_m, us}).
//   "mla"      `fanout bench mla` (docs/bench/mla_bench_h200.json): rows[] {batch, query_len, heads,
//              kv_len, us} set the attention efficiency curve (share of the BF16 peak by query rows).
//   "layer"    `fanout bench layer`: points[] {layer ("dense"|"moe"), ep, tp, batch, query_len,
//              kv_len, schedule, communication, total_us, marked_total_us, kernels: {name: us}}.
//              Only the points at the file's smallest batch are used: each kernel the model names,
//              except the grouped GEMM and attention (their own benchmarks run the same kernel),
//              gets measured − model as extra µs (mean over those points; with marked_total_us,
//              the events' share taken off first). The other batches stay free for checking.
//   "comm"     `fanout bench comm`: points[] {ep, tokens_per_rank, link ("nvlink"|"ib"; default from
//              ep and the node size), dispatch_us, combine_us}; per link and direction, one point sets
//              the bandwidth efficiency (latency kept), two or more fit latency and efficiency.
// The full shapes are in docs/DECISIONS.md ("Deployment planner"). Keys a file lacks leave that
// part of the profile as it was (the report says so); a malformed file (not JSON, a key of the
// wrong type, a non-positive time) is an error naming the file and the key.
#pragma once

#include <limits>
#include <map>
#include <string>
#include <vector>

#include "fanout/plan/cost_model.h"

namespace fanout::plan {

// Applies each file in order to `base` for hardware `hw` (the rooflines are fitted against its
// datasheet peaks); appends what changed to `notes`.
Profile calibrate(const Profile& base, const std::vector<std::string>& files, const Hardware& hw,
                  std::vector<std::string>* notes);

// One point of a `bench layer` JSON.
struct LayerMeasurement {
    Deployment d;               // a dense point has ep 1
    bool dense = false;         // "layer": "dense" (or "ep": 0); its shared_* kernels are read as dense_*
    bool comm_included = true;  // false for "communication": "not included"
    double total_us = std::numeric_limits<double>::quiet_NaN();         // NaN when the point has none
    double marked_total_us = std::numeric_limits<double>::quiet_NaN();  // with events between kernels
    std::map<std::string, double> kernels;                              // µs per kernel, events included
};
std::vector<LayerMeasurement> read_layer_bench(const std::string& path);

}  // namespace fanout::plan

// The seed's sweep and what the planner builds on it (issue 8): the grid of deployments, the
// Pareto frontier per EP size (output speed per request against throughput per machine), the
// files and figure `fanout plan sweep` writes, and `fanout plan recommend`'s search.
#pragma once

#include <string>
#include <vector>

#include "fanout/plan/cost_model.h"

namespace fanout::plan {

struct SweepOptions {
    std::vector<int> eps{8, 16, 32, 64, 128};
    std::vector<int> tps{1, 2, 4, 8};
    std::vector<int> batches{1, 2, 4, 8, 16, 32, 64, 128};
    std::vector<Schedule> schedules{Schedule::kDispatchOverlap, Schedule::kMicroBatch};
    // "seed": EP ≤ 8 on one H200 node, larger EP on H100 nodes, as the seed measured; or a preset.
    std::string hardware = "seed";
    int kv_len = 5000;
    DType kv_dtype = DType::kBF16;  // the KV cache's entries (Deployment::kv_dtype)
    int draft_tokens = 1;
    double acceptance = 0.6;
};

Hardware sweep_hardware(const std::string& hardware, int ep);

// Every valid point of the grid (TP > EP and microbatch at batch 1 are skipped), memory-infeasible
// ones included with fits = false.
std::vector<Prediction> run_sweep(const SweepOptions& o, const Profile& prof);

// The fitting points of one EP that no other fitting point of that EP beats on both speed and
// throughput, fastest first.
std::vector<Prediction> pareto_frontier(const std::vector<Prediction>& points, int ep);

// The most throughput per machine on `frontier` at output speed ≥ `min_speed` (0 if none).
double frontier_throughput_at(const std::vector<Prediction>& frontier, double min_speed);

// CSV (one row per point) and JSON (options, points, frontiers).
void write_sweep_csv(const std::string& path, const std::vector<Prediction>& points);
void write_sweep_json(const std::string& path, const SweepOptions& o, const std::vector<Prediction>& points);

// Writes `dir`/pareto.gp and its data files and runs gnuplot for pareto.png and pareto.svg. Returns
// "" when drawn, otherwise why not (gnuplot missing or failing); the data and script stay.
std::string write_pareto_figure(const std::string& dir, const std::vector<Prediction>& points,
                                const std::vector<int>& eps);

struct RecommendOptions {
    int gpus = 8;
    double min_speed = 0;  // output tok/s per request
    std::string hardware = "h200";
    int kv_len = 5000;
    DType kv_dtype = DType::kBF16;
    int draft_tokens = 1;
    double acceptance = 0.6;
    int max_batch = 256;  // per instance
    int top = 5;
};

// The best layout per (EP, TP, schedule) meeting the speed, best throughput per GPU first; throws
// fanout::Error for bad options or when no layout reaches the speed (naming the fastest one).
std::vector<Prediction> recommend(const RecommendOptions& o, const Profile& prof);

}  // namespace fanout::plan

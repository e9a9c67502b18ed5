// The seed's numbers the planner is checked against (REFERENCE.md §1): the latency breakdown of
// one MoE layer on H100, TP1, batch 128 per GPU, query 2, KV 5000. NaN where the seed gives none.
#pragma once

#include <cmath>

#include "fanout/plan/cost_model.h"

namespace fanout::plan {

struct SeedBreakdownRow {
    const char* label;
    int ep;
    Schedule schedule;  // EP8's schedule is not stated; the planner uses dispatch overlap
    double total_us, dispatch_us, combine_us, grouped_gemm_us;
};

inline constexpr double kNoSeedValue = NAN;
inline constexpr SeedBreakdownRow kSeedBreakdown[] = {
    {"EP128 NoOverlap", 128, Schedule::kNoOverlap, 2667, 593, 1012, 270},
    {"EP128 DispatchOverlap", 128, Schedule::kDispatchOverlap, 2651, kNoSeedValue, kNoSeedValue, kNoSeedValue},
    {"EP128 MicroBatch", 128, Schedule::kMicroBatch, 1896, 367, 237, kNoSeedValue},
    {"EP8 (single node)", 8, Schedule::kDispatchOverlap, 1802, kNoSeedValue, kNoSeedValue, 555},
};

// The breakdown's deployment: TP1, batch 128 per GPU, query 2, KV 5000 (on the H100 preset).
inline Deployment seed_breakdown_deployment(const SeedBreakdownRow& row) {
    Deployment d;
    d.ep = row.ep;
    d.tp = 1;
    d.batch = 128;
    d.kv_len = 5000;
    d.draft_tokens = 1;
    d.schedule = row.schedule;
    return d;
}

}  // namespace fanout::plan

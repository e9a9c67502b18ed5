// How a deployment is split over ranks, and what one rank holds (DESIGN: attention data-parallel,
// routed experts expert-parallel, attention heads optionally tensor-parallel).
//
// One definition for everything that asks "which experts, which heads are mine": the weight
// loader's shard (model/weights.h), the EP group (comm/ep.h: EpConfig::for_rank), the planner.
// World = ep: every rank holds n_routed_experts / ep routed experts in one contiguous block and
// runs attention for its own requests (dp = ep / tp attention replicas). tp > 1: the heads of a
// DP group's attention split over its tp consecutive ranks (model/weights.h; the CPU path).
#pragma once

#include <cstdint>

namespace fanout {

struct ParallelConfig {
    int rank = 0;  // in [0, world)
    int ep = 1;    // ranks sharing the routed experts: the world
    int tp = 1;    // ranks sharing one attention replica's heads

    int world() const { return ep; }
    int dp() const { return ep / tp; }
    int dp_rank() const { return rank / tp; }
    int tp_rank() const { return rank % tp; }

    struct Range {
        int64_t begin = 0, end = 0;
        int64_t size() const { return end - begin; }
    };
    // This rank's routed experts of `num_experts`: [rank·E/ep, (rank+1)·E/ep).
    Range experts(int64_t num_experts) const { return experts_of(rank, num_experts); }
    // Rank r's routed experts.
    Range experts_of(int r, int64_t num_experts) const {
        const int64_t per = num_experts / ep;
        return {per * r, per * (r + 1)};
    }
};

// Throws fanout::Error naming the first bad field: ep ≥ 1, 0 ≤ rank < ep, tp ≥ 1 dividing ep, and
// (num_experts > 0) ep dividing num_experts.
void validate(const ParallelConfig& p, int64_t num_experts);

}  // namespace fanout

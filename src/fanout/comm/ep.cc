#include "fanout/comm/ep.h"

#include "fanout/core/error.h"

namespace fanout::comm {

void ExpertParallel::combine_recv_add(const float*, void*) {
    FANOUT_FAIL(
        "this EP backend (rank {} of {}) combines into an output of its own (combine_recv), not into the "
        "residual",
        config().rank, config().world);
}

void validate(const EpConfig& c) {
    FANOUT_CHECK(c.world >= 1, "EP config: world must be >= 1, got {}", c.world);
    FANOUT_CHECK(c.rank >= 0 && c.rank < c.world, "EP config: rank {} outside [0, {})", c.rank, c.world);
    FANOUT_CHECK(c.num_experts >= c.world && c.num_experts % c.world == 0,
                 "EP config: {} experts do not divide over {} ranks", c.num_experts, c.world);
    validate(c.parallel(), c.num_experts);
    FANOUT_CHECK(c.experts_per_token >= 1 && c.experts_per_token <= c.num_experts,
                 "EP config: top-k {} outside [1, {}]", c.experts_per_token, c.num_experts);
    FANOUT_CHECK(c.hidden >= 1, "EP config: hidden must be >= 1, got {}", c.hidden);
    FANOUT_CHECK(c.max_tokens_per_rank >= 1, "EP config: max tokens per rank must be >= 1, got {}",
                 c.max_tokens_per_rank);
    FANOUT_CHECK(c.max_m >= 0, "EP config: max_m must be >= 0, got {}", c.max_m);
}

}  // namespace fanout::comm

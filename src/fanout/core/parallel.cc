#include "fanout/core/parallel.h"

#include "fanout/core/error.h"

namespace fanout {

void validate(const ParallelConfig& p, int64_t num_experts) {
    FANOUT_CHECK(p.ep >= 1, "parallel config: ep must be >= 1, got {}", p.ep);
    FANOUT_CHECK(p.rank >= 0 && p.rank < p.ep, "parallel config: rank {} outside [0, {}) (ep={})", p.rank, p.ep, p.ep);
    FANOUT_CHECK(p.tp >= 1 && p.ep % p.tp == 0, "parallel config: tp={} must divide ep={}", p.tp, p.ep);
    FANOUT_CHECK(num_experts == 0 || (num_experts >= p.ep && num_experts % p.ep == 0),
                 "parallel config: ep={} does not divide the model's {} routed experts", p.ep, num_experts);
}

}  // namespace fanout

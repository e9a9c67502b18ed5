// Where a request runs among targets that each keep their own KV cache — the engines behind the
// router (router/router.h), the ranks of a DP group (dp_group.h) — and the index, per target, of
// the KV blocks it holds (by kv::block_hash chain hash, from its KV events: kv_events.h), which the
// choice reads.
//
// Policies (PlacementConfig::policy):
//  * prefix (default): a target's cost is the prompt's blocks it would still have to prefill plus
//    load_weight × its requests in flight; the cheapest wins. While the loads diverge (the busiest
//    eligible target has more than balance_slack requests more than the idlest) the least loaded
//    wins instead, so a hot prefix cannot pile everything onto one target.
//  * least-load: fewest requests in flight.
//  * round-robin: in turn.
// Ties go to fewer tokens still to process, then to the lower index.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

namespace fanout::engine {

struct PlacementConfig {
    std::string policy = "prefix";  // prefix | least-load | round-robin
    double load_weight = 1.0;       // blocks of prefill one request in flight is worth
    int64_t balance_slack = 8;      // in-flight spread past which the least loaded wins
};

// Throws Error naming the field that is out of range.
void validate(const PlacementConfig& config);

class Placer {
  public:
    Placer(PlacementConfig config, int targets);

    const PlacementConfig& config() const { return config_; }
    int size() const { return static_cast<int>(index_.size()); }

    // What changed in target t's index: the hashes it gained and lost.
    struct Delta {
        std::vector<uint64_t> added, removed;
    };
    // Target t's cached blocks changed; `reset`: `stored` is the whole set (what it had before and
    // is not in it is gone).
    Delta update(int t, bool reset, const std::vector<uint64_t>& stored, const std::vector<uint64_t>& removed);
    // Drops target t's index (it went away; it is rebuilt from a reset).
    Delta forget(int t);
    int64_t indexed_blocks(int t) const;
    // How many of `hashes`, from the first, target t holds.
    int64_t cached_prefix(int t, const std::vector<uint64_t>& hashes) const;

    struct Target {
        bool eligible = true;  // healthy and with room for one more
        int64_t requests = 0;  // in flight
        int64_t tokens = 0;    // still to process (the tie-break)
    };
    struct Choice {
        int target = -1;  // -1: none eligible
        int64_t cached_blocks = 0, prompt_blocks = 0;
    };
    // The target for a prompt whose block hashes are `hashes`; targets.size() must be size().
    // Round-robin's turn moves on past the one chosen.
    Choice choose(const std::vector<uint64_t>& hashes, const std::vector<Target>& targets);
    // The same choice without moving the turn (where a prompt would go; tests and logs).
    Choice preview(const std::vector<uint64_t>& hashes, const std::vector<Target>& targets) const;

  private:
    PlacementConfig config_;
    std::vector<std::unordered_set<uint64_t>> index_;
    int64_t next_rr_ = 0;
};

}  // namespace fanout::engine

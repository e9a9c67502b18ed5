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
//
// Pending blocks (the prefix policy): a target's KV events arrive some time after a request is
// placed on it (after its prefill), so two requests sharing a prefix sent close together would
// otherwise both see it cached nowhere and land apart. choose() (not preview()) therefore counts the
// chosen prompt's blocks that target does not index yet as pending there until pending_ttl passes
// (each placement renews it); until then they count as held. The target's events settle them: a
// block stored becomes an ordinary indexed block, one removed is dropped; forget() drops them all;
// a reset keeps those it does not list (its requests placed since may not have run yet). Pending
// blocks are never part of the index proper: indexed_blocks() and the Deltas count confirmed blocks
// only (a DP group publishes the union of its ranks' indexes from those Deltas).
//
// Not thread-safe: the router and a DP group's rank 0 call it under their own locks.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace fanout::engine {

struct PlacementConfig {
    std::string policy = "prefix";  // prefix | least-load | round-robin
    double load_weight = 1.0;       // blocks of prefill one request in flight is worth
    int64_t balance_slack = 8;      // in-flight spread past which the least loaded wins
    // Seconds a placed prompt's blocks count as held on its target before that target's KV events
    // confirm them (0: not at all). Confirmation takes the request's wait in the queue and its
    // prefill plus the events' trip back (a stream message from an engine, the next step report
    // in a DP group): normally well under a second, so 2 s leaves room for a loaded target. Blocks
    // that never come (the request failed or was cancelled before its prefill, the target caches
    // nothing) mislead placement for at most that long after the last placement there; an
    // eviction's removal event drops them at once. Expired, they count for nothing.
    double pending_ttl = 2.0;
};

// Throws Error naming the field that is out of range.
void validate(const PlacementConfig& config);

class Placer {
  public:
    using TimePoint = std::chrono::steady_clock::time_point;
    using Clock = std::function<TimePoint()>;  // what pending deadlines are read against
    // `clock`: empty for std::chrono::steady_clock::now (tests pass their own).
    Placer(PlacementConfig config, int targets, Clock clock = {});

    const PlacementConfig& config() const { return config_; }
    int size() const { return static_cast<int>(index_.size()); }

    // What changed in target t's index: the hashes it gained and lost (pending blocks are not in
    // the index: one confirmed is "added", one dropped unconfirmed is in neither).
    struct Delta {
        std::vector<uint64_t> added, removed;
    };
    // Target t's cached blocks changed; `reset`: `stored` is the whole set (what it had before and
    // is not in it is gone). Blocks stored or removed are no longer pending on t.
    Delta update(int t, bool reset, const std::vector<uint64_t>& stored, const std::vector<uint64_t>& removed);
    // Drops target t's index and its pending blocks (it went away; it is rebuilt from a reset).
    Delta forget(int t);
    int64_t indexed_blocks(int t) const;  // confirmed blocks only
    // How many of `hashes`, from the first, target t holds: indexed, or pending and unexpired.
    int64_t cached_prefix(int t, const std::vector<uint64_t>& hashes) const;

    struct Target {
        bool eligible = true;  // healthy and with room for one more
        int64_t requests = 0;  // in flight
        int64_t tokens = 0;    // still to process (the tie-break)
    };
    struct Choice {
        int target = -1;  // -1: none eligible
        // cached_blocks: the prompt's leading blocks the target holds, as cached_prefix() counts them
        int64_t cached_blocks = 0, prompt_blocks = 0;
    };
    // The target for a prompt whose block hashes are `hashes`; targets.size() must be size().
    // Round-robin's turn moves on past the one chosen; under the prefix policy the prompt's blocks
    // the chosen target does not index become pending there.
    Choice choose(const std::vector<uint64_t>& hashes, const std::vector<Target>& targets);
    // The same choice without moving the turn or adding pending blocks (where a prompt would go;
    // tests and logs).
    Choice preview(const std::vector<uint64_t>& hashes, const std::vector<Target>& targets) const;

  private:
    // One target's blocks: those its KV events confirmed, and those placed there and not yet
    // confirmed, each with its deadline. `expiry` holds the deadlines in the order they were set
    // (the clock does not go back), so expired entries leave from its front; an entry whose hash
    // was confirmed or renewed since is stale and leaves without touching `pending`.
    struct Index {
        std::unordered_set<uint64_t> blocks;
        std::unordered_map<uint64_t, TimePoint> pending;
        std::deque<std::pair<TimePoint, uint64_t>> expiry;
    };
    Index& index(int t);
    static int64_t held_prefix(const Index& x, const std::vector<uint64_t>& hashes, TimePoint now);
    Choice choice_at(const std::vector<uint64_t>& hashes, const std::vector<Target>& targets, TimePoint now) const;
    void add_pending(Index& x, const std::vector<uint64_t>& hashes, TimePoint now);
    static void drop_expired(Index& x, TimePoint now);

    PlacementConfig config_;
    Clock clock_;
    std::vector<Index> index_;
    int64_t next_rr_ = 0;
};

}  // namespace fanout::engine

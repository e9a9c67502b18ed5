#include "fanout/engine/placement.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "fanout/core/error.h"

namespace fanout::engine {

namespace {
constexpr double kMaxPendingTtl = 3600;  // seconds; past it a placement's guess outlives any prefill
}  // namespace

void validate(const PlacementConfig& c) {
    FANOUT_CHECK(c.policy == "prefix" || c.policy == "least-load" || c.policy == "round-robin",
                 "placement policy '{}' is not prefix, least-load or round-robin", c.policy);
    FANOUT_CHECK(std::isfinite(c.load_weight) && c.load_weight >= 0,
                 "placement: load weight must be a finite number >= 0, got {}", c.load_weight);
    FANOUT_CHECK(c.balance_slack >= 0, "placement: balance slack must be >= 0, got {}", c.balance_slack);
    FANOUT_CHECK(std::isfinite(c.pending_ttl) && c.pending_ttl >= 0 && c.pending_ttl <= kMaxPendingTtl,
                 "placement: pending TTL must be 0 to {} seconds, got {}", kMaxPendingTtl, c.pending_ttl);
}

Placer::Placer(PlacementConfig config, int targets, Clock clock)
    : config_(std::move(config)),
      clock_(clock ? std::move(clock) : Clock([] { return std::chrono::steady_clock::now(); })),
      index_(static_cast<size_t>(std::max(targets, 0))) {
    validate(config_);
    FANOUT_CHECK(targets >= 1, "placement over {} targets", targets);
}

Placer::Index& Placer::index(int t) {
    FANOUT_CHECK(t >= 0 && t < size(), "placement: target {} of {}", t, size());
    return index_[static_cast<size_t>(t)];
}

Placer::Delta Placer::update(int t, bool reset, const std::vector<uint64_t>& stored,
                             const std::vector<uint64_t>& removed) {
    Index& x = index(t);
    auto& set = x.blocks;
    Delta d;
    if (reset) {
        const std::unordered_set<uint64_t> now(stored.begin(), stored.end());
        for (uint64_t h : set)
            if (!now.count(h)) d.removed.push_back(h);
        for (uint64_t h : now)
            if (!set.count(h)) d.added.push_back(h);
        set = now;
    } else {
        for (uint64_t h : stored)
            if (set.insert(h).second) d.added.push_back(h);
        for (uint64_t h : removed)
            if (set.erase(h)) d.removed.push_back(h);
    }
    // Confirmed (now indexed) or evicted: no longer pending either way.
    for (uint64_t h : stored) x.pending.erase(h);
    for (uint64_t h : removed) x.pending.erase(h);
    drop_expired(x, clock_());
    return d;
}

Placer::Delta Placer::forget(int t) {
    Index& x = index(t);
    x.pending.clear();
    x.expiry.clear();
    return update(t, true, {}, {});
}

int64_t Placer::indexed_blocks(int t) const {
    return static_cast<int64_t>(index_.at(static_cast<size_t>(t)).blocks.size());
}

int64_t Placer::cached_prefix(int t, const std::vector<uint64_t>& hashes) const {
    return held_prefix(index_.at(static_cast<size_t>(t)), hashes, clock_());
}

int64_t Placer::held_prefix(const Index& x, const std::vector<uint64_t>& hashes, TimePoint now) {
    int64_t n = 0;
    for (uint64_t h : hashes) {
        if (!x.blocks.count(h)) {
            const auto it = x.pending.find(h);
            if (it == x.pending.end() || it->second <= now) break;
        }
        ++n;
    }
    return n;
}

Placer::Choice Placer::choose(const std::vector<uint64_t>& hashes, const std::vector<Target>& targets) {
    const TimePoint now = clock_();
    for (Index& x : index_) drop_expired(x, now);
    Choice c = choice_at(hashes, targets, now);
    if (c.target >= 0 && config_.policy == "round-robin") next_rr_ = c.target + 1;
    // Only the prefix policy reads the index (the router watches no KV events under the others).
    if (c.target >= 0 && config_.policy == "prefix") add_pending(index(c.target), hashes, now);
    return c;
}

Placer::Choice Placer::preview(const std::vector<uint64_t>& hashes, const std::vector<Target>& targets) const {
    return choice_at(hashes, targets, clock_());
}

// The prompt's blocks that x does not index become pending until now + pending_ttl (renewed for
// those already pending: this request, too, will prefill or reuse them).
void Placer::add_pending(Index& x, const std::vector<uint64_t>& hashes, TimePoint now) {
    if (config_.pending_ttl <= 0) return;
    const TimePoint deadline =
        now + std::chrono::duration_cast<TimePoint::duration>(std::chrono::duration<double>(config_.pending_ttl));
    for (uint64_t h : hashes) {
        if (x.blocks.count(h)) continue;
        x.pending[h] = deadline;
        x.expiry.emplace_back(deadline, h);
    }
}

// After this, x.expiry's front (if any) has a deadline past `now`; a hash leaves `pending` only if
// its own (latest) deadline has passed.
void Placer::drop_expired(Index& x, TimePoint now) {
    while (!x.expiry.empty() && x.expiry.front().first <= now) {
        const auto it = x.pending.find(x.expiry.front().second);
        if (it != x.pending.end() && it->second <= now) x.pending.erase(it);
        x.expiry.pop_front();
    }
}

Placer::Choice Placer::choice_at(const std::vector<uint64_t>& hashes, const std::vector<Target>& targets,
                                 TimePoint now) const {
    FANOUT_CHECK(static_cast<int>(targets.size()) == size(), "placement: {} targets' loads for {} targets",
                 targets.size(), size());
    Choice best;
    best.prompt_blocks = static_cast<int64_t>(hashes.size());
    if (config_.policy == "round-robin") {
        for (int tried = 0; tried < size(); ++tried) {
            const int t = static_cast<int>((next_rr_ + tried) % size());
            if (targets[static_cast<size_t>(t)].eligible) {
                best.target = t;
                best.cached_blocks = held_prefix(index_[static_cast<size_t>(t)], hashes, now);
                return best;
            }
        }
        return best;
    }
    int64_t lo = INT64_MAX, hi = 0;
    for (const Target& t : targets)
        if (t.eligible) {
            lo = std::min(lo, t.requests);
            hi = std::max(hi, t.requests);
        }
    const bool by_prefix = config_.policy == "prefix" && hi - lo <= config_.balance_slack;
    double best_cost = 0;
    for (int t = 0; t < size(); ++t) {
        const Target& x = targets[static_cast<size_t>(t)];
        if (!x.eligible) continue;
        const int64_t cached = held_prefix(index_[static_cast<size_t>(t)], hashes, now);
        const double cost = by_prefix ? static_cast<double>(best.prompt_blocks - cached) +
                                            config_.load_weight * static_cast<double>(x.requests)
                                      : static_cast<double>(x.requests);
        if (best.target < 0 ||
            std::tie(cost, x.tokens) < std::tie(best_cost, targets[static_cast<size_t>(best.target)].tokens)) {
            best.target = t;
            best.cached_blocks = cached;
            best_cost = cost;
        }
    }
    return best;
}

}  // namespace fanout::engine

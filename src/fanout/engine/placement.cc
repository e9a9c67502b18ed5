#include "fanout/engine/placement.h"

#include <algorithm>
#include <tuple>

#include "fanout/core/error.h"

namespace fanout::engine {

void validate(const PlacementConfig& c) {
    FANOUT_CHECK(c.policy == "prefix" || c.policy == "least-load" || c.policy == "round-robin",
                 "placement policy '{}' is not prefix, least-load or round-robin", c.policy);
    FANOUT_CHECK(c.load_weight >= 0, "placement: load weight must be >= 0, got {}", c.load_weight);
    FANOUT_CHECK(c.balance_slack >= 0, "placement: balance slack must be >= 0, got {}", c.balance_slack);
}

Placer::Placer(PlacementConfig config, int targets)
    : config_(std::move(config)), index_(static_cast<size_t>(std::max(targets, 0))) {
    validate(config_);
    FANOUT_CHECK(targets >= 1, "placement over {} targets", targets);
}

Placer::Delta Placer::update(int t, bool reset, const std::vector<uint64_t>& stored,
                             const std::vector<uint64_t>& removed) {
    FANOUT_CHECK(t >= 0 && t < size(), "placement: target {} of {}", t, size());
    auto& set = index_[static_cast<size_t>(t)];
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
    return d;
}

Placer::Delta Placer::forget(int t) { return update(t, true, {}, {}); }

int64_t Placer::indexed_blocks(int t) const { return static_cast<int64_t>(index_.at(static_cast<size_t>(t)).size()); }

int64_t Placer::cached_prefix(int t, const std::vector<uint64_t>& hashes) const {
    const auto& set = index_.at(static_cast<size_t>(t));
    int64_t n = 0;
    while (n < static_cast<int64_t>(hashes.size()) && set.count(hashes[static_cast<size_t>(n)])) ++n;
    return n;
}

Placer::Choice Placer::choose(const std::vector<uint64_t>& hashes, const std::vector<Target>& targets) {
    Choice c = preview(hashes, targets);
    if (c.target >= 0 && config_.policy == "round-robin") next_rr_ = c.target + 1;
    return c;
}

Placer::Choice Placer::preview(const std::vector<uint64_t>& hashes, const std::vector<Target>& targets) const {
    FANOUT_CHECK(static_cast<int>(targets.size()) == size(), "placement: {} targets' loads for {} targets",
                 targets.size(), size());
    Choice best;
    best.prompt_blocks = static_cast<int64_t>(hashes.size());
    if (config_.policy == "round-robin") {
        for (int tried = 0; tried < size(); ++tried) {
            const int t = static_cast<int>((next_rr_ + tried) % size());
            if (targets[static_cast<size_t>(t)].eligible) {
                best.target = t;
                best.cached_blocks = cached_prefix(t, hashes);
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
        const int64_t cached = cached_prefix(t, hashes);
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

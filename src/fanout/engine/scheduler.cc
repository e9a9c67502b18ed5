#include "fanout/engine/scheduler.h"

#include <algorithm>
#include <cmath>

#include "fanout/core/error.h"

namespace fanout::engine {

namespace {

// A chunk's price: n + per_pair · Σ_{i<n} (s + i + 1) + per_key · (s + n).
struct Price {
    double per_pair = 0, per_key = 0;
    double of(int64_t start, int64_t num_tokens) const {
        const double n = static_cast<double>(num_tokens), s = static_cast<double>(start);
        return n + per_pair * (n * s + n * (n + 1) * 0.5) + per_key * (s + n);
    }
    // The most tokens, at most max_tokens, whose price fits in budget (0 if none).
    int64_t within(int64_t start, int64_t max_tokens, double budget) const {
        if (max_tokens <= 0 || !(budget >= of(start, 1))) return 0;
        // of(n) = a/2 · n² + b · n + c with b = 1 + a · (start + 1/2) + per_key, c = per_key · start:
        // the positive root of of(n) = budget, written to stay exact (= budget − c) when a = 0.
        const double a = per_pair, left = budget - per_key * static_cast<double>(start);
        const double b = 1.0 + a * (static_cast<double>(start) + 0.5) + per_key;
        const double root = 2.0 * left / (b + std::sqrt(b * b + 2.0 * a * left));
        int64_t n = std::clamp<int64_t>(static_cast<int64_t>(std::floor(root)), 1, max_tokens);
        // The root is within rounding of the answer: settle it on the exact cost.
        while (n < max_tokens && of(start, n + 1) <= budget) ++n;
        while (n > 1 && of(start, n) > budget) --n;
        return n;
    }
};

// Whether a chunk [start, start + n) takes the long-chunk price.
bool long_chunk(const SchedulerConfig& c, int64_t start, int64_t n) {
    return c.long_chunk_cost_per_pair >= 0 && n > c.long_chunk_tokens && start + n <= c.long_chunk_max_context;
}

}  // namespace

double chunk_cost(const SchedulerConfig& c, int64_t start, int64_t num_tokens) {
    return long_chunk(c, start, num_tokens)
               ? Price{c.long_chunk_cost_per_pair, c.long_chunk_cost_per_key}.of(start, num_tokens)
               : Price{c.attention_cost_per_pair}.of(start, num_tokens);
}

int64_t tokens_within(const SchedulerConfig& c, int64_t start, int64_t max_tokens, double budget) {
    // n in [1, short_max] and past long_max take the plain price, (short_max, long_max] the long
    // chunks'; each is monotone in n, so the answer is the longest fit of the last region that has one.
    const Price plain{c.attention_cost_per_pair}, longp{c.long_chunk_cost_per_pair, c.long_chunk_cost_per_key};
    const int64_t short_max = std::min(max_tokens, std::max(c.long_chunk_tokens, int64_t{0}));
    const int64_t long_max = std::min(max_tokens, c.long_chunk_max_context - start);
    if (c.long_chunk_cost_per_pair < 0 || long_max <= short_max) return plain.within(start, max_tokens, budget);
    if (const int64_t n = plain.within(start, max_tokens, budget); n > long_max) return n;
    if (const int64_t n = longp.within(start, long_max, budget); n > short_max) return n;
    return plain.within(start, short_max, budget);
}

Scheduler::Scheduler(const SchedulerConfig& config, kv::PrefixCache& cache) : config_(config), cache_(cache) {
    FANOUT_CHECK(config.max_num_seqs > 0 && config.max_batched_tokens > 0 && config.prefill_chunk > 0,
                 "scheduler: max_num_seqs={} max_batched_tokens={} prefill_chunk={} must be positive",
                 config.max_num_seqs, config.max_batched_tokens, config.prefill_chunk);
    FANOUT_CHECK(std::isfinite(config.attention_cost_per_pair) && config.attention_cost_per_pair >= 0.0,
                 "scheduler: attention_cost_per_pair={} must be a finite number >= 0", config.attention_cost_per_pair);
    FANOUT_CHECK(std::isfinite(config.long_chunk_cost_per_pair) && std::isfinite(config.long_chunk_cost_per_key) &&
                     config.long_chunk_cost_per_key >= 0.0 && config.long_chunk_tokens >= 0,
                 "scheduler: long_chunk_cost_per_pair={} (< 0: none), long_chunk_cost_per_key={} and "
                 "long_chunk_tokens={} must be finite, the last two >= 0",
                 config.long_chunk_cost_per_pair, config.long_chunk_cost_per_key, config.long_chunk_tokens);
}

double Scheduler::step_cost(const std::vector<ScheduledSeq>& step) const {
    double cost = 0.0;
    for (const auto& s : step) cost += chunk_cost(config_, s.start, s.num_tokens);
    return cost;
}

// At most prefill_chunk tokens and prefill_chunk token-equivalents (one token always passes that
// cap), within the budget; one token regardless when it is the step's first work.
int64_t Scheduler::first_share(const Sequence& seq, double budget, bool first_of_step) const {
    const int64_t start = seq.num_computed;
    const int64_t max_tokens = std::min(seq.work_len() - start, config_.prefill_chunk);
    const double cap = std::max(static_cast<double>(config_.prefill_chunk), chunk_cost(config_, start, 1));
    const int64_t n = tokens_within(config_, start, max_tokens, std::min(budget, cap));
    return n == 0 && first_of_step ? std::min<int64_t>(1, max_tokens) : n;
}

void Scheduler::grow_chunks(std::vector<ScheduledSeq>& out, double budget) {
    if (config_.attention_cost_per_pair == 0.0 && config_.long_chunk_cost_per_pair <= 0.0 &&
        config_.long_chunk_cost_per_key == 0.0)
        return;  // the first pass already took min(remaining, budget, prefill_chunk)
    const int64_t bs = cache_.block_size();
    for (auto& s : out) {
        if (budget <= 0.0) break;
        Sequence* seq = s.seq;
        const int64_t max_tokens = std::min(seq->work_len() - s.start, config_.prefill_chunk);
        if (s.num_tokens >= max_tokens) continue;
        const double had = chunk_cost(config_, s.start, s.num_tokens);
        int64_t n = tokens_within(config_, s.start, max_tokens, budget + had);
        if (n > s.num_tokens && !ensure_blocks(seq, s.start + n))  // no preemption to grow: keep to the blocks held
            n = std::min(n, static_cast<int64_t>(seq->blocks.size()) * bs - s.start);
        if (n <= s.num_tokens) continue;
        budget -= chunk_cost(config_, s.start, n) - had;
        s.num_tokens = n;
        s.wants_logits = s.start + n >= seq->total_len();
    }
}

void Scheduler::add(std::shared_ptr<Sequence> seq) {
    seq->state = SeqState::kWaiting;
    waiting_.push_back(std::move(seq));
}

// Grows seq's blocks to hold num_tokens tokens; false when the cache cannot supply them.
bool Scheduler::ensure_blocks(Sequence* seq, int64_t num_tokens) {
    const int64_t bs = cache_.block_size();
    const int64_t need = (num_tokens + bs - 1) / bs - static_cast<int64_t>(seq->blocks.size());
    if (need <= 0) return true;
    if (!cache_.can_allocate(need)) return false;
    const auto more = cache_.allocate(need);
    seq->blocks.insert(seq->blocks.end(), more.begin(), more.end());
    return true;
}

void Scheduler::reserve_lookahead(const ScheduledSeq& s) {
    if (s.wants_logits && config_.draft_lookahead > 0) {
        int64_t slots = s.start + s.num_tokens + config_.draft_lookahead;
        if (config_.max_context > 0) slots = std::min(slots, std::max(config_.max_context, s.start + s.num_tokens));
        ensure_blocks(s.seq, slots);  // best effort
    }
}

void Scheduler::preempt(Sequence* seq) {
    cache_.release(seq->blocks);
    seq->blocks.clear();
    seq->draft.clear();
    seq->num_computed = 0;
    seq->num_inserted_blocks = 0;
    seq->passed_over = 0;
    ++seq->num_preemptions;
    ++total_preemptions_;
    const auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& p) { return p.get() == seq; });
    std::shared_ptr<Sequence> owned = *it;
    running_.erase(it);
    owned->state = SeqState::kWaiting;
    waiting_.push_front(std::move(owned));
}

std::vector<ScheduledSeq> Scheduler::schedule() {
    std::vector<ScheduledSeq> out;
    double budget = static_cast<double>(config_.max_batched_tokens);
    // One running sequence's share (`force`: at least one token, over budget if need be); false
    // when it left running_ (preempted), so the loop's index stays.
    const auto take = [&](Sequence* seq, bool force) {
        const int64_t n = first_share(*seq, budget, force);
        if (n == 0) return true;  // does not fit what is left: next step
        int64_t n_ok = n;
        bool ok = ensure_blocks(seq, seq->num_computed + n);
        if (!ok && n > seq->total_len() - seq->num_computed) {  // the draft does not fit: check none this step
            n_ok = seq->total_len() - seq->num_computed;
            ok = ensure_blocks(seq, seq->num_computed + n_ok);
        }
        while (!ok && running_.back().get() != seq) {
            // The youngest gives way — also the owed sequence, scheduled first but younger: its
            // share is taken back.
            Sequence* victim = running_.back().get();
            const auto it =
                std::find_if(out.begin(), out.end(), [&](const ScheduledSeq& x) { return x.seq == victim; });
            if (it != out.end()) {
                budget += chunk_cost(config_, it->start, it->num_tokens);
                out.erase(it);
            }
            preempt(victim);
            ok = ensure_blocks(seq, seq->num_computed + n_ok);
        }
        if (!ok) {  // nothing younger left to preempt: this one waits
            preempt(seq);
            return false;
        }
        out.push_back({seq, seq->num_computed, n_ok, seq->num_computed + n_ok >= seq->total_len()});
        budget -= chunk_cost(config_, seq->num_computed, n_ok);
        return true;
    };
    // 1. Running sequences, oldest first; the youngest give way when blocks run out. The step's
    // first work is the sequence passed over longest, if any (ties: the oldest): the one token a
    // step may take over budget goes to it, so one whose single token exceeds the budget takes
    // turns with the others instead of holding them all.
    Sequence* owed = nullptr;
    for (const auto& p : running_)
        if (p->passed_over > (owed != nullptr ? owed->passed_over : 0)) owed = p.get();
    if (owed != nullptr) take(owed, true);
    for (size_t i = 0; i < running_.size() && budget > 0;) {
        Sequence* seq = running_[i].get();
        if (seq == owed || take(seq, out.empty())) ++i;
    }
    // 2. Waiting sequences, first come first served (no skipping ahead of one that cannot fit).
    while (!waiting_.empty() && budget > 0 && static_cast<int64_t>(running_.size()) < config_.max_num_seqs) {
        Sequence* seq = waiting_.front().get();
        if (config_.enable_prefix_cache && seq->blocks.empty() && seq->num_computed == 0) {
            // Reuse the longest cached prefix; keep at least the last token to compute (its logits).
            const int64_t max_blocks = (seq->total_len() - 1) / cache_.block_size();
            seq->blocks = cache_.acquire_prefix(seq->tokens, max_blocks);
            seq->num_computed = static_cast<int64_t>(seq->blocks.size()) * cache_.block_size();
            seq->num_inserted_blocks = static_cast<int64_t>(seq->blocks.size());
            if (seq->num_preemptions == 0) seq->prefix_hit_tokens = seq->num_computed;
        }
        const int64_t n = first_share(*seq, budget, out.empty());
        if (n == 0 || !ensure_blocks(seq, seq->num_computed + n)) {
            // A waiting sequence holds no blocks: give the prefix back (it stays cached) and retry later.
            cache_.release(seq->blocks);
            seq->blocks.clear();
            seq->num_computed = 0;
            seq->num_inserted_blocks = 0;
            break;
        }
        std::shared_ptr<Sequence> owned = std::move(waiting_.front());
        waiting_.pop_front();
        owned->state = SeqState::kRunning;
        running_.push_back(owned);
        out.push_back({seq, seq->num_computed, n, seq->num_computed + n >= seq->total_len()});
        budget -= chunk_cost(config_, seq->num_computed, n);
    }
    // 3. What the budget still holds goes to the chunks that took less than prefill_chunk tokens.
    grow_chunks(out, budget);
    for (const auto& p : running_) ++p->passed_over;
    for (const auto& s : out) s.seq->passed_over = 0;
    for (const auto& s : out) reserve_lookahead(s);
    // 4. The step lists its decodes first, then its prefill chunks, each in the order above: the
    // GPU model runs the first in the absorbed form and the chunks after them in the MHA form.
    std::stable_partition(out.begin(), out.end(), [](const ScheduledSeq& s) { return s.is_decode(); });
    return out;
}

void Scheduler::commit(const std::vector<ScheduledSeq>& step) {
    const int64_t bs = cache_.block_size();
    for (const auto& s : step) {
        Sequence* seq = s.seq;
        seq->num_computed = s.start + s.num_tokens;
        const int64_t full = std::min(seq->num_computed, seq->total_len()) / bs;  // never a draft's block
        if (config_.enable_prefix_cache && full > seq->num_inserted_blocks) {
            cache_.insert(std::span(seq->tokens).first(static_cast<size_t>(full * bs)), seq->blocks);
            seq->num_inserted_blocks = full;
        }
    }
}

void Scheduler::finish(Sequence* seq) {
    const auto drop = [&](auto& list) {
        const auto it = std::find_if(list.begin(), list.end(), [&](const auto& p) { return p.get() == seq; });
        if (it == list.end()) return std::shared_ptr<Sequence>();
        std::shared_ptr<Sequence> owned = *it;
        list.erase(it);
        return owned;
    };
    std::shared_ptr<Sequence> owned = drop(running_);
    if (!owned) owned = drop(waiting_);
    cache_.release(seq->blocks);
    seq->blocks.clear();
    seq->state = SeqState::kFinished;
}

}  // namespace fanout::engine

#include "fanout/engine/scheduler.h"

#include <algorithm>

#include "fanout/core/error.h"

namespace fanout::engine {

Scheduler::Scheduler(const SchedulerConfig& config, kv::PrefixCache& cache) : config_(config), cache_(cache) {
    FANOUT_CHECK(config.max_num_seqs > 0 && config.max_batched_tokens > 0 && config.prefill_chunk > 0,
                 "scheduler: max_num_seqs={} max_batched_tokens={} prefill_chunk={} must be positive",
                 config.max_num_seqs, config.max_batched_tokens, config.prefill_chunk);
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

void Scheduler::preempt(Sequence* seq) {
    cache_.release(seq->blocks);
    seq->blocks.clear();
    seq->num_computed = 0;
    seq->num_inserted_blocks = 0;
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
    int64_t budget = config_.max_batched_tokens;
    // 1. Running sequences, oldest first; the youngest give way when blocks run out.
    for (size_t i = 0; i < running_.size() && budget > 0;) {
        Sequence* seq = running_[i].get();
        const int64_t remaining = seq->total_len() - seq->num_computed;
        const int64_t n = std::min({remaining, budget, config_.prefill_chunk});
        bool ok = ensure_blocks(seq, seq->num_computed + n);
        while (!ok && running_.back().get() != seq) {
            preempt(running_.back().get());
            ok = ensure_blocks(seq, seq->num_computed + n);
        }
        if (!ok) {  // nothing younger left to preempt: this one waits
            preempt(seq);
            continue;
        }
        out.push_back({seq, seq->num_computed, n, seq->num_computed + n == seq->total_len()});
        budget -= n;
        ++i;
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
        const int64_t remaining = seq->total_len() - seq->num_computed;
        const int64_t n = std::min({remaining, budget, config_.prefill_chunk});
        if (!ensure_blocks(seq, seq->num_computed + n)) {
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
        out.push_back({seq, seq->num_computed, n, seq->num_computed + n == seq->total_len()});
        budget -= n;
    }
    return out;
}

void Scheduler::commit(const std::vector<ScheduledSeq>& step) {
    const int64_t bs = cache_.block_size();
    for (const auto& s : step) {
        Sequence* seq = s.seq;
        seq->num_computed = s.start + s.num_tokens;
        const int64_t full = seq->num_computed / bs;
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

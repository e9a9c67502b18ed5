// Continuous-batching scheduler: which sequences run in the next step, and how many tokens each.
//
// Every step has a token budget (max_batched_tokens) and a cap on running sequences. Running
// sequences go first, in arrival order: a decoding one takes 1 token, a prefilling one its next
// chunk. Then waiting sequences are admitted first-come-first-served while budget, the sequence cap
// and KV blocks allow; an admitted prompt first takes its longest cached prefix from the
// PrefixCache. When a running sequence needs a block and none can be had, the most recently
// arrived running sequence is preempted by recompute: its blocks are released and it waits again
// at the front of the queue, to prefill prompt + output so far. Plain data: no tensors, no model.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "fanout/kv/prefix_cache.h"

namespace fanout::engine {

enum class SeqState { kWaiting, kRunning, kFinished };

struct Sequence {
    int64_t id = 0;
    std::vector<int32_t> tokens;  // prompt, then generated tokens
    int64_t prompt_len = 0;
    int64_t max_tokens = 0;
    SeqState state = SeqState::kWaiting;
    int64_t num_computed = 0;       // tokens whose KV is in the cache
    int64_t num_inserted_blocks = 0;  // full blocks already entered in the prefix cache
    int64_t prefix_hit_tokens = 0;  // prompt tokens reused from the cache at (first) admission
    int64_t num_preemptions = 0;
    std::vector<int32_t> blocks;

    int64_t num_generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
    int64_t total_len() const { return static_cast<int64_t>(tokens.size()); }
};

struct SchedulerConfig {
    int64_t max_num_seqs = 64;
    int64_t max_batched_tokens = 2048;
    int64_t prefill_chunk = 512;  // most prompt tokens of one sequence in one step
    bool enable_prefix_cache = true;
};

// One sequence's share of a step: tokens [start, start + num_tokens) of seq->tokens.
struct ScheduledSeq {
    Sequence* seq;
    int64_t start;
    int64_t num_tokens;
    bool wants_logits;  // the chunk reaches the last known token: sample after it
};

class Scheduler {
public:
    Scheduler(const SchedulerConfig& config, kv::PrefixCache& cache);

    void add(std::shared_ptr<Sequence> seq);
    // The next step's work; empty when nothing can run.
    std::vector<ScheduledSeq> schedule();
    // After the step ran: KV of the scheduled chunks is in the cache; full blocks enter the prefix cache.
    void commit(const std::vector<ScheduledSeq>& step);
    // Removes a sequence (finished or aborted) and releases its blocks.
    void finish(Sequence* seq);

    int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
    int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
    bool idle() const { return waiting_.empty() && running_.empty(); }
    const SchedulerConfig& config() const { return config_; }
    int64_t total_preemptions() const { return total_preemptions_; }

private:
    bool ensure_blocks(Sequence* seq, int64_t num_tokens);
    void preempt(Sequence* seq);

    SchedulerConfig config_;
    kv::PrefixCache& cache_;
    std::deque<std::shared_ptr<Sequence>> waiting_;
    std::vector<std::shared_ptr<Sequence>> running_;  // arrival order
    int64_t total_preemptions_ = 0;
};

}  // namespace fanout::engine

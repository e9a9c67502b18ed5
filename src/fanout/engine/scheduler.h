// Continuous-batching scheduler: which sequences run in the next step, and how many tokens each.
//
// Every step has a cost budget (max_batched_tokens) and a cap on running sequences. Running
// sequences go first, in arrival order: a decoding one takes 1 token, a prefilling one its next
// chunk. Then waiting sequences are admitted first-come-first-served while budget, the sequence
// cap and KV blocks allow; an admitted prompt first takes its longest cached prefix from the
// PrefixCache. When a running sequence needs a block and none can be had, the most recently
// arrived running sequence is preempted by recompute: its blocks are released and it waits again
// at the front of the queue, to prefill prompt + output so far. The step's list then puts its
// decodes before its prefill chunks, each group in that order (the GPU model runs the two in
// different attention forms, deepseek_v3_cuda.h). Plain data: no tensors, no model.
//
// Cost: tokens [s, s + n) of a sequence cost n + attention_cost_per_pair · Σ_{i<n} (s + i + 1) —
// one token-equivalent per token plus the attention pairs of a causal chunk at context s — so a
// chunk deep into a long prompt is shrunk to what the budget holds, and one long prompt cannot
// stretch every other request's step. A chunk first takes at most prefill_chunk tokens *and*
// prefill_chunk token-equivalents, so the sequences behind it still find budget; budget left
// after everyone had a turn then lets the chunks grow back towards prefill_chunk tokens. The first
// work of a step always gets at least one token, over budget if it must: progress is guaranteed.
// That forced token takes turns: it goes to the running sequence passed over for the most steps
// in a row (one whose single token exceeds the budget waits its turn, so it cannot hold every
// sequence behind it at a standstill), and only when none was passed over to the step's first work.
// With attention_cost_per_pair = 0 a cost is a token count and this is the plain token budget.
// Long chunks may be priced apart (SchedulerConfig::long_chunk_*): the GPU runner runs their
// attention in MLA's MHA form — cheaper pairs, plus one expansion of the context's latents per
// context token — and a step's decodes in the absorbed form.
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
    int64_t num_computed = 0;         // tokens whose KV is in the cache
    int64_t num_inserted_blocks = 0;  // full blocks already entered in the prefix cache
    int64_t prefix_hit_tokens = 0;    // prompt tokens reused from the cache at (first) admission
    int64_t num_preemptions = 0;
    int64_t passed_over = 0;  // steps in a row it ran nothing while running (the scheduler's turns)
    std::vector<int32_t> blocks;
    // MTP speculative decoding: tokens proposed after `tokens`, computed (and checked) with the
    // last one in the next step; their KV becomes the sequence's only where they are accepted.
    std::vector<int32_t> draft;

    int64_t num_generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
    int64_t total_len() const { return static_cast<int64_t>(tokens.size()); }
    // Tokens to compute up to: the known ones and the draft.
    int64_t work_len() const { return total_len() + static_cast<int64_t>(draft.size()); }
};

struct SchedulerConfig {
    int64_t max_num_seqs = 64;
    int64_t max_batched_tokens = 2048;  // the step's budget in token-equivalents (see the top)
    int64_t prefill_chunk = 512;        // most prompt tokens of one sequence in one step
    bool enable_prefix_cache = true;
    // One (query, key) attention pair in token-equivalents (model/step_cost.h computes it); 0 =
    // count tokens only.
    double attention_cost_per_pair = 0.0;
    // KV slots a chunk that ends a sequence's known tokens also reserves past itself, when the
    // cache has them without preempting anyone (MTP drafting writes its layer's KV there).
    int64_t draft_lookahead = 0;
    // Positions a sequence may ever hold (the engine's context; 0: no limit): the lookahead stops
    // there, so no sequence holds more blocks than a runner allows a request.
    int64_t max_context = 0;
    // A chunk of more than long_chunk_tokens tokens whose context (start + its tokens) is at most
    // long_chunk_max_context costs n + long_chunk_cost_per_pair · Σ (s + i + 1) +
    // long_chunk_cost_per_key · (s + n) instead; long_chunk_cost_per_pair < 0: no such price.
    double long_chunk_cost_per_pair = -1.0;
    double long_chunk_cost_per_key = 0.0;
    int64_t long_chunk_tokens = 4;
    int64_t long_chunk_max_context = 0;
};

// The cost of computing tokens [start, start + num_tokens) of one sequence under config's prices
// (see the top).
double chunk_cost(const SchedulerConfig& config, int64_t start, int64_t num_tokens);
// The most tokens, at most max_tokens, from `start` whose chunk_cost fits in `budget` (0 if none).
int64_t tokens_within(const SchedulerConfig& config, int64_t start, int64_t max_tokens, double budget);

// One sequence's share of a step: tokens [start, start + num_tokens) of seq->tokens.
struct ScheduledSeq {
    Sequence* seq;
    int64_t start;
    int64_t num_tokens;
    bool wants_logits;  // the chunk reaches the last known token: sample after it (and check its draft)
    // A decode: it computes only from the last known token on (that token, and any draft).
    bool is_decode() const { return start + 1 >= seq->total_len(); }
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
    // The cost of a step, as schedule() counted it against max_batched_tokens.
    double step_cost(const std::vector<ScheduledSeq>& step) const;
    int64_t total_preemptions() const { return total_preemptions_; }

  private:
    bool ensure_blocks(Sequence* seq, int64_t num_tokens);
    // The tokens seq's next chunk gets from `budget` in the first pass (see the top).
    int64_t first_share(const Sequence& seq, double budget, bool first_of_step) const;
    // The last pass: chunks in `out` grow into what the budget still holds.
    void grow_chunks(std::vector<ScheduledSeq>& out, double budget);
    void preempt(Sequence* seq);
    void reserve_lookahead(const ScheduledSeq& s);

    SchedulerConfig config_;
    kv::PrefixCache& cache_;
    std::deque<std::shared_ptr<Sequence>> waiting_;
    std::vector<std::shared_ptr<Sequence>> running_;  // arrival order
    int64_t total_preemptions_ = 0;
};

}  // namespace fanout::engine

// Data-parallel engine ranks in lockstep (DESIGN: attention data-parallel, experts expert-parallel).
//
// Every rank is a whole Engine — its own scheduler, KV cache, prefix cache and runner — whose
// model holds its block of routed experts and reaches the others through the EP backend. All
// ranks step together because every MoE layer is a collective: a rank without requests runs an
// empty step (EngineConfig::lockstep) and still serves its experts. Batch sizes differ freely
// between ranks; nothing is padded and nothing about them is exchanged.
//
// Rank 0 is the front door (the RequestService the API server talks to) and the group's
// in-process router: submit() validates a request and queues it; each step rank 0 places the
// queued requests on ranks (EngineConfig::dp_placement, engine/placement.h — by default the rank
// already holding most of the prompt's KV blocks, weighed against its unfinished requests, as the
// router places them on engines) and sends them, with cancellations, in one message to every rank
// over the control plane (comm/control_plane.h). Each rank admits its own, steps, and reports the
// events its requests produced (text is detokenized where the request runs), its counters and its
// prefix cache's changes (by block hash) back to rank 0, which streams the events to the callers'
// handles and keeps an index of every rank's cached blocks. When no rank has work, the group
// sleeps in that message. Rank 0's kv_events() is the union of the ranks' caches, so a router in
// front of several DP groups (`fanout engine --ep N`) indexes each group as one engine.
//
// A failure anywhere (an exception in a step, a timeout, a malformed message) stops the whole
// group through the control plane with an error naming the rank. Threads: every rank's run()
// throws it, rank 0's requests in flight finish with "error", and later submissions are refused
// with it. Processes (mpi): the failing rank prints it and the job ends (MPI_Abort) — clients
// see their connections close.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "fanout/comm/control_plane.h"
#include "fanout/comm/local_ep.h"
#include "fanout/engine/engine.h"

namespace fanout::engine {

class DpRank : public RequestService {
  public:
    // `engine` must be configured with lockstep = true (checked) and its runner joined to the EP
    // group of the same world as `control`.
    DpRank(std::unique_ptr<Engine> engine, std::unique_ptr<comm::ControlPlane> control);
    ~DpRank() override;

    int rank() const { return control_->rank(); }
    int world() const { return control_->world(); }
    Engine& engine() { return *engine_; }

    // Steps in lockstep with the group until rank 0's stop() (then returns on every rank) or a
    // failure (then throws the group's error on every rank).
    void run();
    // Rank 0: the group stops after the step in progress; requests not finished end with "abort".
    void stop();
    // The group's failure as this rank saw it, or empty.
    std::string failure() const;

    // RequestService, rank 0 only.
    std::shared_ptr<RequestHandle> submit(RequestParams params) override;
    EngineStats stats() const override;
    std::vector<EngineStats> rank_stats() const override;
    int64_t max_context() const override { return engine_->max_context(); }
    int64_t vocab_size() const override { return engine_->vocab_size(); }
    // The union of the ranks' prefix caches (rank 0).
    KvEventHub* kv_events() override { return &union_events_; }
    int64_t kv_block_size() const override { return engine_->kv_block_size(); }
    // Per rank: unfinished requests handed to it (rank 0's view; for tests and /metrics).
    std::vector<int64_t> rank_loads() const;
    // Rank 0: the rank `prompt` would be placed on now, and how many of its blocks that rank holds.
    Placer::Choice place(const std::vector<int32_t>& prompt) const;

  private:
    struct Proxy;
    struct Pending;
    std::vector<uint8_t> next_step_message();
    void apply_step_message(const std::vector<uint8_t>& bytes, bool* stop);
    std::vector<uint8_t> report();
    void deliver(const std::vector<std::vector<uint8_t>>& reports);
    void fail_all(const std::string& reason, const std::string& finish_reason);
    std::vector<Placer::Target> targets_locked() const;  // every rank's load (mutex_ held)
    void apply_kv_change_locked(int r, bool reset, const std::vector<uint64_t>& stored,
                                const std::vector<uint64_t>& removed);

    std::unique_ptr<Engine> engine_;
    std::unique_ptr<comm::ControlPlane> control_;

    // Requests this rank runs: its engine's handle, by the group's request id.
    std::map<int64_t, std::shared_ptr<RequestHandle>> running_;

    // Rank 0's bookkeeping, under mutex_ (submit() runs on the server's threads).
    mutable std::mutex mutex_;
    std::condition_variable cv_;
    std::vector<Pending> pending_;                      // submitted, not yet handed to a rank
    std::map<int64_t, Proxy> proxies_;                  // handed out, not finished: the caller's handle and its rank
    std::vector<int64_t> load_requests_, load_tokens_;  // per rank: unfinished requests, tokens left
    std::vector<EngineStats> rank_stats_;
    std::vector<int64_t> last_step_tokens_;          // per rank: its last step's tokens (auto microbatch)
    Placer placer_;                                  // every rank's cached blocks and the policy
    std::unordered_map<uint64_t, int> union_count_;  // a cached block hash: on how many ranks
    KvEventHub union_events_;                        // its changes: 0 -> 1 ranks stored, 1 -> 0 removed
    uint64_t kv_seen_ = 0;                           // this rank: the last change of its cache reported
    int64_t next_id_ = 1;
    bool stopping_ = false;
    std::string failure_;
};

// A DP group of ranks as threads of this process (the CPU path's `--ep N --ranks threads`):
// the `local` EP fabric joins their models' experts, a local control plane their steps.
class DpThreadGroup {
  public:
    // engines[r] is rank r's (lockstep), its runner holding endpoints of `fabrics` (none when the
    // runners need no EP fabric: one rank, or test fakes — else one, and a second for the second
    // microbatch); the group keeps the fabrics and endpoints alive for the engines, and a failure
    // aborts the fabrics too.
    DpThreadGroup(std::vector<std::unique_ptr<Engine>> engines, std::vector<std::unique_ptr<comm::LocalFabric>> fabrics,
                  std::vector<std::unique_ptr<comm::ExpertParallel>> endpoints,
                  std::chrono::milliseconds timeout = std::chrono::minutes(10));
    ~DpThreadGroup();

    // Starts every rank's thread.
    void start();
    // Stops the group and joins its threads.
    void stop();
    // Rank 0, the front door.
    DpRank& lead() { return *ranks_[0]; }
    DpRank& rank(int r) { return *ranks_.at(static_cast<size_t>(r)); }
    int size() const { return static_cast<int>(ranks_.size()); }
    // The first failure of any rank, or empty.
    std::string failure() const;

  private:
    std::vector<std::unique_ptr<comm::LocalFabric>> fabrics_;
    std::vector<std::unique_ptr<comm::ExpertParallel>> endpoints_;
    std::unique_ptr<comm::LocalControlHub> hub_;
    std::vector<std::unique_ptr<DpRank>> ranks_;
    std::vector<std::thread> threads_;
};

// The CPU path's group: models[r] loaded with ParallelConfig{r, models.size(), tp} (its block of
// routed experts, at tp > 1 its share of the heads); DP rank d's engine runs on the TP group of
// models [d·tp, (d+1)·tp) (`config` with lockstep set; `opts` with each rank's EP endpoints;
// `threads` CPU threads and `kv_dtype` per rank), all joined by a `local` fabric sized for steps of
// config.scheduler.max_batched_tokens tokens per rank — and a second for the second microbatch
// unless config.microbatch is off.
std::unique_ptr<DpThreadGroup> make_cpu_dp_threads(std::vector<std::unique_ptr<model::DeepseekV3>> models,
                                                   EngineConfig config, const model::ForwardOptions& opts, int threads,
                                                   DType kv_dtype, const io::Tokenizer* tokenizer, int tp = 1);

}  // namespace fanout::engine

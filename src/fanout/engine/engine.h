// Engine: one model instance serving many requests with continuous batching.
//
// A step reads as one sentence: schedule → forward → sample → postprocess. The scheduler picks
// the work (chunked prefill mixed with decode under a token budget, prefix-cache reuse,
// preemption by recompute); the ModelRunner runs one batched forward; each sequence samples with
// its own parameters; postprocessing detokenizes incrementally, applies stop strings, EOS and
// max_tokens, and streams events to the request's handle. The step can be clocked from outside
// (step()), or by the engine's own thread (start()), which is how `fanout serve` runs it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "fanout/comm/control_plane.h"
#include "fanout/comm/tensor_parallel.h"
#include "fanout/engine/kv_events.h"
#include "fanout/engine/placement.h"
#include "fanout/engine/scheduler.h"
#include "fanout/io/tokenizer.h"
#include "fanout/kv/paged_kv_cache.h"
#include "fanout/model/deepseek_v3.h"
#include "fanout/ops/sampling.h"
#include "fanout/ops/sampling_cuda.h"

namespace fanout::engine {

// What runs a batched forward step: the real model, or a fake in tests.
class ModelRunner {
  public:
    virtual ~ModelRunner() = default;
    virtual int64_t vocab_size() const = 0;
    virtual int64_t max_context() const = 0;
    virtual std::vector<int64_t> eos_ids() const = 0;
    virtual kv::KvCacheConfig kv_cache_config(int64_t num_blocks) const = 0;
    // Logits [batch.logit_rows.size(), vocab] f32.
    virtual Tensor forward(const model::StepBatch& batch, kv::PagedKvCache& cache) = 0;
    // Runners that sample where the logits are (the GPU) say so and return one token per logit
    // row, sampled with `rows` (each request's parameters and its generator's next draw; a row's
    // bias_begin/bias_count index `logit_bias`, the step's biases of all rows), so the engine gets
    // the tokens its host samplers would have picked without copying the logits out.
    virtual bool samples_on_device() const { return false; }
    virtual std::vector<int32_t> forward_sample(const model::StepBatch& batch, kv::PagedKvCache& cache,
                                                std::span<const ops::SamplingRow> rows,
                                                std::span<const ops::LogitBias> logit_bias);

    // MTP speculative decoding (EngineConfig::mtp_draft_tokens; the engine calls it once): readies
    // the runner for checking steps of 1 + draft_tokens query rows per request, or says why it
    // cannot draft with the model's multi-token-prediction layer (empty: ready).
    virtual std::string enable_mtp(int draft_tokens);
    // A speculative step is forward() or forward_sample() of a batch with all_hidden set — the
    // runner keeps every row's final-normed hidden state (where it computed them: the host or the
    // device), and forward_sample's rows may check drafts (SamplingRow::draft) — then draft_mtp():
    // the MTP layer (DeepseekV3::forward_mtp) over `batch`, whose tokens are the tokens after the
    // positions, token i reading kept hidden state hidden_rows[i] — a row of the last all_hidden
    // forward, or (`chained`) a logit row of the last draft_mtp — returning the greedy draft of each
    // logit row and keeping their hidden states for a chained pass. An empty batch is a lockstep
    // rank's pass of the group.
    virtual std::vector<int32_t> draft_mtp(const model::StepBatch& batch, std::span<const int32_t> hidden_rows,
                                           bool chained, kv::PagedKvCache& cache);
    // The two-microbatch schedule (StepBatch::microbatch): empty when the runner can run it, else why not.
    virtual std::string microbatch_support() const { return "this model runner does not run two microbatches"; }
    // Requests of the last forward whose attention ran in MLA's MHA form (the GPU runner's prefill
    // chunks beside the decodes' absorbed form); 0 from runners that do not say.
    virtual int64_t mha_requests() const { return 0; }
};

// DeepseekV3 on the CPU path: one model, or the tp ranks of one DP group under tensor-parallel
// attention (deepseek_runner.cc).
class DeepseekRunner : public ModelRunner {
  public:
    DeepseekRunner(std::unique_ptr<model::DeepseekV3> model, model::ForwardOptions opts, int threads,
                   DType kv_dtype = DType::kF32);
    // A TP group: models[i] holds TP rank i's heads (loaded with tp = models.size()), opts[i] its EP
    // endpoints. The runner joins them with a TP group of threads; every step runs on all of them —
    // rank 0 on the calling thread with the engine's cache, the others on threads of their own, each
    // with a cache of the same geometry (the latent KV is every head's: each rank holds all of it).
    DeepseekRunner(std::vector<std::unique_ptr<model::DeepseekV3>> models, std::vector<model::ForwardOptions> opts,
                   int threads, DType kv_dtype = DType::kF32);
    // A TP group whose ranks past 0 are processes of their own (run_tp_follower there): `model`
    // holds TP rank 0's heads, `tp` is this rank's endpoint of the group's collectives
    // (comm::make_mpi_tp), `followers` the group's control plane, this rank its rank 0, which
    // carries every step to them; destroying the runner stops them.
    DeepseekRunner(std::unique_ptr<model::DeepseekV3> model, model::ForwardOptions opts, int threads, DType kv_dtype,
                   std::unique_ptr<comm::TensorParallel> tp, std::unique_ptr<comm::ControlPlane> followers);
    ~DeepseekRunner() override;
    int64_t vocab_size() const override { return lead().config().vocab_size; }
    int64_t max_context() const override { return lead().config().max_position_embeddings; }
    std::vector<int64_t> eos_ids() const override { return lead().config().eos_token_ids; }
    kv::KvCacheConfig kv_cache_config(int64_t num_blocks) const override;
    Tensor forward(const model::StepBatch& batch, kv::PagedKvCache& cache) override;
    // Checking steps run the absorbed attention form, as the decode steps they replace, so greedy
    // tokens are the plain ones (ForwardOptions::absorbed_max_query >= 1 + draft_tokens).
    std::string enable_mtp(int draft_tokens) override;
    std::vector<int32_t> draft_mtp(const model::StepBatch& batch, std::span<const int32_t> hidden_rows, bool chained,
                                   kv::PagedKvCache& cache) override;
    std::string microbatch_support() const override;
    int64_t mha_requests() const override { return last_mha_requests_; }
    // Called with the reason when a TP rank fails: whoever owns the exchanges the other ranks may
    // be waiting in (the EP fabrics) stops them, so no rank waits out a timeout.
    void on_failure(std::function<void(const std::string&)> abort) { abort_ = std::move(abort); }

  private:
    friend void run_tp_follower(std::unique_ptr<model::DeepseekV3>, model::ForwardOptions, int, DType,
                                std::unique_ptr<comm::TensorParallel>, comm::ControlPlane&);
    struct Member;
    struct Job;  // one step of the group, as every rank runs it (and as bytes between processes)
    struct Result {
        Tensor logits;                // kForward: the leader's logits
        std::vector<int32_t> drafts;  // kDraft: the leader's greedy drafts
    };
    static std::vector<uint8_t> encode(const Job& job);
    static Job parse(const std::vector<uint8_t>& bytes);
    // `job` on one rank with its cache; `lead`: TP rank 0, whose result is returned.
    static Result run_job(Member& m, const Job& job, kv::PagedKvCache& cache, bool lead);
    void fail(const std::string& reason);  // the group's failure: TP group and abort_ (mutex_ not held)
    const model::DeepseekV3& lead() const;
    // `job` on every member (rank 0 here with `cache`, the others on their threads with theirs, or
    // in their processes); the first failure aborts the TP group and is thrown here.
    Result run_all(Job job, kv::PagedKvCache& cache);
    void follow(size_t i);

    std::vector<std::unique_ptr<Member>> members_;
    int64_t last_mha_requests_ = 0;  // mha_requests() of the last forward
    std::unique_ptr<comm::LocalTpGroup> tp_;
    std::unique_ptr<comm::ControlPlane> remote_;  // TP ranks past 0 as processes: the channel to them
    DType kv_dtype_;
    std::mutex mutex_;
    std::condition_variable cv_;
    std::shared_ptr<const Job> job_;
    int64_t jobs_ = 0, done_ = 0;  // jobs handed to the followers, follower jobs finished
    std::string failure_;
    bool stopping_ = false;
    std::function<void(const std::string&)> abort_;
    std::vector<std::thread> followers_;
};

// A TP rank past 0 as a process of its own (`mpirun ... --tp T` on the CPU path): `model` holds
// this rank's heads, `tp` its endpoint of the group's collectives, `leader` the group's control
// plane (this rank past 0). Runs every step its TP rank 0's DeepseekRunner sends — forward passes
// and MTP drafting, each also this rank's part of every MoE exchange — until that runner stops;
// a failure aborts the group (the launcher's job) naming this rank, and is rethrown.
void run_tp_follower(std::unique_ptr<model::DeepseekV3> model, model::ForwardOptions opts, int threads, DType kv_dtype,
                     std::unique_ptr<comm::TensorParallel> tp, comm::ControlPlane& leader);

struct RequestParams {
    std::vector<int32_t> prompt;
    int64_t max_tokens = 16;
    ops::SamplingParams sampling;
    std::vector<std::string> stop;  // stop strings: output ends before the first match
    bool ignore_eos = false;
    bool skip_special_tokens = true;
};

// One increment of a request's output. The last event has finished = true.
struct RequestEvent {
    std::string text;             // new text (valid UTF-8)
    std::vector<int32_t> tokens;  // new token ids
    bool finished = false;
    std::string finish_reason;  // "stop", "length"; "abort" (cancelled), "error" (a step failed)
    int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
    int64_t draft_tokens = 0, accepted_draft_tokens = 0;  // MTP drafts checked for it so far, and accepted
};

// A request's events in order, and its cancellation: the consumer's end (next, on_event, cancel)
// and the producer's (push, on_cancel) — an engine, or a service relaying another's events (a DP
// group's rank 0, the router's remote engines).
class RequestHandle {
  public:
    explicit RequestHandle(int64_t id = 0) : id_(id) {}
    // Waits for the next event; false on timeout.
    bool next(RequestEvent* ev, std::chrono::milliseconds timeout);
    // `notify` is called (on the producer's thread, without locks held) after each new event, and at
    // once when events are already waiting, so a consumer need not block in next(); nullptr removes it.
    void on_event(std::function<void()> notify);
    void cancel();
    bool cancelled() const { return cancelled_; }
    int64_t id() const { return id_; }

    // The producer's side: appends an event (the last one has finished = true).
    void push(RequestEvent ev);
    // `fn` runs once when the consumer cancels (at once if it already has); producers that must
    // tell someone else (a remote engine) set it.
    void on_cancel(std::function<void()> fn);

  private:
    friend class Engine;
    friend class DpRank;
    int64_t id_ = 0;
    std::atomic<bool> cancelled_{false};
    std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<RequestEvent> events_;
    std::shared_ptr<std::function<void()>> notify_;
    std::function<void()> on_cancel_;
};

// What every engine checks of a request before taking it (Engine::submit, and front ends that
// forward requests elsewhere): the prompt within the context and the vocabulary, max_tokens,
// sampling parameters, logit_bias ids, stop strings (which need a tokenizer). Throws Error naming
// what is wrong.
void validate_request(const RequestParams& p, int64_t max_context, int64_t vocab_size, bool has_tokenizer);

struct EngineConfig {
    SchedulerConfig scheduler;
    int64_t num_kv_blocks = 256;
    // A rank of a data-parallel group (dp_group.h): every step() runs a forward — an empty one when
    // this rank has no work — because every MoE layer is a collective of all ranks.
    bool lockstep = false;
    // A DP group's rank 0 (dp_group.h): how it places requests on the group's ranks.
    PlacementConfig dp_placement;
    // MTP speculative decoding: draft tokens per decode step (0 = off), proposed by the model's MTP
    // layer (reused for drafts past the first) and verified in the next step.
    int mtp_draft_tokens = 0;
    // The two-microbatch schedule (StepBatch::microbatch): off, on for every step, or auto — on for
    // steps of at least microbatch_min_tokens tokens (a DP group: the largest rank's last step,
    // decided by rank 0 for every rank, since each step's exchanges are collectives). It pays only
    // where it hides communication, so auto's default threshold is never on the CPU path, whose
    // exchanges are memory copies with nothing to hide; the GPU runner under expert parallelism
    // measures both schedules at start-up (microbatch_min_tokens_from).
    enum class Microbatch { kOff, kOn, kAuto };
    Microbatch microbatch = Microbatch::kAuto;
    int64_t microbatch_min_tokens = std::numeric_limits<int64_t>::max();
};

// "off" | "on" | "auto" (the --microbatch flag); throws Error naming the choices.
EngineConfig::Microbatch parse_microbatch(const std::string& name);

// One step size timed both ways (the GPU runner's graph captures): as one batch and as two
// microbatches.
struct MicrobatchTiming {
    int64_t tokens = 0;
    double one_batch_us = 0, microbatch_us = 0;
};
// --microbatch auto's threshold from measured step times, the sizes being the graph buckets a step
// pads up to: one more than the largest size at which the two-microbatch schedule did not win, when
// it won at every larger size measured — so every step replays the faster bucket's schedule
// wherever the crossover is single — 1 when it won everywhere; never (int64 max) when it lost at
// the largest size, or nothing was measured. A win is a clear one: under kMicrobatchMargin of the
// one-batch time (replay timings carry a percent of noise). Sizes in any order; a timing that is
// not positive is an error naming it.
constexpr double kMicrobatchMargin = 0.98;
int64_t microbatch_min_tokens_from(std::vector<MicrobatchTiming> timings);

// Counters and latency histograms for /metrics.
struct EngineStats {
    int64_t requests_received = 0, requests_finished = 0, requests_aborted = 0, requests_failed = 0;
    int64_t prompt_tokens = 0, generation_tokens = 0, cached_prompt_tokens = 0, steps = 0, preemptions = 0;
    int64_t draft_tokens = 0, accepted_draft_tokens = 0;  // MTP speculative decoding
    // Wall time in the runner: its forward passes (with MTP: the checking steps) and the MTP
    // layer's drafting passes — the step time, split, whatever the runner.
    int64_t forward_microseconds = 0, draft_microseconds = 0;
    int64_t microbatch_steps = 0;  // steps run as two microbatches
    // Steps with attention in MLA's MHA form (ModelRunner::mha_requests), and their requests there.
    int64_t mha_steps = 0, mha_requests = 0;
    int64_t waiting = 0, running = 0;
    int64_t kv_blocks_total = 0, kv_blocks_used = 0, kv_blocks_cached = 0;
    static constexpr double kBuckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
    static constexpr int kNumBuckets = sizeof(kBuckets) / sizeof(double);
    struct Histogram {
        int64_t counts[kNumBuckets + 1] = {};  // the last bucket is +Inf
        double sum = 0;
        int64_t count = 0;
        void observe(double seconds);
    };
    Histogram ttft, itl, e2e;

    // Every counter and gauge above by name, for the code that sums or carries them all (a DP
    // group's rank 0, the router, the control plane's reports).
    using Counter = int64_t EngineStats::*;
    static constexpr std::pair<const char*, Counter> kCounters[] = {
        {"requests_received", &EngineStats::requests_received},
        {"requests_finished", &EngineStats::requests_finished},
        {"requests_aborted", &EngineStats::requests_aborted},
        {"requests_failed", &EngineStats::requests_failed},
        {"prompt_tokens", &EngineStats::prompt_tokens},
        {"generation_tokens", &EngineStats::generation_tokens},
        {"cached_prompt_tokens", &EngineStats::cached_prompt_tokens},
        {"steps", &EngineStats::steps},
        {"preemptions", &EngineStats::preemptions},
        {"draft_tokens", &EngineStats::draft_tokens},
        {"accepted_draft_tokens", &EngineStats::accepted_draft_tokens},
        {"forward_microseconds", &EngineStats::forward_microseconds},
        {"draft_microseconds", &EngineStats::draft_microseconds},
        {"microbatch_steps", &EngineStats::microbatch_steps},
        {"mha_steps", &EngineStats::mha_steps},
        {"mha_requests", &EngineStats::mha_requests},
        {"waiting", &EngineStats::waiting},
        {"running", &EngineStats::running},
        {"kv_blocks_total", &EngineStats::kv_blocks_total},
        {"kv_blocks_used", &EngineStats::kv_blocks_used},
        {"kv_blocks_cached", &EngineStats::kv_blocks_cached},
    };
    // Adds `o`'s counters, gauges and histograms to these (the sum over ranks or engines).
    void add(const EngineStats& o);
};

// Thrown by RequestService::submit() when the service cannot take a valid request now: `status`
// 429 (every place to run it is full: retry later) or 503 (nowhere to run it: no healthy engine,
// a stopped deployment). Other Errors from submit() are the request's fault (400).
class ServiceUnavailable : public Error {
  public:
    ServiceUnavailable(int status, const std::string& what) : Error(what), status_(status) {}
    int status() const { return status_; }

  private:
    int status_;
};

// What the API front end (serve/openai_server.h) talks to: one engine, or rank 0 of a
// data-parallel group handing requests to its ranks (dp_group.h).
class RequestService {
  public:
    virtual ~RequestService() = default;
    // Validates and queues a request; throws Error naming what is wrong (prompt too long, ...).
    virtual std::shared_ptr<RequestHandle> submit(RequestParams params) = 0;
    virtual EngineStats stats() const = 0;
    // Each data-parallel rank's counters (their sum is stats()); empty for one engine.
    virtual std::vector<EngineStats> rank_stats() const { return {}; }
    virtual int64_t max_context() const = 0;
    virtual int64_t vocab_size() const = 0;
    // The prefix cache's changes by block hash, for a router's index (kv_events.h); nullptr where
    // one cache does not stand for the service (a DP group: each rank has its own).
    virtual KvEventHub* kv_events() { return nullptr; }
    // Tokens per KV block: what the hashes of kv_events() cover.
    virtual int64_t kv_block_size() const { return kv::kDefaultBlockSize; }
};

class Engine : public RequestService {
  public:
    static constexpr int kMaxDraftTokens = 7;
    // `tokenizer` may be null (then outputs carry ids only and stop strings are not allowed).
    Engine(std::unique_ptr<ModelRunner> runner, const io::Tokenizer* tokenizer, const EngineConfig& config);
    ~Engine() override;

    std::shared_ptr<RequestHandle> submit(RequestParams params) override;
    // Throws Error naming what is wrong with `p` for this engine (what submit() checks).
    void validate(const RequestParams& p) const;
    // One step; false when there was nothing to do (a lockstep engine still ran an empty forward).
    bool step();
    // Runs steps on a thread of its own until stop().
    void start();
    void stop();

    EngineStats stats() const override;
    const EngineConfig& config() const { return config_; }
    int64_t max_context() const override { return max_context_; }
    int64_t vocab_size() const override { return runner_->vocab_size(); }
    KvEventHub* kv_events() override { return &kv_events_; }
    int64_t kv_block_size() const override { return cache_.config().block_size; }
    // A lockstep rank under Microbatch::kAuto: whether the group runs its next step as two
    // microbatches (its DP rank 0 decides for every rank).
    void set_group_microbatch(bool on) { group_microbatch_ = on; }
    // Tokens of the last step's batch (0 for an empty step): what auto's group decision reads.
    int64_t last_step_tokens() const { return last_step_tokens_; }

  private:
    struct Active;
    void admit_incoming();
    void reap_cancelled();
    void publish_gauges();
    void postprocess(Active& a, int32_t token);
    void step_speculative(std::vector<ScheduledSeq>& work, const model::StepBatch& batch);
    // Adds the microseconds since t0 to a timing counter of stats_.
    void add_time(int64_t EngineStats::*counter, std::chrono::steady_clock::time_point t0);
    // After a forward started at t0: its time into forward_microseconds and the runner's MHA-form
    // requests into mha_steps / mha_requests, under one lock.
    void forward_done(std::chrono::steady_clock::time_point t0);
    void finish(Active& a, const std::string& reason, std::vector<int32_t> tokens = {});
    // Ends one request with "error" after its own failure (its logits could not be sampled: the
    // model gave NaN or +inf), logging why; the step's other requests go on.
    void fail(Active& a, const std::string& why);
    void emit(Active& a, std::string text, std::vector<int32_t> tokens, bool finished, const std::string& reason);

    std::unique_ptr<ModelRunner> runner_;
    const io::Tokenizer* tokenizer_;
    EngineConfig config_;
    kv::PagedKvCache cache_;
    KvEventHub kv_events_;  // before prefix_, which publishes to it
    kv::PrefixCache prefix_;
    int64_t max_context_;  // before scheduler_, which is given it
    Scheduler scheduler_;
    std::vector<int64_t> eos_;
    bool group_microbatch_ = false;
    int64_t last_step_tokens_ = 0;

    std::unordered_map<int64_t, std::unique_ptr<Active>> active_;
    std::mutex incoming_mutex_;
    std::condition_variable incoming_cv_;
    std::vector<std::unique_ptr<Active>> incoming_;
    int64_t next_id_ = 1;

    mutable std::mutex stats_mutex_;
    EngineStats stats_;
    std::thread thread_;
    std::atomic<bool> stopping_{false};
};

}  // namespace fanout::engine

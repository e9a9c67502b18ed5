// The router: one OpenAI front end (serve/openai_server.h, unchanged) in front of many engine
// instances reached over gRPC (rpc/engine_service.h). It is a RequestService: submit() picks an
// engine and relays the request there.
//
// Placement (RouterConfig::placement, engine/placement.h — the same choice a DP group's rank 0
// makes among its ranks): the prefix policy reads an exact index of every engine's cached KV
// blocks, by chain hash, built from the engines' KV event streams (as NVIDIA Dynamo's KV router
// does, not an approximate tree of routed text) — plus the prompt blocks of requests just sent,
// pending until those events confirm them (PlacementConfig::pending_ttl) — weighed against the
// engines' requests in flight; least-load and round-robin for comparison.
// Health: every engine is checked every health_interval (Health and Load RPCs, each bounded by
// health_timeout); one that fails — or whose call breaks — is out of rotation at once (its index
// dropped) and rejoins when it answers again, its KV index rebuilt from a fresh event stream. A
// request whose engine fails before sending anything is placed again on another engine (the
// client sees nothing of it); one already streaming ends with finish reason "unavailable" (503 in
// the OpenAI error shape) as soon as gRPC sees the connection go (keepalive 1 s). Back-pressure: an engine with
// max_in_flight requests takes no more; when every healthy engine is full submit() throws ServiceUnavailable(429), when
// none is healthy ServiceUnavailable(503).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "fanout/engine/engine.h"
#include "fanout/engine/placement.h"
#include "fanout/rpc/engine_service.h"

namespace fanout::router {

struct RouterConfig {
    engine::PlacementConfig placement;
    int64_t max_in_flight = 256;  // per engine
    std::chrono::milliseconds health_interval{250}, health_timeout{500};
};

class Router : public engine::RequestService {
  public:
    // `addresses`: the engines' "host:port". Nothing is contacted until start().
    Router(std::vector<std::string> addresses, RouterConfig config);
    ~Router() override;

    // Checks every engine once (waiting up to `wait` for at least one to be healthy; they must
    // all serve the same model) and starts the health loop and the KV event watchers.
    void start(std::chrono::milliseconds wait = std::chrono::seconds(30));
    // Takes no new requests (503 "shutting down") and waits up to `grace` for those in flight to
    // finish; false when some were still running at the end.
    bool drain(std::chrono::milliseconds grace);
    void stop();

    // RequestService
    std::shared_ptr<engine::RequestHandle> submit(engine::RequestParams params) override;
    engine::EngineStats stats() const override;
    std::vector<engine::EngineStats> rank_stats() const override;  // per engine, in --engine order
    // The smallest context of the healthy engines: a request within it fits wherever it lands.
    int64_t max_context() const override;
    int64_t vocab_size() const override;

    // Where `prompt` would go now (no request is sent; round-robin's turn does not move).
    engine::Placer::Choice place(const std::vector<int32_t>& prompt) const;
    int num_engines() const { return static_cast<int>(engines_.size()); }
    bool healthy(int e) const;
    // Blocks the index holds for engine e.
    int64_t indexed_blocks(int e) const;
    const std::string& model() const { return model_; }

  private:
    struct Slot;
    struct Relay;
    // The engine for `hashes` now, not one of `exclude` (-1: none can take it).
    int pick(const std::vector<uint64_t>& hashes, const std::vector<int>& exclude);
    // Takes engine e out of rotation now (a call to it broke); the health loop brings it back.
    void mark_down(int e, const std::string& why);
    void check(Slot& s);
    void health_loop();
    int index_of(const Slot& s) const;
    int64_t max_context_locked() const;  // mutex_ held
    // Every engine's load for the placer; those in `exclude` are not eligible (mutex_ held).
    std::vector<engine::Placer::Target> targets_locked(const std::vector<int>& exclude) const;

    RouterConfig config_;
    std::vector<std::unique_ptr<Slot>> engines_;
    mutable std::mutex mutex_;  // health, indexes, counters
    std::condition_variable cv_;
    std::string model_;
    rpc::EngineInfo info_;
    engine::Placer placer_;  // the engines' KV indexes and the policy
    std::atomic<int64_t> next_id_{1};
    std::atomic<bool> stopping_{false}, draining_{false};
    std::thread health_;
};

}  // namespace fanout::router

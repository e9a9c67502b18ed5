// The engine's gRPC service (proto/fanout/engine.proto) over any RequestService — one engine, or
// rank 0 of a data-parallel group — and the client that makes a remote one a RequestService
// again (RemoteEngine), so the router's front end is the same OpenAI server as `fanout serve`.
//
// Server: gRPC's callback API, no thread per stream. A Generate call submits the request and
// writes its events as the engine produces them (the handle's notification starts each write);
// a client that goes away cancels the request. Invalid requests end with INVALID_ARGUMENT naming
// what is wrong; a stopped deployment with UNAVAILABLE. KvEvents streams the engine's prefix-cache
// changes (engine/kv_events.h) — a thread per subscription, which a router holds one of.
//
// Client: one channel per engine; Generate streams through a callback reactor into a
// RequestHandle; cancelling the handle cancels the call. A call that ends without its last event
// (the engine died, the network failed) ends the request with finish reason "unavailable".
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "fanout/engine/engine.h"

namespace fanout::rpc {

class EngineServer {
  public:
    // Serves `engine` (which must outlive the server) as `model_name` on `address` ("host:port",
    // port 0: any free one).
    EngineServer(engine::RequestService& engine, std::string model_name, const std::string& address);
    ~EngineServer();
    EngineServer(const EngineServer&) = delete;
    EngineServer& operator=(const EngineServer&) = delete;
    int port() const { return port_; }
    // Stops taking calls, lets those in flight finish for up to `grace`, then cancels the rest
    // (their requests end) and stops serving.
    void shutdown(std::chrono::milliseconds grace = std::chrono::seconds(2));

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    int port_ = 0;
};

// What an engine says of itself (Health).
struct EngineInfo {
    std::string model;
    int64_t max_context = 0, vocab_size = 0, kv_block_size = 0;
};

// A remote engine as a RequestService. submit() validates with the limits Health reported, then
// streams; stats() is the last load report (see load()).
class RemoteEngine : public engine::RequestService {
  public:
    explicit RemoteEngine(const std::string& address);
    ~RemoteEngine() override;
    const std::string& address() const { return address_; }

    // Health within `timeout`; throws Error naming the address when it does not answer.
    EngineInfo health(std::chrono::milliseconds timeout);
    // The engine's counters and gauges now (LoadReport carries EngineStats::kCounters by name).
    engine::EngineStats load(std::chrono::milliseconds timeout);
    // Asks the engine to end `request_id`; true when it was running there.
    bool abort(const std::string& request_id, std::chrono::milliseconds timeout);

    // Streams the engine's KV events to `on_change(reset, stored, removed)` on a thread of its
    // own until stop_kv_events() or the stream fails (then `on_end(error)`).
    void watch_kv_events(
        std::function<void(bool reset, const std::vector<uint64_t>& stored, const std::vector<uint64_t>& removed)>
            on_change,
        std::function<void(const std::string& error)> on_end);
    void stop_kv_events();

    // RequestService. Before submit(), set_info() (the router does from health()).
    // The health checker sets it while requests are submitted on other threads.
    void set_info(const EngineInfo& info) {
        std::lock_guard lock(info_mutex_);
        info_ = info;
    }
    EngineInfo info() const {
        std::lock_guard lock(info_mutex_);
        return info_;
    }
    std::shared_ptr<engine::RequestHandle> submit(engine::RequestParams params) override;
    engine::EngineStats stats() const override;
    int64_t max_context() const override { return info().max_context; }
    int64_t vocab_size() const override { return info().vocab_size; }
    int64_t kv_block_size() const override { return info().kv_block_size; }
    // Requests in flight through this client: from submit() until their last event is handed to
    // the caller (the call's own end, its status, may come a little later).
    int64_t in_flight() const;
    // Cancels every call still running and any started from now on (each ends "abort"), and waits
    // for them to end: up to `wait` (false when some did not), or without a limit (the destructor
    // does that). A cancelled call ends on this side at once, without its peer, and none may
    // outlive its client: its ClientContext holds the channel, whose last release on a gRPC
    // callback thread frees the queue that thread polls.
    bool close(std::optional<std::chrono::milliseconds> wait = std::nullopt);
    // close()'s first half: every call cancelled, none waited for (a router cancels every engine's
    // calls before it waits for any).
    void cancel_calls();

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    std::string address_;
    std::string id_prefix_;  // of the request ids this client sends: its address and a nonce
    mutable std::mutex info_mutex_;
    EngineInfo info_;
    std::atomic<int64_t> next_id_{1};
};

}  // namespace fanout::rpc

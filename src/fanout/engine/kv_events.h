// An engine's prefix-cache changes for subscribers on other threads (the gRPC service's KvEvents
// stream, which the router's index reads): a mirror of the cached block hashes (kv::block_hash
// chains) and a bounded log of changes, numbered. The engine publishes on its own thread; a
// subscriber starts from 0 (a reset: every cached hash) and then asks for what came after the
// last number it saw — one too far behind the log gets a reset again.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <unordered_set>
#include <vector>

namespace fanout::engine {

class KvEventHub {
  public:
    explicit KvEventHub(size_t max_log = 1 << 16) : max_log_(max_log) {}

    void publish(const std::vector<uint64_t>& stored, const std::vector<uint64_t>& removed);

    struct Change {
        bool reset = false;  // `stored` is the whole cached set; forget what you had
        std::vector<uint64_t> stored, removed;
    };
    struct Batch {
        std::vector<Change> changes;  // in order
        uint64_t last = 0;            // the number to ask after next time
    };
    // The changes after number `after` (0: a reset), waiting up to `timeout` for one; empty on
    // timeout or close().
    Batch next(uint64_t after, std::chrono::milliseconds timeout);
    // Wakes every waiter, for good (the engine is going away).
    void close();

  private:
    struct Entry {
        uint64_t seq;
        std::vector<uint64_t> stored, removed;
    };
    const size_t max_log_;
    std::mutex mutex_;
    std::condition_variable cv_;
    std::unordered_set<uint64_t> cached_;
    std::deque<Entry> log_;
    uint64_t seq_ = 1;  // the state's number: 1 before any change (0 asks for a reset)
    bool closed_ = false;
};

}  // namespace fanout::engine

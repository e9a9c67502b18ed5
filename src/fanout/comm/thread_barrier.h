// A barrier of `n` threads that never hangs: a rank that fails calls abort(), and every rank
// waiting (or arriving later) throws fanout::Error with that reason; a wait longer than the timeout
// throws naming the ranks that did not arrive. The `local` EP fabric and the threads' TP group
// synchronize their halves with it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace fanout::comm {

class ThreadBarrier {
  public:
    // `what` prefixes every error ("EP local", "TP local").
    ThreadBarrier(int n, std::chrono::milliseconds timeout, std::string what);
    // Waits until all n ranks arrived (a generation-counting barrier), or throws on abort or timeout;
    // `phase` names the wait in the timeout's error.
    void arrive_and_wait(int rank, const char* phase);
    // From now on every wait throws fanout::Error(what + ": " + reason) (the first reason sticks).
    void abort(const std::string& reason);
    int size() const { return n_; }

  private:
    const int n_;
    const std::chrono::milliseconds timeout_;
    const std::string what_;
    std::mutex mutex_;
    std::condition_variable cv_;
    int arrived_ = 0;
    int64_t generation_ = 0;
    std::vector<int64_t> rank_generation_;  // the generation each rank last arrived at
    std::string abort_reason_;
};

}  // namespace fanout::comm

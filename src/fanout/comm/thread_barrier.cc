#include "fanout/comm/thread_barrier.h"

#include "fanout/core/error.h"

namespace fanout::comm {

ThreadBarrier::ThreadBarrier(int n, std::chrono::milliseconds timeout, std::string what)
    : n_(n), timeout_(timeout), what_(std::move(what)), rank_generation_(static_cast<size_t>(std::max(n, 0)), -1) {}

void ThreadBarrier::abort(const std::string& reason) {
    std::lock_guard lock(mutex_);
    if (abort_reason_.empty()) abort_reason_ = reason;
    cv_.notify_all();
}

void ThreadBarrier::arrive_and_wait(int rank, const char* phase) {
    std::unique_lock lock(mutex_);
    FANOUT_CHECK(abort_reason_.empty(), "{}: {}", what_, abort_reason_);
    const int64_t gen = generation_;
    rank_generation_[static_cast<size_t>(rank)] = gen;
    if (++arrived_ == n_) {
        arrived_ = 0;
        ++generation_;
        cv_.notify_all();
        return;
    }
    const bool done = cv_.wait_for(lock, timeout_, [&] { return generation_ != gen || !abort_reason_.empty(); });
    FANOUT_CHECK(generation_ != gen || abort_reason_.empty(), "{}: {}", what_, abort_reason_);
    if (!done) {
        std::string missing;
        for (int r = 0; r < n_; ++r)
            if (rank_generation_[static_cast<size_t>(r)] != gen)
                missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        abort_reason_ =
            fmt::format("rank {} waited {} ms at {} for rank(s) {}", rank, timeout_.count(), phase, missing);
        cv_.notify_all();
        FANOUT_FAIL("{}: {}", what_, abort_reason_);
    }
}

}  // namespace fanout::comm

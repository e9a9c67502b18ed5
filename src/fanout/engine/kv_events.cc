#include "fanout/engine/kv_events.h"

namespace fanout::engine {

void KvEventHub::publish(const std::vector<uint64_t>& stored, const std::vector<uint64_t>& removed) {
    {
        std::lock_guard lock(mutex_);
        for (uint64_t h : stored) cached_.insert(h);
        for (uint64_t h : removed) cached_.erase(h);
        log_.push_back({++seq_, stored, removed});
        while (log_.size() > max_log_) log_.pop_front();
    }
    cv_.notify_all();
}

KvEventHub::Batch KvEventHub::next(uint64_t after, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    Batch b;
    // Entries after `after` already trimmed from the log (asked again after the wait: a burst of
    // publishes while it waits can trim them too).
    const auto behind = [&] { return after > 0 && (log_.empty() ? after < seq_ : after + 1 < log_.front().seq); };
    const auto reset = [&] {  // start (again) from the whole set
        Change c;
        c.reset = true;
        c.stored.assign(cached_.begin(), cached_.end());
        b.changes.push_back(std::move(c));
        b.last = seq_;
        return b;
    };
    if (after == 0 || behind() || after > seq_) return reset();
    cv_.wait_for(lock, timeout, [&] { return closed_ || seq_ > after; });
    if (behind()) return reset();
    b.last = after;
    for (const Entry& e : log_)
        if (e.seq > after) {
            b.changes.push_back({false, e.stored, e.removed});
            b.last = e.seq;
        }
    return b;
}

void KvEventHub::close() {
    {
        std::lock_guard lock(mutex_);
        closed_ = true;
    }
    cv_.notify_all();
}

}  // namespace fanout::engine

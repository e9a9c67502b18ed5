#include "fanout/router/router.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <iterator>
#include <mutex>

#include "fanout/kv/prefix_cache.h"

namespace fanout::router {

struct Router::Slot {
    std::unique_ptr<rpc::RemoteEngine> remote;
    bool healthy = false;
    bool watching = false;     // a KV event stream is open
    int64_t watch_gen = 0;     // the current stream's number: an older stream's callbacks do nothing
    engine::EngineStats last;  // its last load report
    std::string last_error;
    int64_t max_context = 0;  // from its last health report (0: never healthy)
};

namespace {
int count_engines(const std::vector<std::string>& addresses) {
    FANOUT_CHECK(!addresses.empty(), "router: no engines (--engine HOST:PORT)");
    return static_cast<int>(addresses.size());
}
}  // namespace

Router::Router(std::vector<std::string> addresses, RouterConfig config)
    : config_(std::move(config)), placer_(config_.placement, count_engines(addresses)) {
    FANOUT_CHECK(config_.max_in_flight >= 1, "router: max_in_flight must be >= 1, got {}", config_.max_in_flight);
    for (const auto& a : addresses) {
        auto s = std::make_unique<Slot>();
        s->remote = std::make_unique<rpc::RemoteEngine>(a);
        engines_.push_back(std::move(s));
    }
}

Router::~Router() {
    stop();
    // Calls still running (a drain that timed out, or none) end "abort" while the router their
    // relays report to is still whole: every engine's cancelled first, then a wait for them all,
    // without a limit (a cancelled call ends at once on this side; one left running would reach
    // this router after it is gone).
    for (auto& s : engines_) s->remote->cancel_calls();
    for (auto& s : engines_) s->remote->close();
}

// One engine's health: Health + Load within the timeout. A change of state is logged; an engine
// that comes (back) gets its KV index rebuilt from a fresh event stream.
void Router::check(Slot& s) {
    std::string error;
    rpc::EngineInfo info;
    try {
        info = s.remote->health(config_.health_timeout);
        s.remote->load(config_.health_timeout);  // kept as the engine's stats()
    } catch (const std::exception& e) {
        error = e.what();
    }
    bool start_watch = false;
    int64_t watch_gen = 0;
    {
        std::lock_guard lock(mutex_);
        // One model, one vocabulary and one KV block size (prefix hashes are per block) across the
        // engines; contexts may differ (each engine's cache is what its GPU memory left), and the
        // router takes requests up to the smallest (max_context()).
        if (error.empty() && !model_.empty()) {
            if (info.model != model_)
                error = fmt::format("serves model '{}', the others '{}'", info.model, model_);
            else if (info.vocab_size != info_.vocab_size)
                error = fmt::format("has a vocabulary of {}, the others {}", info.vocab_size, info_.vocab_size);
            else if (info.kv_block_size != info_.kv_block_size)
                error =
                    fmt::format("has KV blocks of {} tokens, the others {}", info.kv_block_size, info_.kv_block_size);
        }
        if (error.empty()) {
            if (model_.empty()) {
                model_ = info.model;
                info_ = info;
            }
            s.remote->set_info(info);
            s.max_context = info.max_context;
            s.last = s.remote->stats();
            if (!s.healthy)
                std::fprintf(stderr, "router: engine %s is healthy (model '%s')\n", s.remote->address().c_str(),
                             info.model.c_str());
            s.healthy = true;
            start_watch = !s.watching && config_.placement.policy == "prefix";
            if (start_watch) {
                s.watching = true;
                watch_gen = ++s.watch_gen;
            }
        } else {
            if (s.healthy || s.last_error.empty())
                std::fprintf(stderr, "router: engine %s is out of rotation: %s\n", s.remote->address().c_str(),
                             error.c_str());
            s.healthy = false;
            placer_.forget(index_of(s));
        }
        s.last_error = error;
    }
    if (!error.empty() && s.watching) {
        s.remote->stop_kv_events();
        std::lock_guard lock(mutex_);
        s.watching = false;
    }
    if (start_watch) {
        Slot* slot = &s;
        const int e = index_of(s);
        s.remote->watch_kv_events(
            [this, slot, e, watch_gen](bool reset, const std::vector<uint64_t>& stored,
                                       const std::vector<uint64_t>& removed) {
                std::lock_guard lock(mutex_);
                if (slot->watch_gen == watch_gen) placer_.update(e, reset, stored, removed);
            },
            [this, slot, e, watch_gen](const std::string&) {
                std::lock_guard lock(mutex_);
                if (slot->watch_gen != watch_gen) return;  // replaced: the newer stream keeps the index
                placer_.forget(e);                         // rebuilt when the next health check opens a new stream
                slot->watching = false;
            });
    }
}

void Router::start(std::chrono::milliseconds wait) {
    const auto deadline = std::chrono::steady_clock::now() + wait;
    for (;;) {
        for (auto& s : engines_) check(*s);
        {
            std::lock_guard lock(mutex_);
            if (std::any_of(engines_.begin(), engines_.end(), [](const auto& s) { return s->healthy; })) break;
        }
        if (std::chrono::steady_clock::now() >= deadline) {
            std::string why;
            for (const auto& s : engines_) why += fmt::format("\n  {}: {}", s->remote->address(), s->last_error);
            FANOUT_FAIL("router: no engine answered within {} ms:{}", wait.count(), why);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    health_ = std::thread([this] { health_loop(); });
}

void Router::health_loop() {
    while (!stopping_) {
        for (auto& s : engines_) {
            if (stopping_) return;
            check(*s);
        }
        std::unique_lock lock(mutex_);
        cv_.wait_for(lock, config_.health_interval, [&] { return stopping_.load(); });
    }
}

bool Router::drain(std::chrono::milliseconds grace) {
    draining_ = true;
    const auto deadline = std::chrono::steady_clock::now() + grace;
    for (;;) {
        int64_t in_flight = 0;
        for (const auto& s : engines_) in_flight += s->remote->in_flight();
        if (in_flight == 0) return true;
        if (std::chrono::steady_clock::now() >= deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

void Router::stop() {
    stopping_ = true;
    cv_.notify_all();
    if (health_.joinable()) health_.join();
    for (auto& s : engines_) s->remote->stop_kv_events();
}

std::vector<engine::Placer::Target> Router::targets_locked(const std::vector<int>& exclude) const {
    std::vector<engine::Placer::Target> t(engines_.size());
    for (size_t e = 0; e < engines_.size(); ++e) {
        const Slot& s = *engines_[e];
        t[e].requests = s.remote->in_flight();
        t[e].eligible = s.healthy && t[e].requests < config_.max_in_flight &&
                        std::find(exclude.begin(), exclude.end(), static_cast<int>(e)) == exclude.end();
    }
    return t;
}

engine::Placer::Choice Router::place(const std::vector<int32_t>& prompt) const {
    const auto hashes = kv::block_hashes(prompt, info_.kv_block_size > 0 ? info_.kv_block_size : kv::kDefaultBlockSize);
    std::lock_guard lock(mutex_);
    return placer_.preview(hashes, targets_locked({}));
}

int Router::pick(const std::vector<uint64_t>& hashes, const std::vector<int>& exclude) {
    std::lock_guard lock(mutex_);
    return placer_.choose(hashes, targets_locked(exclude)).target;
}

void Router::mark_down(int e, const std::string& why) {
    std::lock_guard lock(mutex_);
    Slot& s = *engines_[static_cast<size_t>(e)];
    if (!s.healthy) return;
    std::fprintf(stderr, "router: engine %s is out of rotation: %s\n", s.remote->address().c_str(), why.c_str());
    s.healthy = false;
    placer_.forget(e);
    // The forgotten index comes back from a fresh event stream (a reset first) when the engine
    // passes its next health check; the old stream, if still open, is replaced then and its
    // events are ignored from now on.
    s.watching = false;
    ++s.watch_gen;
    s.last_error = why;
}

// A request on its way through the router: the caller's handle, fed from the engine's; placed
// again elsewhere when its engine fails before sending anything.
struct Router::Relay : std::enable_shared_from_this<Relay> {
    Router& router;
    engine::RequestParams params;
    std::vector<uint64_t> hashes;
    std::shared_ptr<engine::RequestHandle> caller;
    // Guards everything below. Nothing under it calls into the caller's handle or the current
    // attempt's in a way that can come back here: events reach the caller outside it (`outbox`),
    // and cancel() cancels the attempt outside it.
    std::mutex mutex;
    std::shared_ptr<engine::RequestHandle> remote;  // the current attempt's
    std::vector<int> tried;
    int engine = -1;
    int64_t forwarded = 0;
    // Events taken from the attempt, in order, not yet pushed to the caller. One thread at a time
    // pushes them (`pushing`), without the mutex: the caller's push may end the caller on this
    // thread (an HTTP connection whose last reference the event's notification held cancels its
    // source, and so this relay), and a second pump() meanwhile only adds to the outbox, which the
    // pushing thread then takes too, so the caller gets them in the engine's order.
    std::deque<engine::RequestEvent> outbox;
    bool pushing = false;

    Relay(Router& r, engine::RequestParams p, std::vector<uint64_t> h, std::shared_ptr<engine::RequestHandle> c)
        : router(r), params(std::move(p)), hashes(std::move(h)), caller(std::move(c)) {}

    // Sends the request to engine e (mutex held). The caller then calls watch(), without the
    // mutex: on_event runs its callback at once when events already wait, and that callback
    // (pump) takes the mutex — installed under it, an event arriving between the submit and
    // on_event deadlocked the relay's thread on its own mutex (a CI run under load, 2026-12-03).
    void send_locked(int e) {
        engine = e;
        tried.push_back(e);
        remote = router.engines_[static_cast<size_t>(e)]->remote->submit(params);
    }
    // Has the current attempt's events drive pump() (mutex not held). The attempt's handle owns the
    // relay through that notification until its last event (take_locked lets go of it then), so
    // a caller that cancels still gets its request's end ("abort"): owned by the caller's cancel
    // hook instead, the relay went with the cancel and the end it was to pass on was dropped.
    void watch() {
        std::shared_ptr<engine::RequestHandle> r;
        {
            std::lock_guard lock(mutex);
            r = remote;
        }
        if (!r) return;
        r->on_event([self = shared_from_this()] { self->pump(); });
    }
    void pump() {
        bool placed_again = false;
        {
            std::unique_lock lock(mutex);
            take_locked(placed_again);
            if (!pushing) {
                pushing = true;
                std::deque<engine::RequestEvent> batch;
                try {
                    while (!outbox.empty()) {
                        batch.swap(outbox);
                        lock.unlock();
                        for (; !batch.empty(); batch.pop_front()) caller->push(std::move(batch.front()));
                        lock.lock();
                    }
                } catch (...) {
                    // The caller's notification threw, its event already queued: the events after
                    // it go back to the front of the outbox, for the next pump.
                    if (!lock.owns_lock()) lock.lock();
                    if (!batch.empty()) batch.pop_front();
                    outbox.insert(outbox.begin(), std::make_move_iterator(batch.begin()),
                                  std::make_move_iterator(batch.end()));
                    pushing = false;
                    throw;
                }
                pushing = false;
            }
        }
        if (placed_again) watch();
    }
    // Moves the attempt's waiting events to the outbox; when the attempt broke before anything
    // reached the caller, sends the request to another engine instead (placed_again: its events
    // are then watched once the mutex is free).
    void take_locked(bool& placed_again) {
        engine::RequestEvent ev;
        while (remote && remote->next(&ev, std::chrono::milliseconds(0))) {
            if (ev.finished && ev.finish_reason == "unavailable") {
                router.mark_down(engine, "a call to it broke");
                if (forwarded == 0 && !caller->cancelled() && !router.stopping_) {
                    const int next = router.pick(hashes, tried);
                    if (next >= 0) {
                        remote->on_event(nullptr);
                        try {
                            send_locked(next);  // nothing was sent to the caller: place it again
                            placed_again = true;
                            return;
                        } catch (const std::exception& e) {
                            // The next engine refused it (its limits changed since the router
                            // checked): the caller gets this attempt's "unavailable" as its end.
                            std::fprintf(stderr, "router: request %lld not placed again: %s\n",
                                         static_cast<long long>(caller->id()), e.what());
                        }
                    }
                }
            }
            ++forwarded;
            const bool last = ev.finished;
            outbox.push_back(std::move(ev));
            if (last) {  // a cancel from now on finds no attempt
                remote->on_event(nullptr);
                remote.reset();
            }
        }
    }
    void cancel() {
        std::shared_ptr<engine::RequestHandle> r;
        {
            std::lock_guard lock(mutex);
            r = remote;
        }
        if (r) r->cancel();
    }
};

std::shared_ptr<engine::RequestHandle> Router::submit(engine::RequestParams params) {
    std::vector<uint64_t> hashes;
    {
        std::lock_guard lock(mutex_);
        FANOUT_CHECK(!model_.empty(), "router: not started");
        if (draining_) throw engine::ServiceUnavailable(503, "the router is shutting down; retry on another");
        engine::validate_request(params, max_context_locked(), info_.vocab_size, true);
        const bool any = std::any_of(engines_.begin(), engines_.end(), [](const auto& s) { return s->healthy; });
        if (!any) throw engine::ServiceUnavailable(503, "no engine is healthy; retry later");
        hashes = kv::block_hashes(params.prompt, info_.kv_block_size);
    }
    const int e = pick(hashes, {});
    if (e < 0)
        throw engine::ServiceUnavailable(
            429, fmt::format("every engine has {} requests in flight; retry later", config_.max_in_flight));
    auto caller = std::make_shared<engine::RequestHandle>(next_id_++);
    auto relay = std::make_shared<Relay>(*this, std::move(params), std::move(hashes), caller);
    // The caller's cancel reaches the relay while it lives (its attempt's handle owns it: watch()).
    caller->on_cancel([w = std::weak_ptr<Relay>(relay)] {
        if (auto r = w.lock()) r->cancel();
    });
    {
        std::lock_guard lock(relay->mutex);
        relay->send_locked(e);  // throws: the relay and the handle go with this call
    }
    relay->watch();
    relay->pump();
    return caller;
}

engine::EngineStats Router::stats() const {
    std::lock_guard lock(mutex_);
    engine::EngineStats all;
    for (const auto& s : engines_) all.add(s->last);
    return all;
}

std::vector<engine::EngineStats> Router::rank_stats() const {
    std::lock_guard lock(mutex_);
    std::vector<engine::EngineStats> out;
    for (const auto& s : engines_) out.push_back(s->last);
    return out;
}

int64_t Router::max_context() const {
    std::lock_guard lock(mutex_);
    return max_context_locked();
}

int64_t Router::max_context_locked() const {
    int64_t m = 0;
    for (const auto& s : engines_)
        if (s->healthy && s->max_context > 0) m = m == 0 ? s->max_context : std::min(m, s->max_context);
    return m > 0 ? m : info_.max_context;
}

int64_t Router::vocab_size() const {
    std::lock_guard lock(mutex_);
    return info_.vocab_size;
}

bool Router::healthy(int e) const {
    std::lock_guard lock(mutex_);
    return engines_.at(static_cast<size_t>(e))->healthy;
}

int64_t Router::indexed_blocks(int e) const {
    std::lock_guard lock(mutex_);
    return placer_.indexed_blocks(e);
}

int Router::index_of(const Slot& s) const {
    for (size_t e = 0; e < engines_.size(); ++e)
        if (engines_[e].get() == &s) return static_cast<int>(e);
    FANOUT_FAIL("router: an engine slot that is not in the list");
}

}  // namespace fanout::router

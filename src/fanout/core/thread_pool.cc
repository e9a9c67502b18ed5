#include "fanout/core/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "fanout/core/error.h"

namespace fanout {

ThreadPool::ThreadPool(int num_threads) {
    if (num_threads <= 0) {
        const char* env = std::getenv("FANOUT_NUM_THREADS");
        num_threads = env ? std::atoi(env) : 0;
        if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    }
    // std::system_error (no thread) or std::bad_alloc (no memory for one): the workers started stop
    // before the members they wait on go (an exception out of a constructor runs no destructor),
    // then a clear error, not a hang or std::terminate.
    const auto fail = [&](const char* why) {
        const size_t started = workers_.size();
        stop_workers();
        FANOUT_FAIL("cannot start {} CPU threads (started {}): {}; use fewer (--threads)", num_threads, started + 1,
                    why);
    };
    try {
        for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
    } catch (const std::exception& e) {
        fail(e.what());
    } catch (...) {
        fail("unknown error");
    }
}

ThreadPool::~ThreadPool() { stop_workers(); }

void ThreadPool::stop_workers() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
}

void ThreadPool::worker_loop(int index) {
    uint64_t seen = 0;
    for (;;) {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (index >= job_chunks_) continue;
        const auto* fn = job_;
        const int64_t begin = index * job_chunk_, end = std::min(job_n_, begin + job_chunk_);
        lock.unlock();
        std::exception_ptr err;
        try {
            (*fn)(begin, end);
        } catch (...) {
            err = std::current_exception();
        }
        lock.lock();
        if (err && !error_) error_ = err;
        if (--pending_ == 0) done_.notify_one();
    }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    grain = std::max<int64_t>(grain, 1);
    // At most one chunk per thread, and every chunk but the last at least `grain` items.
    const int64_t max_chunks = std::min<int64_t>(num_threads(), n / grain);
    if (max_chunks <= 1) {
        fn(0, n);
        return;
    }
    const int64_t chunk = (n + max_chunks - 1) / max_chunks;
    const int chunks = static_cast<int>((n + chunk - 1) / chunk);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        job_ = &fn;
        job_n_ = n;
        job_chunk_ = chunk;
        job_chunks_ = chunks;
        pending_ = chunks - 1;
        error_ = nullptr;
        ++generation_;
    }
    wake_.notify_all();
    std::exception_ptr err;
    try {
        fn(0, std::min(n, chunk));
    } catch (...) {
        err = std::current_exception();
    }
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (!err) err = error_;
    lock.unlock();
    if (err) std::rethrow_exception(err);
}

void parallel_for(const Stream& s, int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    if (s.pool)
        s.pool->parallel_for(n, grain, fn);
    else if (n > 0)
        fn(0, n);
}

}  // namespace fanout

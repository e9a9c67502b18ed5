// ThreadPool: a fixed set of worker threads for the CPU path's data-parallel loops.
//
// parallel_for splits [0, n) into contiguous chunks, one per thread at most, and runs them on the
// workers and the calling thread; it returns when all chunks are done. An exception thrown by a
// chunk is rethrown in the caller. Not reentrant: a chunk must not call parallel_for on the same
// pool (ops parallelize one loop level each). The pool is passed to ops explicitly (inside a Stream), never
// reached through a global.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace fanout {

class ThreadPool {
  public:
    // num_threads <= 0: FANOUT_NUM_THREADS if set, else the hardware concurrency.
    explicit ThreadPool(int num_threads = 0);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

    // fn(begin, end) over chunks of at least `grain` items.
    void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  private:
    void worker_loop(int index);
    void stop_workers();  // stops and joins every worker

    std::vector<std::thread> workers_;
    std::mutex mutex_;
    std::condition_variable wake_, done_;
    const std::function<void(int64_t, int64_t)>* job_ = nullptr;
    int64_t job_n_ = 0, job_chunk_ = 0;
    int job_chunks_ = 0, pending_ = 0;
    uint64_t generation_ = 0;
    bool stop_ = false;
    std::exception_ptr error_;
};

// Where an op runs: the CPU thread pool, or (later) a CUDA stream.
struct Stream {
    ThreadPool* pool = nullptr;
    void* cuda_stream = nullptr;
};

// Runs fn over [0, n) on the stream's pool, or inline when it has none.
void parallel_for(const Stream& s, int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace fanout

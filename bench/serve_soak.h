// Soak-run helpers for `fanout bench serve`: slow clients that trickle a request head and never
// finish it (the slowloris load a server must shrug off), and a sampler of the server process's
// resident memory, threads and open descriptors from /proc.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace fanout::bench {

struct SlowClientStats {
    int clients = 0;
    double interval_s = 0;
    double duration_s = 0;  // from start to stop()
    double mean_open = 0;   // connections open on average, from when all had connected once (else from start)
    int min_open = -1;      // the fewest open at once after all had connected once (-1: they never had)
    int max_open = 0;
    int64_t connects = 0;    // connections established, the first ones included
    int64_t reconnects = 0;  // connections established again after the server had dropped one
    int64_t drops = 0;       // connections the server ended (closed, reset, or answered and closed)
    int64_t responses = 0;   // of those, how many got bytes back first (a 408, 431 or 503)
    int64_t connect_failures = 0;
    int64_t bytes_sent = 0;
};
nlohmann::json to_json(const SlowClientStats& s);

// `n` connections to host:port that each send one byte of a request head every `interval_s`
// (`POST /v1/chat/completions HTTP/1.1`, Host, then padding header lines without end), staggered
// over the interval. A connection the server drops is opened again at once when it had lived an
// interval or more, else at its next tick. One thread drives them all with poll().
class SlowClients {
  public:
    SlowClients(const std::string& host, int port, int n, double interval_s);
    ~SlowClients();  // stop()
    SlowClients(const SlowClients&) = delete;
    SlowClients& operator=(const SlowClients&) = delete;

    // Waits until every connection has been established once, or `wait_s` passes; returns how
    // many are open now.
    int wait_connected(double wait_s);
    int open_now() const { return open_.load(); }
    int ever_connected() const { return ever_connected_.load(); }
    // Closes every connection and returns the totals; later calls return the same.
    SlowClientStats stop();

  private:
    struct Slot;
    void run();

    std::string host_;
    int port_;
    int n_;
    double interval_s_;
    std::atomic<bool> stop_{false};
    std::atomic<int> open_{0}, ever_connected_{0};
    std::thread thread_;
    bool stopped_ = false;
    SlowClientStats stats_;  // written by the thread; read after it is joined
};

// One reading of /proc/PID: VmRSS, Threads (status) and the entries of fd/.
struct ProcSample {
    double t_s = 0;  // from the sampler's start
    int64_t rss_kb = 0;
    int64_t threads = 0;
    int64_t fds = -1;  // -1 when fd/ cannot be listed
    int64_t requests_done = 0;
};
// False when the process is gone (or its status cannot be read).
bool read_proc_sample(int pid, ProcSample& s);

// Samples a process every `interval_s` on its own thread, the first sample at once.
class ProcessSampler {
  public:
    ProcessSampler(int pid, double interval_s, std::function<int64_t()> requests_done);
    ~ProcessSampler();  // stop()
    ProcessSampler(const ProcessSampler&) = delete;
    ProcessSampler& operator=(const ProcessSampler&) = delete;

    // Takes a last sample (when the process is still there) and returns every sample.
    std::vector<ProcSample> stop();
    // Whether a sample found the process gone.
    bool process_exited() const { return exited_.load(); }

  private:
    void sample();
    int pid_;
    double interval_s_;
    std::function<int64_t()> requests_done_;
    std::chrono::steady_clock::time_point start_;
    std::mutex mutex_;
    std::condition_variable cv_;
    bool stop_ = false;  // guarded by mutex_
    std::atomic<bool> exited_{false};
    std::vector<ProcSample> samples_;  // guarded by mutex_
    std::thread thread_;
};

// The samples as the report shows them: first, after warm-up (the first sample once
// `warmup_requests` requests were done; the last one when none was), last, and the maximum of
// each figure, then every sample.
nlohmann::json summarize_samples(int pid, double interval_s, const std::vector<ProcSample>& samples,
                                 int64_t warmup_requests, bool exited);

}  // namespace fanout::bench

// Slow clients (one poll() loop over non-blocking sockets) and the /proc sampler of serve_soak.h.
#include "serve_soak.h"

#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "fanout/core/error.h"

namespace fanout::bench {
namespace {

using clock_type = std::chrono::steady_clock;

double seconds_between(clock_type::time_point a, clock_type::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}

clock_type::duration to_duration(double s) {
    return std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(s));
}

struct Address {
    sockaddr_storage addr{};
    socklen_t len = 0;
    int family = AF_INET;
};

Address resolve(const std::string& host, int port) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    FANOUT_CHECK(rc == 0 && res != nullptr, "slow clients: cannot resolve '{}': {}", host, ::gai_strerror(rc));
    Address a;
    std::memcpy(&a.addr, res->ai_addr, res->ai_addrlen);
    a.len = res->ai_addrlen;
    a.family = res->ai_family;
    ::freeaddrinfo(res);
    return a;
}

}  // namespace

nlohmann::json to_json(const SlowClientStats& s) {
    return {{"clients", s.clients},
            {"interval_s", s.interval_s},
            {"duration_s", s.duration_s},
            {"mean_open", s.mean_open},
            {"min_open", s.min_open},
            {"max_open", s.max_open},
            {"connects", s.connects},
            {"reconnects", s.reconnects},
            {"drops", s.drops},
            {"responses", s.responses},
            {"connect_failures", s.connect_failures},
            {"bytes_sent", s.bytes_sent}};
}

// ---------------------------------------------------------------------------------------------
// Slow clients

struct SlowClients::Slot {
    int fd = -1;
    bool connecting = false;  // connect() in progress
    bool connected = false;
    bool ever = false;  // established at least once
    size_t sent = 0;    // head bytes sent on this connection
    clock_type::time_point connected_at;
    clock_type::time_point due;
};

SlowClients::SlowClients(const std::string& host, int port, int n, double interval_s)
    : host_(host), port_(port), n_(n), interval_s_(interval_s) {
    FANOUT_CHECK(n >= 1, "slow clients: n={} must be >= 1", n);
    FANOUT_CHECK(interval_s > 0, "slow clients: interval_s={} must be > 0", interval_s);
    resolve(host_, port_);  // a bad host fails here, not on the thread
    stats_.clients = n;
    stats_.interval_s = interval_s;
    thread_ = std::thread([this] { run(); });
}

SlowClients::~SlowClients() { stop(); }

int SlowClients::wait_connected(double wait_s) {
    const auto deadline = clock_type::now() + to_duration(wait_s);
    while (ever_connected_.load() < n_ && clock_type::now() < deadline && !stop_.load())
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return open_.load();
}

SlowClientStats SlowClients::stop() {
    if (!stopped_) {
        stop_ = true;
        thread_.join();
        stopped_ = true;
    }
    return stats_;
}

void SlowClients::run() {
    const Address address = resolve(host_, port_);
    const std::string head = "POST /v1/chat/completions HTTP/1.1\r\nHost: " + host_ + ":" + std::to_string(port_) +
                             "\r\nContent-Type: application/json\r\n";
    const std::string pad = "X-Slow-Client: 1\r\n";  // repeated: the head never ends
    const auto byte_at = [&](size_t k) { return k < head.size() ? head[k] : pad[(k - head.size()) % pad.size()]; };

    const auto start = clock_type::now();
    const auto interval = to_duration(interval_s_);
    std::vector<Slot> slots(n_);
    for (int i = 0; i < n_; ++i) slots[i].due = start + to_duration(interval_s_ * i / n_);  // staggered

    SlowClientStats& st = stats_;
    int open = 0;
    bool all_connected = false;
    double open_area = 0;  // integral of open connections over seconds
    auto last_change = start;
    st.min_open = -1;
    clock_type::time_point all_since = start;  // when all had connected once; the mean counts from then
    const auto change_open = [&](int delta) {
        const auto now = clock_type::now();
        open_area += open * seconds_between(last_change, now);
        last_change = now;
        open += delta;
        open_ = open;
        st.max_open = std::max(st.max_open, open);
        if (all_connected) st.min_open = std::min(st.min_open, open);
    };
    const auto close_slot = [&](Slot& s) {
        ::close(s.fd);
        s.fd = -1;
        if (s.connected) change_open(-1);
        s.connected = s.connecting = false;
        s.sent = 0;
    };
    // A connection that lived a whole interval is reopened at once; one refused sooner waits for
    // its next tick, so that a server refusing every connection is not hammered.
    const auto drop = [&](Slot& s, bool responded) {
        ++st.drops;
        st.responses += responded;
        const auto now = clock_type::now();
        if (now - s.connected_at >= interval) s.due = now;
        close_slot(s);
    };
    const auto send_byte = [&](Slot& s) {
        const char c = byte_at(s.sent);
        const ssize_t n = ::send(s.fd, &c, 1, MSG_NOSIGNAL);
        if (n == 1) {
            ++s.sent;
            ++st.bytes_sent;
        } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            drop(s, false);
        }
    };
    const auto on_connected = [&](Slot& s) {
        s.connecting = false;
        s.connected = true;
        s.connected_at = clock_type::now();
        ++st.connects;
        if (s.ever) {
            ++st.reconnects;
        } else {
            s.ever = true;
            if (++ever_connected_ == n_) {
                all_connected = true;
                st.min_open = open + 1;
                open_area += open * seconds_between(last_change, clock_type::now());
                last_change = all_since = clock_type::now();
                open_area = 0;  // the ramp-up does not count
            }
        }
        change_open(+1);
        send_byte(s);
    };
    const auto open_slot = [&](Slot& s) {
        s.fd = ::socket(address.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (s.fd < 0) {
            ++st.connect_failures;
            return;
        }
        const int one = 1;
        ::setsockopt(s.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // each byte its own segment
        if (::connect(s.fd, reinterpret_cast<const sockaddr*>(&address.addr), address.len) == 0) {
            on_connected(s);
        } else if (errno == EINPROGRESS) {
            s.connecting = true;
        } else {
            ++st.connect_failures;
            close_slot(s);
        }
    };

    std::vector<pollfd> pfds;
    std::vector<int> which;
    while (!stop_.load()) {
        auto now = clock_type::now();
        auto next = now + std::chrono::milliseconds(100);
        for (Slot& s : slots) {
            if (now >= s.due) {
                if (s.fd < 0)
                    open_slot(s);
                else if (s.connected)
                    send_byte(s);
                s.due += interval;
                if (s.due <= now) s.due = now + interval;  // fell behind: no catching up in bursts
            }
            next = std::min(next, s.due);
        }
        pfds.clear();
        which.clear();
        for (int i = 0; i < n_; ++i) {
            if (slots[i].fd < 0) continue;
            pfds.push_back({slots[i].fd, static_cast<short>(slots[i].connecting ? POLLOUT : POLLIN), 0});
            which.push_back(i);
        }
        // At least 10 ms between rounds: a thousand staggered clients need not wake us a thousand times a second.
        const double wait_ms = std::clamp(1e3 * seconds_between(clock_type::now(), next), 10.0, 100.0);
        const int ready = ::poll(pfds.data(), pfds.size(), static_cast<int>(std::ceil(wait_ms)));
        if (ready <= 0) continue;
        for (size_t k = 0; k < pfds.size(); ++k) {
            if (pfds[k].revents == 0) continue;
            Slot& s = slots[which[k]];
            if (s.connecting) {
                int err = 0;
                socklen_t len = sizeof(err);
                ::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len);
                if (err == 0 && (pfds[k].revents & POLLOUT) && !(pfds[k].revents & (POLLERR | POLLHUP))) {
                    on_connected(s);
                } else {
                    ++st.connect_failures;
                    close_slot(s);
                }
                continue;
            }
            // Readable: the server answered (408, 431, 503) or closed; either way it is done with us.
            bool got = false, closed = false;
            char buf[4096];
            for (;;) {
                const ssize_t n = ::recv(s.fd, buf, sizeof(buf), 0);
                if (n > 0) {
                    got = true;
                    continue;
                }
                if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
                if (n < 0 && errno == EINTR) continue;
                closed = true;
                break;
            }
            if (got || closed) drop(s, got);
        }
    }
    all_connected = false;  // closing them all is not the server dropping them: min_open stays as it was
    for (Slot& s : slots)
        if (s.fd >= 0) close_slot(s);
    const auto end = clock_type::now();
    open_area += open * seconds_between(last_change, end);
    st.duration_s = seconds_between(start, end);
    const double measured_s = seconds_between(all_since, end);
    st.mean_open = measured_s > 0 ? open_area / measured_s : 0;
}

// ---------------------------------------------------------------------------------------------
// /proc sampler

bool read_proc_sample(int pid, ProcSample& s) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    if (!in.good()) return false;
    bool has_rss = false, has_threads = false;
    for (std::string line; std::getline(in, line);) {
        std::istringstream fields(line);
        std::string key;
        fields >> key;
        if (key == "VmRSS:") has_rss = static_cast<bool>(fields >> s.rss_kb);
        if (key == "Threads:") has_threads = static_cast<bool>(fields >> s.threads);
    }
    if (!has_rss || !has_threads) return false;  // gone, or a zombie (no VmRSS)
    s.fds = -1;
    if (DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/fd").c_str())) {
        s.fds = 0;
        while (const dirent* e = ::readdir(d)) s.fds += e->d_name[0] != '.';
        ::closedir(d);
    }
    return true;
}

ProcessSampler::ProcessSampler(int pid, double interval_s, std::function<int64_t()> requests_done)
    : pid_(pid), interval_s_(interval_s), requests_done_(std::move(requests_done)) {
    ProcSample probe;
    FANOUT_CHECK(pid > 0 && read_proc_sample(pid, probe), "server pid {}: cannot read /proc/{}/status", pid, pid);
    FANOUT_CHECK(interval_s > 0, "sample interval {} must be > 0", interval_s);
    start_ = clock_type::now();
    thread_ = std::thread([this] {
        auto next = start_;
        for (;;) {
            sample();
            if (exited_.load()) return;
            next += to_duration(interval_s_);
            std::unique_lock lock(mutex_);
            if (cv_.wait_until(lock, next, [this] { return stop_; })) return;
        }
    });
}

ProcessSampler::~ProcessSampler() { stop(); }

void ProcessSampler::sample() {
    ProcSample s;
    s.t_s = seconds_between(start_, clock_type::now());
    s.requests_done = requests_done_ ? requests_done_() : 0;
    if (!read_proc_sample(pid_, s)) {
        exited_ = true;
        return;
    }
    std::lock_guard lock(mutex_);
    samples_.push_back(s);
}

std::vector<ProcSample> ProcessSampler::stop() {
    {
        std::lock_guard lock(mutex_);
        if (stop_) return samples_;
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    if (!exited_.load()) sample();
    std::lock_guard lock(mutex_);
    return samples_;
}

nlohmann::json summarize_samples(int pid, double interval_s, const std::vector<ProcSample>& samples,
                                 int64_t warmup_requests, bool exited) {
    using nlohmann::json;
    const auto one = [](const ProcSample& s) {
        return json{{"t_s", s.t_s},
                    {"rss_kb", s.rss_kb},
                    {"threads", s.threads},
                    {"fds", s.fds},
                    {"requests_done", s.requests_done}};
    };
    json j = {{"pid", pid},
              {"interval_s", interval_s},
              {"num_samples", samples.size()},
              {"warmup_requests", warmup_requests},
              {"exited_during_run", exited}};
    if (samples.empty()) return j;
    const ProcSample* warm = &samples.back();
    for (const ProcSample& s : samples) {
        if (s.requests_done >= warmup_requests) {
            warm = &s;
            break;
        }
    }
    ProcSample mx;
    for (const ProcSample& s : samples) {
        mx.rss_kb = std::max(mx.rss_kb, s.rss_kb);
        mx.threads = std::max(mx.threads, s.threads);
        mx.fds = std::max(mx.fds, s.fds);
    }
    j["first"] = one(samples.front());
    j["after_warmup"] = one(*warm);
    j["last"] = one(samples.back());
    j["max"] = {{"rss_kb", mx.rss_kb}, {"threads", mx.threads}, {"fds", mx.fds}};
    j["samples"] = json::array();
    for (const ProcSample& s : samples) j["samples"].push_back(one(s));
    return j;
}

}  // namespace fanout::bench

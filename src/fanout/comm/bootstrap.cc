#include "fanout/comm/bootstrap.h"

#include <arpa/inet.h>
#include <fmt/ranges.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "fanout/core/deadline.h"
#include "fanout/core/error.h"

namespace fanout::comm {
namespace {

using Clock = std::chrono::steady_clock;

// The integer in environment variable `name`, or `fallback` when unset.
int env_int(const char* name, int fallback, bool* found = nullptr) {
    const char* v = std::getenv(name);
    if (found) *found = v != nullptr;
    if (v == nullptr) return fallback;
    int out = 0;
    const char* end = v + std::strlen(v);
    const auto [p, ec] = std::from_chars(v, end, out);
    FANOUT_CHECK(ec == std::errc() && p == end && end != v, "environment: {}='{}' is not an integer", name, v);
    return out;
}

class Socket {
  public:
    Socket() = default;
    explicit Socket(int fd) : fd_(fd) {}
    Socket(Socket&& o) noexcept : fd_(o.fd_), cut_(o.cut_) {
        o.fd_ = -1;
        o.cut_ = false;
    }
    Socket& operator=(Socket&& o) noexcept {
        std::swap(fd_, o.fd_);
        std::swap(cut_, o.cut_);
        return *this;
    }
    ~Socket() {
        if (fd_ >= 0) ::close(fd_);
    }
    int fd() const { return fd_; }
    // A frame sent on this connection failed (send_frame), perhaps part-way: the peer's reader may
    // be inside it, so no later frame may follow — its bytes would be read as the rest of this one.
    // The connection is then shut for writing: the peer sees the end of the stream.
    bool cut() const { return cut_; }
    void cut_off() {
        cut_ = true;
        if (fd_ >= 0) ::shutdown(fd_, SHUT_WR);
    }

  private:
    int fd_ = -1;
    bool cut_ = false;
};

int remaining_ms(Clock::time_point deadline) {
    if (deadline == Clock::time_point::max()) return -1;  // poll: wait without a limit
    return static_cast<int>(std::min<int64_t>(time_left(deadline).count(), 1 << 30));
}

// Waits for `events` on fd until the deadline; false on timeout. Once the deadline has passed it is
// false even where fd is ready (poll's zero timeout would still report it), so a peer that keeps
// bytes trickling, or room opening, cannot hold a send or receive loop open past it.
bool wait_for(int fd, short events, Clock::time_point deadline) {
    pollfd p{fd, events, 0};
    for (;;) {
        if (remaining_ms(deadline) == 0) return false;
        const int r = ::poll(&p, 1, remaining_ms(deadline));
        if (r > 0) return true;
        if (r == 0) return false;
        if (errno != EINTR) return false;
    }
}

// Sends without blocking past the deadline: each send takes what the socket has room for
// (MSG_DONTWAIT; a blocking send of a large buffer would wait in the kernel for all of it, however
// long the peer leaves it unread).
void send_all(int fd, const void* data, size_t n, Clock::time_point deadline, const std::string& what) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
        FANOUT_CHECK(wait_for(fd, POLLOUT, deadline), "rendezvous: timed out sending {}", what);
        const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            p += w, n -= static_cast<size_t>(w);
            continue;
        }
        FANOUT_CHECK(errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK, "rendezvous: sending {} failed: {}",
                     what, std::strerror(errno));
    }
}

void recv_all(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& what) {
    auto* p = static_cast<uint8_t*>(data);
    while (n > 0) {
        FANOUT_CHECK(wait_for(fd, POLLIN, deadline), "rendezvous: timed out receiving {}", what);
        const ssize_t r = ::recv(fd, p, n, 0);
        FANOUT_CHECK(r != 0, "rendezvous: the peer closed the connection while sending {}", what);
        FANOUT_CHECK(r > 0 || errno == EINTR, "rendezvous: receiving {} failed: {}", what, std::strerror(errno));
        if (r > 0) p += r, n -= static_cast<size_t>(r);
    }
}

sockaddr_in resolve(const std::string& host, int port) {
    FANOUT_CHECK(port > 0 && port < 65536, "rendezvous: port {} outside 1..65535", port);
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
    FANOUT_CHECK(rc == 0 && res != nullptr, "rendezvous: cannot resolve '{}': {}", host, ::gai_strerror(rc));
    sockaddr_in addr = *reinterpret_cast<const sockaddr_in*>(res->ai_addr);
    ::freeaddrinfo(res);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    return addr;
}

// Rank 0's side of a rendezvous: listens on `addr` and accepts the other world − 1 ranks, each
// saying its rank first; on_peer(rank, socket) for each as it comes. `who` starts the errors.
template <typename OnPeer>
void accept_ranks(const RankInfo& me, const sockaddr_in& addr, const std::string& where, Clock::time_point deadline,
                  const char* who, OnPeer&& on_peer) {
    Socket listener(::socket(AF_INET, SOCK_STREAM, 0));
    FANOUT_CHECK(listener.fd() >= 0, "{}: socket: {}", who, std::strerror(errno));
    const int one = 1;
    ::setsockopt(listener.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    FANOUT_CHECK(::bind(listener.fd(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0,
                 "{}: rank 0 cannot listen on {}: {}", who, where, std::strerror(errno));
    FANOUT_CHECK(::listen(listener.fd(), me.world) == 0, "{}: listen on {}: {}", who, where, std::strerror(errno));
    for (int joined = 1; joined < me.world; ++joined) {
        FANOUT_CHECK(wait_for(listener.fd(), POLLIN, deadline),
                     "{}: rank 0 on {} heard from {} of {} ranks before the timeout", who, where, joined - 1,
                     me.world - 1);
        Socket peer(::accept(listener.fd(), nullptr, nullptr));
        FANOUT_CHECK(peer.fd() >= 0, "{}: accept on {}: {}", who, where, std::strerror(errno));
        int32_t r = -1;
        recv_all(peer.fd(), &r, sizeof(r), deadline, "a peer's rank");
        FANOUT_CHECK(r > 0 && r < me.world, "{}: a peer on {} says it is rank {} of {}", who, where, r, me.world);
        on_peer(r, std::move(peer));
    }
}

// The other ranks' side: connects to rank 0 at `addr` (it may not listen yet: retries until the
// deadline) and says this rank's number.
Socket connect_to_rank0(const RankInfo& me, const sockaddr_in& addr, const std::string& where,
                        Clock::time_point deadline, const char* who) {
    for (;;) {
        Socket s(::socket(AF_INET, SOCK_STREAM, 0));
        FANOUT_CHECK(s.fd() >= 0, "{}: socket: {}", who, std::strerror(errno));
        if (::connect(s.fd(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
            const int32_t r = me.rank;
            send_all(s.fd(), &r, sizeof(r), deadline, "this rank's number to rank 0");
            return s;
        }
        FANOUT_CHECK(remaining_ms(deadline) > 0, "{}: rank {} found nobody listening on {} before the timeout", who,
                     me.rank, where);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

// One frame of the TCP control plane: kind, size, bytes.
enum class Frame : uint8_t { kData = 0, kAbort = 1 };
constexpr uint64_t kMaxFrameBytes = uint64_t{1} << 30;

// Sends one frame on s. One that fails leaves s cut off (Socket::cut_off), and a cut-off connection
// takes no further frame.
void send_frame(Socket& s, Frame kind, const std::vector<uint8_t>& bytes, Clock::time_point deadline,
                const std::string& what) {
    FANOUT_CHECK(!s.cut(), "control plane: cannot send {}: an earlier frame on the connection was cut off", what);
    const uint8_t k = static_cast<uint8_t>(kind);
    const uint64_t size = bytes.size();
    try {
        send_all(s.fd(), &k, 1, deadline, what);
        send_all(s.fd(), &size, sizeof(size), deadline, what);
        send_all(s.fd(), bytes.data(), bytes.size(), deadline, what);
    } catch (...) {
        s.cut_off();
        throw;
    }
}

// One frame read as its bytes come: feed() takes whatever the socket holds of it without waiting
// and never reads past its end (the next frame's bytes stay in the socket), so rank 0 can read
// every rank's report side by side and a frame that stops half-way holds up no other rank's
// (gather below). The checks name `what`. One reader per frame: take() hands the body over.
class FrameReader {
  public:
    explicit FrameReader(std::string what) : what_(std::move(what)) {}

    // Reads what the socket holds of the frame without waiting; true once the frame is whole (then
    // kind() and take() give it). Throws when the peer closed the connection, the read failed
    // (e.g. a reset) or the header is malformed.
    bool feed(int fd) {
        while (!whole()) {
            const bool in_header = got_ < kHeaderBytes;
            uint8_t* dst = in_header ? header_ + got_ : bytes_.data() + (got_ - kHeaderBytes);
            const size_t want = in_header ? kHeaderBytes - got_ : bytes_.size() - (got_ - kHeaderBytes);
            const ssize_t r = ::recv(fd, dst, want, MSG_DONTWAIT);
            FANOUT_CHECK(r != 0, "rendezvous: the peer closed the connection while sending {}", what_);
            if (r < 0) {
                if (errno == EINTR) continue;
                FANOUT_CHECK(errno == EAGAIN || errno == EWOULDBLOCK, "rendezvous: receiving {} failed: {}", what_,
                             std::strerror(errno));
                return false;  // the rest has not arrived yet
            }
            got_ += static_cast<size_t>(r);
            if (in_header && got_ == kHeaderBytes) {
                uint64_t size = 0;
                std::memcpy(&size, header_ + 1, sizeof(size));
                FANOUT_CHECK(header_[0] <= 1, "control plane: frame of unknown kind {} in {}", header_[0], what_);
                FANOUT_CHECK(size <= kMaxFrameBytes, "control plane: a frame of {} bytes in {} (at most {})", size,
                             what_, kMaxFrameBytes);
                bytes_.assign(static_cast<size_t>(size), 0);
            }
        }
        return true;
    }

    Frame kind() const { return static_cast<Frame>(header_[0]); }
    // The whole frame's body, once; the reader is spent after it.
    std::vector<uint8_t> take() {
        FANOUT_CHECK(whole() && !taken_, "control plane: {} taken before it was whole, or twice", what_);
        taken_ = true;
        return std::move(bytes_);
    }
    // Some of the frame has arrived.
    bool started() const { return got_ > 0; }

  private:
    bool whole() const { return got_ >= kHeaderBytes && got_ - kHeaderBytes == bytes_.size(); }

    static constexpr size_t kHeaderBytes = 1 + sizeof(uint64_t);  // kind, size (send_frame)
    std::string what_;
    uint8_t header_[kHeaderBytes] = {};
    size_t got_ = 0;  // header and body bytes so far
    std::vector<uint8_t> bytes_;
    bool taken_ = false;
};

Frame recv_frame(int fd, std::vector<uint8_t>* bytes, Clock::time_point deadline, const std::string& what) {
    FrameReader reader(what);
    for (;;) {
        FANOUT_CHECK(wait_for(fd, POLLIN, deadline), "rendezvous: timed out receiving {}", what);
        if (reader.feed(fd)) break;
    }
    *bytes = reader.take();
    return reader.kind();
}

class TcpControl final : public ControlPlane {
  public:
    TcpControl(const RankInfo& me, const std::string& host, int port, std::chrono::milliseconds connect_timeout,
               std::chrono::milliseconds report_timeout)
        : me_(me), report_timeout_(report_timeout), where_(host + ":" + std::to_string(port)) {
        const auto deadline = Clock::now() + connect_timeout;
        const sockaddr_in addr = resolve(host, port);
        if (me.world == 1) return;
        if (me.rank == 0) {
            peers_.resize(static_cast<size_t>(me.world));
            accept_ranks(me, addr, where_, deadline, "control plane", [&](int r, Socket peer) {
                FANOUT_CHECK(peers_[r].fd() < 0, "control plane: rank {} joined twice on {}", r, where_);
                nodelay(peer.fd());
                peers_[r] = std::move(peer);
            });
            return;
        }
        leader_ = connect_to_rank0(me, addr, where_, deadline, "control plane");
        nodelay(leader_.fd());
    }

    int rank() const override { return me_.rank; }
    int world() const override { return me_.world; }

    std::vector<uint8_t> broadcast(std::vector<uint8_t> message) override {
        check_running();
        if (me_.world == 1) return message;
        if (me_.rank == 0) {
            const auto deadline = Clock::now() + report_timeout_;
            for (int r = 1; r < me_.world; ++r)
                guarded(r, [&] { send_frame(peers_[r], Frame::kData, message, deadline, "a step message"); });
            return message;
        }
        std::vector<uint8_t> got;
        Frame kind = Frame::kData;
        guarded(0, [&] { kind = recv_frame(leader_.fd(), &got, Clock::time_point::max(), "rank 0's step message"); });
        if (kind == Frame::kAbort) fail_with(std::string(got.begin(), got.end()));
        return got;
    }

    std::vector<std::vector<uint8_t>> gather(std::vector<uint8_t> message) override {
        check_running();
        if (me_.world == 1) return {std::move(message)};
        if (me_.rank != 0) {
            guarded(0, [&] {
                send_frame(leader_, Frame::kData, message, Clock::now() + report_timeout_, "this rank's report");
            });
            return {};
        }
        std::vector<std::vector<uint8_t>> out(static_cast<size_t>(me_.world));
        out[0] = std::move(message);
        const auto deadline = Clock::now() + report_timeout_;
        // Every rank's report is awaited at once and taken as it comes: a rank that fails sends its
        // abort while the others may be stuck waiting for it (in the EP exchange), and its reason —
        // not a timeout on the first silent rank — is what the group must report.
        // Each rank's frame is read as its bytes come (FrameReader), so one that stops half-way
        // holds up no other rank's.
        std::vector<int> waiting;
        std::vector<FrameReader> readers;  // by rank
        readers.reserve(static_cast<size_t>(me_.world));
        readers.emplace_back("");  // rank 0's own report is `message`: never fed
        for (int r = 1; r < me_.world; ++r) {
            waiting.push_back(r);
            readers.emplace_back(fmt::format("rank {}'s step report", r));
        }
        std::vector<pollfd> polls;
        while (!waiting.empty()) {
            polls.clear();
            for (const int r : waiting) polls.push_back({peers_[r].fd(), POLLIN, 0});
            // Past the deadline poll's zero timeout still reports readable sockets: a rank that
            // keeps a report trickling in must not hold the loop open.
            const int ready = Clock::now() >= deadline ? 0 : ::poll(polls.data(), polls.size(), remaining_ms(deadline));
            if (ready < 0 && errno == EINTR) continue;
            if (ready <= 0) {
                std::vector<int> partial;
                for (const int r : waiting)
                    if (readers[r].started()) partial.push_back(r);
                const std::string reason =
                    ready == 0 ? fmt::format("DP rank 0 of {}: no step report from rank(s) {} within {} ms ({}){}",
                                             me_.world, fmt::join(waiting, ", "), report_timeout_.count(), where_,
                                             partial.empty() ? std::string()
                                                             : fmt::format("; part of the report of rank(s) {} arrived",
                                                                           fmt::join(partial, ", ")))
                               : fmt::format("DP rank 0 of {}: waiting for step reports on {} failed: {}", me_.world,
                                             where_, std::strerror(errno));
                abort(reason);
                fail_with(reason);
            }
            std::vector<int> still;
            for (size_t i = 0; i < waiting.size(); ++i) {
                const int r = waiting[i];
                if (polls[i].revents == 0) {
                    still.push_back(r);
                    continue;
                }
                bool whole = false;
                guarded(r, [&] { whole = readers[r].feed(peers_[r].fd()); });
                if (!whole) {
                    still.push_back(r);
                    continue;
                }
                const Frame kind = readers[r].kind();
                out[r] = readers[r].take();
                if (kind == Frame::kAbort) {
                    const std::string reason(out[r].begin(), out[r].end());
                    abort(reason);  // on to every other rank
                    fail_with(reason);
                }
            }
            waiting = std::move(still);
        }
        return out;
    }

    void abort(const std::string& reason) override {
        if (!abort_reason_.empty()) return;
        abort_reason_ = reason.empty() ? std::string("aborted") : reason;
        const std::vector<uint8_t> bytes(abort_reason_.begin(), abort_reason_.end());
        const auto deadline = Clock::now() + std::chrono::seconds(5);
        // Best effort: a peer that is gone cannot be told, nor one whose connection carries a frame
        // cut off (its reader would take the abort as that frame's rest): it sees the end of the
        // stream instead, a failure naming this rank.
        const auto tell = [&](Socket& s) {
            if (s.fd() < 0) return;
            try {
                if (!s.cut()) send_frame(s, Frame::kAbort, bytes, deadline, "an abort");
            } catch (const std::exception&) {
            }
        };
        if (me_.rank == 0) {
            for (auto& p : peers_) {
                tell(p);
                if (p.fd() >= 0) ::shutdown(p.fd(), SHUT_WR);  // the abort, then end of stream: nothing after it
            }
        } else {
            tell(leader_);
        }
    }

    std::string abort_reason() const override { return abort_reason_; }

  private:
    static void nodelay(int fd) {
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    void check_running() const { FANOUT_CHECK(abort_reason_.empty(), "{}", abort_reason_); }
    [[noreturn]] void fail_with(const std::string& reason) {
        if (abort_reason_.empty()) abort_reason_ = reason;
        FANOUT_FAIL("{}", abort_reason_);
    }
    // fn's socket error with `peer` (rank 0 from the others): the group's failure, naming the peer.
    template <typename Fn>
    void guarded(int peer, Fn&& fn) {
        try {
            fn();
        } catch (const Error& e) {
            // Rank 0 may have sent the group's abort before the connection went: its reason first.
            if (me_.rank != 0 && leader_.fd() >= 0) {
                try {
                    std::vector<uint8_t> bytes;
                    if (recv_frame(leader_.fd(), &bytes, Clock::now() + std::chrono::milliseconds(500), "an abort") ==
                        Frame::kAbort)
                        fail_with(std::string(bytes.begin(), bytes.end()));
                } catch (const Error&) {
                    if (!abort_reason_.empty()) throw;
                }
            }
            const std::string reason = fmt::format("DP rank {} of {}: the control plane to rank {} ({}) failed: {}",
                                                   me_.rank, me_.world, peer, where_, e.what());
            if (me_.rank == 0) abort(reason);
            fail_with(reason);
        }
    }

    RankInfo me_;
    std::chrono::milliseconds report_timeout_;
    std::string where_;
    std::vector<Socket> peers_;  // rank 0: a connection per rank (index 0 unused)
    Socket leader_;              // other ranks: the connection to rank 0
    std::string abort_reason_;
};

}  // namespace

std::unique_ptr<ControlPlane> make_tcp_control(const RankInfo& me, const std::string& host, int port,
                                               std::chrono::milliseconds connect_timeout,
                                               std::chrono::milliseconds report_timeout) {
    return std::make_unique<TcpControl>(me, host, port, connect_timeout, report_timeout);
}

RankInfo rank_info_from_env() {
    RankInfo info;
    bool ompi = false, plain = false;
    info.rank = env_int("OMPI_COMM_WORLD_RANK", 0, &ompi);
    const char* rank_var = "OMPI_COMM_WORLD_RANK";
    const char* world_var = "OMPI_COMM_WORLD_SIZE";
    if (ompi) {
        info.world = env_int("OMPI_COMM_WORLD_SIZE", 1);
        info.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    } else {
        rank_var = "RANK";
        world_var = "WORLD_SIZE";
        info.rank = env_int("RANK", 0, &plain);
        info.world = env_int("WORLD_SIZE", 1);
        info.local_rank = env_int("LOCAL_RANK", 0);
    }
    FANOUT_CHECK(info.world >= 1, "environment: {}={} must be >= 1", world_var, info.world);
    FANOUT_CHECK(info.rank >= 0 && info.rank < info.world, "environment: {}={} outside [0, {}={})", rank_var, info.rank,
                 world_var, info.world);
    FANOUT_CHECK(info.local_rank >= 0, "environment: local rank {} must be >= 0", info.local_rank);
    return info;
}

std::pair<std::string, int> master_address_from_env() {
    const char* addr = std::getenv("MASTER_ADDR");
    const int port = env_int("MASTER_PORT", 29500);
    FANOUT_CHECK(port > 0 && port < 65536, "environment: MASTER_PORT={} outside 1..65535", port);
    return {addr != nullptr && *addr != '\0' ? addr : "127.0.0.1", port};
}

std::vector<uint8_t> tcp_broadcast(const RankInfo& me, const std::string& host, int port, std::vector<uint8_t> blob,
                                   std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    const sockaddr_in addr = resolve(host, port);
    const std::string where = host + ":" + std::to_string(port);
    if (me.world == 1) return blob;
    if (me.rank == 0) {
        const uint64_t size = blob.size();
        accept_ranks(me, addr, where, deadline, "rendezvous", [&](int r, Socket peer) {
            const std::string to = "the blob to rank " + std::to_string(r);
            send_all(peer.fd(), &size, sizeof(size), deadline, to);
            send_all(peer.fd(), blob.data(), blob.size(), deadline, to);
        });
        return blob;
    }
    // Other ranks: connect (rank 0 may not be listening yet), say who we are, read the blob.
    const Socket s = connect_to_rank0(me, addr, where, deadline, "rendezvous");
    uint64_t size = 0;
    recv_all(s.fd(), &size, sizeof(size), deadline, "the blob's size from rank 0 at " + where);
    FANOUT_CHECK(size <= (uint64_t{1} << 20), "rendezvous: rank 0 at {} announced {} bytes (at most 1 MiB)", where,
                 size);
    std::vector<uint8_t> got(static_cast<size_t>(size));
    recv_all(s.fd(), got.data(), got.size(), deadline, "the blob from rank 0 at " + where);
    return got;
}

}  // namespace fanout::comm

// Bootstrap: rank info from the launcher's environment (OpenMPI's or torchrun-style variables,
// malformed values named), and the TCP rendezvous among threads standing in for processes —
// every rank gets rank 0's bytes, and a missing rank 0 or a missing peer is an error naming the
// address, not a hang.
#include "fanout/comm/bootstrap.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace fanout::comm {
namespace {

// Sets environment variables for one test and restores the prior state.
class Env {
  public:
    void set(const char* name, const char* value) {
        const char* old = std::getenv(name);
        saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
        ::setenv(name, value, 1);
    }
    ~Env() {
        for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
            if (it->second)
                ::setenv(it->first.c_str(), it->second->c_str(), 1);
            else
                ::unsetenv(it->first.c_str());
        }
    }

  private:
    std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

void clear_launcher_env(Env& env) {
    for (const char* v : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "RANK",
                          "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) {
        env.set(v, "");
        ::unsetenv(v);
    }
}

int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
}

TEST(Bootstrap, RankInfoFromTheLaunchersEnvironment) {
    Env env;
    clear_launcher_env(env);
    RankInfo none = rank_info_from_env();
    EXPECT_EQ(none.rank, 0);
    EXPECT_EQ(none.world, 1);
    env.set("RANK", "2");
    env.set("WORLD_SIZE", "4");
    env.set("LOCAL_RANK", "1");
    const RankInfo torchrun = rank_info_from_env();
    EXPECT_EQ(torchrun.rank, 2);
    EXPECT_EQ(torchrun.world, 4);
    EXPECT_EQ(torchrun.local_rank, 1);
    env.set("OMPI_COMM_WORLD_RANK", "5");  // mpirun's variables win
    env.set("OMPI_COMM_WORLD_SIZE", "8");
    env.set("OMPI_COMM_WORLD_LOCAL_RANK", "5");
    const RankInfo mpi = rank_info_from_env();
    EXPECT_EQ(mpi.rank, 5);
    EXPECT_EQ(mpi.world, 8);
    env.set("OMPI_COMM_WORLD_RANK", "8");
    EXPECT_NE(testing::error_of([] { rank_info_from_env(); }).find("OMPI_COMM_WORLD_RANK=8 outside [0,"),
              std::string::npos);
    env.set("OMPI_COMM_WORLD_RANK", "two");
    EXPECT_NE(testing::error_of([] { rank_info_from_env(); }).find("OMPI_COMM_WORLD_RANK='two' is not an integer"),
              std::string::npos);
}

TEST(Bootstrap, MasterAddressDefaultsAndChecks) {
    Env env;
    clear_launcher_env(env);
    EXPECT_EQ(master_address_from_env(), (std::pair<std::string, int>{"127.0.0.1", 29500}));
    env.set("MASTER_ADDR", "10.0.0.7");
    env.set("MASTER_PORT", "1234");
    EXPECT_EQ(master_address_from_env(), (std::pair<std::string, int>{"10.0.0.7", 1234}));
    env.set("MASTER_PORT", "70000");
    EXPECT_NE(testing::error_of([] { master_address_from_env(); }).find("MASTER_PORT=70000"), std::string::npos);
}

TEST(Bootstrap, TcpBroadcastGivesEveryRankRankZerosBytes) {
    const int world = 4, port = free_port();
    std::vector<uint8_t> id(128);
    for (size_t i = 0; i < id.size(); ++i) id[i] = uint8_t(i * 13 + 5);
    std::vector<std::vector<uint8_t>> got(world);
    std::vector<std::string> errors(world);
    std::vector<std::thread> threads;
    for (int r = world - 1; r >= 0; --r)  // rank 0 last: the others must wait for it
        threads.emplace_back([&, r] {
            try {
                got[r] = tcp_broadcast({r, world, r}, "127.0.0.1", port, r == 0 ? id : std::vector<uint8_t>{},
                                       std::chrono::seconds(10));
            } catch (const std::exception& e) {
                errors[r] = e.what();
            }
        });
    for (auto& t : threads) t.join();
    for (int r = 0; r < world; ++r) {
        EXPECT_EQ(errors[r], "") << "rank " << r;
        EXPECT_EQ(got[r], id) << "rank " << r;
    }
}

TEST(Bootstrap, MissingRanksAreTimeoutsNamingTheAddress) {
    const int port = free_port();
    const std::string nobody = testing::error_of([&] {
        tcp_broadcast({1, 2, 1}, "127.0.0.1", port, {}, std::chrono::milliseconds(200));
    });
    EXPECT_NE(nobody.find("rank 1 found nobody listening on 127.0.0.1:" + std::to_string(port)), std::string::npos)
        << nobody;
    const std::string lonely = testing::error_of([&] {
        tcp_broadcast({0, 3, 0}, "127.0.0.1", port, {1, 2, 3}, std::chrono::milliseconds(200));
    });
    EXPECT_NE(lonely.find("heard from 0 of 2 ranks"), std::string::npos) << lonely;
}

// The TCP control plane: four ranks as threads on localhost. Messages and reports travel in order
// for many steps; a rank's abort reaches rank 0, which fails its gather with the reason and passes
// it to the others at their next wait; a rank whose connection closes is named by rank 0.
TEST(TcpControl, StepsInOrderThenAnAbortReachesEveryRank) {
    constexpr int kWorld = 4, kSteps = 100;
    const int port = free_port();
    std::vector<std::string> errors(kWorld);
    std::vector<std::thread> threads;
    std::atomic<int> bad{0};
    std::vector<std::unique_ptr<ControlPlane>> cps(kWorld);  // kept until every rank is done, as processes would
    for (int r = 0; r < kWorld; ++r)
        threads.emplace_back([&, r] {
            try {
                cps[r] = make_tcp_control({r, kWorld, r}, "127.0.0.1", port, std::chrono::seconds(10));
                auto& cp = cps[r];
                for (int step = 0; step < kSteps; ++step) {
                    const std::string want = "step " + std::to_string(step);
                    const auto got =
                        cp->broadcast(r == 0 ? std::vector<uint8_t>(want.begin(), want.end()) : std::vector<uint8_t>{});
                    if (std::string(got.begin(), got.end()) != want) ++bad;
                    const std::string mine = std::to_string(r * 1000 + step);
                    const auto reports = cp->gather({mine.begin(), mine.end()});
                    if (r == 0)
                        for (int p = 0; p < kWorld; ++p)
                            if (std::string(reports[p].begin(), reports[p].end()) != std::to_string(p * 1000 + step))
                                ++bad;
                }
                // One more step in which rank 2 fails instead of reporting.
                cp->broadcast(r == 0 ? std::vector<uint8_t>{1} : std::vector<uint8_t>{});
                if (r == 2) {
                    cp->abort("DP rank 2 of 4 failed: injected");
                    errors[r] = cp->abort_reason();
                    return;
                }
                cp->gather({});
                cp->broadcast({});  // ranks 1 and 3 learn of it here
                errors[r] = "no error";
            } catch (const Error& e) {
                errors[r] = e.what();
            }
        });
    for (auto& t : threads) t.join();
    EXPECT_EQ(bad, 0);
    for (int r = 0; r < kWorld; ++r)
        EXPECT_NE(errors[r].find("DP rank 2 of 4 failed: injected"), std::string::npos)
            << "rank " << r << ": " << errors[r];
}

// Rank 2 fails while rank 1, stuck (as in an EP exchange waiting for rank 2), sends nothing: rank 0
// reports rank 2's reason at once, not a timeout naming rank 1 — it waits for all reports together.
TEST(TcpControl, AFailedRanksReasonWinsOverASilentOnesTimeout) {
    constexpr int kWorld = 3;
    const int port = free_port();
    std::vector<std::string> errors(kWorld);
    std::vector<std::unique_ptr<ControlPlane>> cps(kWorld);
    std::vector<std::thread> threads;
    const auto start = std::chrono::steady_clock::now();
    std::chrono::steady_clock::duration leader_took{};
    for (int r = 0; r < kWorld; ++r)
        threads.emplace_back([&, r] {
            try {
                cps[r] = make_tcp_control({r, kWorld, r}, "127.0.0.1", port, std::chrono::seconds(10),
                                          std::chrono::seconds(20));
                cps[r]->broadcast(r == 0 ? std::vector<uint8_t>{1} : std::vector<uint8_t>{});
                if (r == 2) cps[r]->abort("DP rank 2 of 3 failed: injected");
                if (r == 0) {
                    const auto t0 = std::chrono::steady_clock::now();
                    try {
                        cps[r]->gather({});
                    } catch (...) {
                        leader_took = std::chrono::steady_clock::now() - t0;
                        throw;
                    }
                }
                if (r == 1) cps[r]->broadcast({});  // no report: it learns of the abort here
                errors[r] = r == 2 ? cps[r]->abort_reason() : "no error";
            } catch (const Error& e) {
                errors[r] = e.what();
            }
        });
    for (auto& t : threads) t.join();
    for (int r = 0; r < kWorld; ++r)
        EXPECT_NE(errors[r].find("DP rank 2 of 3 failed: injected"), std::string::npos)
            << "rank " << r << ": " << errors[r];
    EXPECT_LT(leader_took, std::chrono::seconds(10));
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
}

// The bytes of one data frame of the control plane: kind 0, the size in host order, the body.
std::vector<uint8_t> control_frame(const std::vector<uint8_t>& body) {
    const uint64_t size = body.size();
    std::vector<uint8_t> f(1 + sizeof(size) + body.size(), 0);
    std::memcpy(f.data() + 1, &size, sizeof(size));
    if (!body.empty()) std::memcpy(f.data() + 1 + sizeof(size), body.data(), body.size());
    return f;
}

// A rank played by hand over a raw socket: connects to rank 0 on `port` (retrying while it is
// not listening yet) and says its rank, as make_tcp_control's other ranks do. -1 on failure.
int connect_as_rank(int port, int32_t rank) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    for (int tries = 0; tries < 500; ++tries) {
        const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
            if (::send(fd, &rank, sizeof(rank), 0) == ssize_t{sizeof(rank)}) return fd;
            ::close(fd);
            return -1;
        }
        ::close(fd);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
}

// Waits until `flag` is set or 30 s have passed; false on the timeout (the test then fails
// instead of hanging).
bool wait_flag(const std::atomic<bool>& flag) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!flag) {
        if (std::chrono::steady_clock::now() > until) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
}

// Rank 1's report stops half-way (its header cut short, as from a process stopped mid-send) and
// rank 2 fails: rank 0 reads the reports side by side, so rank 2's reason reaches it at once
// instead of after the report timeout spent waiting on rank 1's missing bytes.
TEST(TcpControl, AHalfSentReportHoldsUpNoOtherRank) {
    constexpr int kWorld = 3;
    const int port = free_port();
    std::string leader_error;
    std::chrono::steady_clock::duration leader_took{};
    std::atomic<bool> half_sent{false}, leader_done{false};
    std::thread leader([&] {
        try {
            auto cp =
                make_tcp_control({0, kWorld, 0}, "127.0.0.1", port, std::chrono::seconds(10), std::chrono::seconds(20));
            cp->broadcast({7});
            const auto t0 = std::chrono::steady_clock::now();
            try {
                cp->gather({});
            } catch (...) {
                leader_took = std::chrono::steady_clock::now() - t0;
                throw;
            }
        } catch (const Error& e) {
            leader_error = e.what();
        }
        leader_done = true;
    });
    // Rank 1 by hand: the rank handshake, then 4 of a report header's 9 bytes, then silence.
    std::thread half([&] {
        const int fd = connect_as_rank(port, 1);
        const uint8_t part[4] = {0, 1, 0, 0};  // kind kData, the size's first bytes
        const bool sent = fd >= 0 && ::send(fd, part, sizeof(part), 0) == ssize_t{sizeof(part)};
        half_sent = true;  // on every path: rank 2 waits for it
        EXPECT_TRUE(sent);
        EXPECT_TRUE(wait_flag(leader_done));
        if (fd >= 0) ::close(fd);
    });
    std::thread failing([&] {
        try {
            auto cp = make_tcp_control({2, kWorld, 2}, "127.0.0.1", port, std::chrono::seconds(10));
            cp->broadcast({});
            EXPECT_TRUE(wait_flag(half_sent));
            // Rank 1's bytes are in rank 0's socket before rank 2's abort is sent: rank 0's polls
            // see rank 1 readable first, or both at once with rank 1 read first.
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
            cp->abort("DP rank 2 of 3 failed: injected");
            EXPECT_TRUE(wait_flag(leader_done));
        } catch (const Error& e) {
            ADD_FAILURE() << "rank 2: " << e.what();
        }
    });
    leader.join();
    half.join();
    failing.join();
    EXPECT_NE(leader_error.find("DP rank 2 of 3 failed: injected"), std::string::npos) << leader_error;
    EXPECT_EQ(leader_error.find("rank 1"), std::string::npos) << leader_error;
    EXPECT_LT(leader_took, std::chrono::seconds(10));
}

// A report that arrives a byte at a time over many polls, then an empty one in two pieces, comes
// out whole and in order; and a report cut off for good is named, with its part, at the timeout.
TEST(TcpControl, AReportInPiecesIsReassembled) {
    const int port = free_port();
    std::vector<std::vector<uint8_t>> first, second;
    std::string timeout_error;
    std::atomic<bool> leader_done{false};
    std::thread leader([&] {
        try {
            auto cp = make_tcp_control({0, 2, 0}, "127.0.0.1", port, std::chrono::seconds(10),
                                       std::chrono::milliseconds(1500));
            cp->broadcast({1});
            first = cp->gather({9});
            cp->broadcast({2});
            second = cp->gather({});
            cp->broadcast({3});
            cp->gather({});  // rank 1 sends 3 bytes of a header and stops
        } catch (const Error& e) {
            timeout_error = e.what();
        }
        leader_done = true;
    });
    // Rank 1 by hand; every check before the join is an EXPECT, so a failure still joins the leader.
    const std::vector<uint8_t> report{'r', 'a', 'n', 'k', ' ', '1', 0, 255};
    [&] {
        const int fd = connect_as_rank(port, 1);
        EXPECT_GE(fd, 0);
        if (fd < 0) return;
        const std::vector<uint8_t> whole = control_frame(report), empty = control_frame({});
        bool sent = true;
        for (const uint8_t b : whole) {
            sent = sent && ::send(fd, &b, 1, 0) == 1;
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        sent = sent && ::send(fd, empty.data(), 5, 0) == 5;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        sent = sent && ::send(fd, empty.data() + 5, empty.size() - 5, 0) == ssize_t(empty.size() - 5);
        sent = sent && ::send(fd, empty.data(), 3, 0) == 3;  // the third report: 3 bytes, then nothing
        EXPECT_TRUE(sent);
        EXPECT_TRUE(wait_flag(leader_done));
        ::close(fd);
    }();
    leader.join();
    ASSERT_EQ(first.size(), 2u);
    EXPECT_EQ(first[0], std::vector<uint8_t>{9});
    EXPECT_EQ(first[1], report);
    ASSERT_EQ(second.size(), 2u);
    EXPECT_TRUE(second[1].empty());
    EXPECT_NE(timeout_error.find("no step report from rank(s) 1 within 1500 ms"), std::string::npos) << timeout_error;
    EXPECT_NE(timeout_error.find("part of the report of rank(s) 1 arrived"), std::string::npos) << timeout_error;
}

// Rank 0's step message to rank 1 stops part-way (rank 1 reads nothing, its socket fills, the send
// times out): rank 0's abort then goes to rank 2, but not after the cut-off frame to rank 1, whose
// reader would take the abort's bytes as the rest of the message — rank 1 sees the message's own
// bytes and then the end of the stream.
TEST(TcpControl, NoFrameFollowsOneCutOffPartWay) {
    constexpr int kWorld = 3;
    constexpr uint8_t kFill = 0xAB;
    // More than the sockets' buffers hold unread (about 4-7 MB on loopback at default sysctls).
    const size_t kMessageBytes = size_t{96} << 20;
    const int port = free_port();
    std::string leader_error, rank2_error;
    std::atomic<bool> leader_done{false};
    std::thread leader([&] {
        try {
            auto cp = make_tcp_control({0, kWorld, 0}, "127.0.0.1", port, std::chrono::seconds(10),
                                       std::chrono::milliseconds(300));
            cp->broadcast(std::vector<uint8_t>(kMessageBytes, kFill));
        } catch (const std::exception& e) {
            leader_error = e.what();
        }
        leader_done = true;
    });
    std::thread rank2([&] {
        try {
            auto cp = make_tcp_control({2, kWorld, 2}, "127.0.0.1", port, std::chrono::seconds(10));
            cp->broadcast({});
        } catch (const std::exception& e) {
            rank2_error = e.what();
        }
    });
    // Rank 1 by hand. Once the message's first bytes are in its socket, rank 0's 300 ms send
    // deadline is running; 1.5 s later rank 0 has timed out and, in the 5 s it allows an abort, an
    // abort sent after the cut-off message (the behaviour this test guards against) would be
    // blocked on this full socket — so draining it now lets such an abort through.
    bool buffered_whole = false;  // the sockets held the whole message: nothing to test here
    size_t header = 0, body = 0, foreign = 0;
    uint8_t head[9] = {};
    [&] {
        const int fd = connect_as_rank(port, 1);
        EXPECT_GE(fd, 0);
        if (fd < 0) return;
        pollfd pf{fd, POLLIN, 0};
        EXPECT_EQ(::poll(&pf, 1, 10000), 1) << "no bytes from rank 0";
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        buffered_whole = leader_done && leader_error.empty();
        std::vector<uint8_t> chunk(1 << 20);
        for (;;) {
            const ssize_t n = ::recv(fd, chunk.data(), chunk.size(), 0);
            if (n <= 0) break;
            for (ssize_t i = 0; i < n; ++i) {
                if (header < sizeof(head)) {
                    head[header++] = chunk[i];
                } else {
                    ++body;
                    foreign += chunk[i] != kFill;
                }
            }
        }
        ::close(fd);
    }();
    leader.join();
    rank2.join();
    if (buffered_whole) GTEST_SKIP() << "this machine's sockets held the whole " << kMessageBytes << "-byte message";
    EXPECT_NE(leader_error.find("the control plane to rank 1"), std::string::npos) << leader_error;
    EXPECT_NE(leader_error.find("timed out sending a step message"), std::string::npos) << leader_error;
    EXPECT_NE(rank2_error.find("the control plane to rank 1"), std::string::npos) << rank2_error;
    ASSERT_EQ(header, sizeof(head));
    EXPECT_EQ(head[0], 0);  // a data frame of the message's size
    uint64_t size = 0;
    std::memcpy(&size, head + 1, sizeof(size));
    EXPECT_EQ(size, kMessageBytes);
    EXPECT_LT(body, kMessageBytes);  // cut off
    EXPECT_EQ(foreign, 0u) << "bytes after the cut-off message's own: another frame followed it";
}

// A rank that neither reports nor fails is named in rank 0's timeout, with the address.
TEST(TcpControl, ASilentRankIsNamedAtTheReportTimeout) {
    const int port = free_port();
    std::string error;
    std::atomic<bool> done{false};
    std::thread leader([&] {
        try {
            auto cp = make_tcp_control({0, 3, 0}, "127.0.0.1", port, std::chrono::seconds(10),
                                       std::chrono::milliseconds(300));
            cp->broadcast({7});
            cp->gather({});
        } catch (const Error& e) {
            error = e.what();
        }
        done = true;
    });
    std::thread reporter([&] {
        auto cp = make_tcp_control({1, 3, 1}, "127.0.0.1", port, std::chrono::seconds(10));
        cp->broadcast({});
        cp->gather({1});
        while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    });
    auto silent = make_tcp_control({2, 3, 2}, "127.0.0.1", port, std::chrono::seconds(10));
    silent->broadcast({});
    leader.join();
    reporter.join();
    EXPECT_NE(error.find("no step report from rank(s) 2 within 300 ms (127.0.0.1:"), std::string::npos) << error;
}

TEST(TcpControl, ARankWhoseConnectionClosesIsNamed) {
    const int port = free_port();
    std::string error;
    std::thread leader([&] {
        try {
            auto cp = make_tcp_control({0, 2, 0}, "127.0.0.1", port, std::chrono::seconds(10));
            cp->broadcast({7});
            cp->gather({});
        } catch (const Error& e) {
            error = e.what();
        }
    });
    {
        auto cp = make_tcp_control({1, 2, 1}, "127.0.0.1", port, std::chrono::seconds(10));
        cp->broadcast({});
    }  // gone without a report
    leader.join();
    EXPECT_NE(error.find("the control plane to rank 1"), std::string::npos) << error;
    const std::string lonely = [&] {
        try {
            make_tcp_control({1, 2, 1}, "127.0.0.1", free_port(), std::chrono::milliseconds(200));
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    }();
    EXPECT_NE(lonely.find("rank 1 found nobody listening"), std::string::npos) << lonely;
}

}  // namespace
}  // namespace fanout::comm

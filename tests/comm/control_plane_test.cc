// The `local` control plane: rank 0's messages reach every rank in order and the reports come
// back by rank, step after step; an idle rank waits without a timeout; abort() wakes every waiter
// with the reason (and runs the hook once); a rank that never reports is a timeout naming it.
#include "fanout/comm/control_plane.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "test_util.h"

namespace fanout::comm {
namespace {

using fanout::testing::error_of;
using ::testing::HasSubstr;

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

TEST(ControlPlaneLocal, MessagesAndReportsTravelInOrderForManySteps) {
    constexpr int kWorld = 4, kSteps = 200;
    LocalControlHub hub(kWorld);
    std::vector<std::thread> threads;
    std::atomic<int> bad{0};
    for (int r = 1; r < kWorld; ++r)
        threads.emplace_back([&, r] {
            auto cp = hub.endpoint(r);
            for (int s = 0; s < kSteps; ++s) {
                if (text(cp->broadcast({})) != "step " + std::to_string(s)) ++bad;
                cp->gather(bytes(std::to_string(r * 1000 + s)));
            }
        });
    auto cp = hub.endpoint(0);
    for (int s = 0; s < kSteps; ++s) {
        EXPECT_EQ(text(cp->broadcast(bytes("step " + std::to_string(s)))), "step " + std::to_string(s));
        const auto reports = cp->gather(bytes("0"));
        ASSERT_EQ(reports.size(), static_cast<size_t>(kWorld));
        for (int r = 1; r < kWorld; ++r) EXPECT_EQ(text(reports[r]), std::to_string(r * 1000 + s)) << "step " << s;
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(bad, 0);
}

TEST(ControlPlaneLocal, AbortWakesIdleRanksWithTheReasonAndRunsTheHookOnce) {
    std::atomic<int> hooks{0};
    LocalControlHub hub(3, std::chrono::minutes(10), [&](const std::string&) { ++hooks; });
    std::vector<std::string> errors(3);
    std::vector<std::thread> threads;
    for (int r = 1; r < 3; ++r)
        threads.emplace_back([&, r] { errors[r] = error_of([&] { hub.endpoint(r)->broadcast({}); }); });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // both idle in broadcast
    hub.endpoint(0)->abort("DP rank 0 of 3 failed: test");
    hub.abort("a second abort changes nothing");
    for (auto& t : threads) t.join();
    for (int r = 1; r < 3; ++r) EXPECT_THAT(errors[r], HasSubstr("DP rank 0 of 3 failed: test"));
    EXPECT_EQ(hooks, 1);
    EXPECT_EQ(hub.abort_reason(), "DP rank 0 of 3 failed: test");
    EXPECT_THAT(error_of([&] { hub.endpoint(0)->gather({}); }), HasSubstr("failed: test"));
}

TEST(ControlPlaneLocal, ARankThatNeverReportsIsATimeoutNamingIt) {
    LocalControlHub hub(3, std::chrono::milliseconds(100));
    std::thread one([&] {
        auto cp = hub.endpoint(1);
        cp->broadcast({});
        cp->gather({});
    });
    std::thread two([&] { hub.endpoint(2)->broadcast({}); });  // takes the message, never reports
    auto cp = hub.endpoint(0);
    cp->broadcast(bytes("go"));
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THAT(error_of([&] { cp->gather({}); }), HasSubstr("rank(s) 2 sent no report for step 1 within 100 ms"));
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    one.join();
    two.join();
}

TEST(ControlPlaneLocal, BadRanksAreRefused) {
    EXPECT_THAT(error_of([] { LocalControlHub(0); }), HasSubstr("world must be >= 1"));
    LocalControlHub hub(2);
    EXPECT_THAT(error_of([&] { hub.endpoint(2); }), HasSubstr("rank 2 outside [0, 2)"));
}

}  // namespace
}  // namespace fanout::comm

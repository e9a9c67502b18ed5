// Data-parallel engine ranks in lockstep (engine/dp_group.h), ranks as threads: requests handed
// to the least-loaded ranks come back exact; every rank runs every step (idle ones empty steps);
// a rank that fails, or never reports, stops the whole group with an error naming it; the tiny
// model split over 4 EP ranks generates what one engine holding every expert generates.
#include "fanout/engine/dp_group.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "engine_test_util.h"
#include "fake_rank_runner.h"
#include "fanout/comm/bootstrap.h"
#include "fanout/kv/prefix_cache.h"
#include "fanout/model/synthetic.h"
#include "test_util.h"

namespace fanout::engine {
namespace {

using fanout::testing::error_of;
using testing::drain;
using testing::expected;
using testing::FakeRankRunner;
using ::testing::HasSubstr;
using testing::request;
using testing::Shared;

std::unique_ptr<DpThreadGroup> fake_group(Shared& shared, int world,
                                          std::chrono::milliseconds timeout = std::chrono::minutes(1),
                                          const std::string& policy = "prefix") {
    EngineConfig cfg;
    cfg.num_kv_blocks = 64;
    cfg.scheduler = {8, 32, 8};
    cfg.lockstep = true;
    cfg.dp_placement.policy = policy;
    std::vector<std::unique_ptr<Engine>> engines;
    for (int r = 0; r < world; ++r)
        engines.push_back(std::make_unique<Engine>(std::make_unique<FakeRankRunner>(shared, r), nullptr, cfg));
    // No EP fabric: the fakes have no experts; the control plane alone keeps them in step.
    return std::make_unique<DpThreadGroup>(std::move(engines), std::vector<std::unique_ptr<comm::LocalFabric>>{},
                                           std::vector<std::unique_ptr<comm::ExpertParallel>>{}, timeout);
}

TEST(DpGroup, SixtyFourRequestsOverFourRanksAreExactAndEveryRankRunsEveryStep) {
    constexpr int kWorld = 4;
    Shared shared(kWorld);
    auto group = fake_group(shared, kWorld);
    DpRank& lead = group->lead();
    // 64 at once: the least-loaded hand-off gives each rank 16. Lengths differ, so ranks run out
    // of work at different steps and then run empty ones while the others finish.
    std::vector<RequestParams> params;
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (int i = 0; i < 64; ++i) {
        params.push_back(request(i, 1 + (i * 7) % 23));
        handles.push_back(lead.submit(params.back()));
    }
    group->start();
    for (size_t i = 0; i < handles.size(); ++i) {
        std::string reason;
        EXPECT_EQ(drain(*handles[i], &reason), expected(params[i].prompt, params[i].max_tokens)) << "request " << i;
        EXPECT_EQ(reason, "length");
    }
    for (int r = 0; r < kWorld; ++r) EXPECT_EQ(group->rank(r).engine().stats().requests_received, 16) << "rank " << r;
    const EngineStats all = lead.stats();
    EXPECT_EQ(all.requests_finished, 64);
    EXPECT_EQ(all.requests_received, 64);

    // Two more, each starting with a KV block a request that ran before left cached (request 2's
    // on rank 2, request 3's on rank 3): the prefix placement sends them there. Ranks 0 and 1 sit
    // idle — and still run every step, empty.
    ASSERT_EQ(request(100, 1).prompt[0], request(2, 1).prompt[0]);
    ASSERT_EQ(request(101, 1).prompt, request(3, 1).prompt);
    const int64_t before = shared.forwards[1];
    auto a = lead.submit(request(100, 12)), b = lead.submit(request(101, 12));
    EXPECT_EQ(drain(*a), expected(request(100, 12).prompt, 12));
    EXPECT_EQ(drain(*b), expected(request(101, 12).prompt, 12));
    EXPECT_EQ(group->rank(0).engine().stats().requests_received, 16);
    EXPECT_EQ(group->rank(1).engine().stats().requests_received, 16);
    EXPECT_GE(shared.forwards[1] - before, 12) << "an idle rank must still step with the group";
    EXPECT_EQ(group->rank(2).engine().stats().requests_received, 17);
    EXPECT_EQ(group->rank(3).engine().stats().requests_received, 17);
    group->stop();
    for (int r = 1; r < kWorld; ++r) EXPECT_EQ(shared.forwards[r].load(), shared.forwards[0].load()) << "rank " << r;
    EXPECT_LE(shared.skew.load(), 1) << "ranks drifted apart: not in lockstep";
    EXPECT_EQ(group->failure(), "");
}

// Rank 0 as the group's router: the ranks' prefix-cache changes reach its index with their step
// reports; a prompt sharing cached blocks goes to the rank holding them and hits its cache; the
// union of the ranks' caches is rank 0's KV event stream (what a router in front of the group
// indexes); round-robin ignores the caches.
TEST(DpGroup, PrefixPlacementFollowsTheRanksCachesAndRankZeroPublishesTheirUnion) {
    constexpr int kWorld = 3;
    Shared shared(kWorld);
    auto group = fake_group(shared, kWorld);
    DpRank& lead = group->lead();
    const auto with_prefix = [](int tail) {  // three blocks of 4 tokens, then one of its own
        RequestParams p = request(0, 2);
        p.prompt = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, static_cast<int32_t>(tail)};
        return p;
    };
    EXPECT_EQ(lead.place(with_prefix(0).prompt).cached_blocks, 0);
    // Two long requests take ranks 0 and 1, so the first prompt with the prefix runs on rank 2
    // (where least-load would not send the later ones).
    auto long0 = lead.submit(request(1, 240)), long1 = lead.submit(request(2, 240));
    auto first = lead.submit(with_prefix(0));
    group->start();
    drain(*first);
    long0->cancel();
    long1->cancel();
    drain(*long0);
    drain(*long1);
    const int holder = 2;
    ASSERT_EQ(group->rank(holder).engine().stats().requests_received, 1);
    const Placer::Choice c = lead.place(with_prefix(30).prompt);  // the step's report carried the cache's change
    EXPECT_EQ(c.target, holder);
    EXPECT_EQ(c.cached_blocks, 3);
    for (int i = 1; i <= 4; ++i) {
        RequestEvent last;
        drain(*lead.submit(with_prefix(30 + i)), nullptr, &last);
        EXPECT_EQ(last.cached_tokens, 12) << "request " << i;
    }
    EXPECT_EQ(group->rank(holder).engine().stats().requests_received, 5) << "least-load would have picked rank 0";
    // The union: every cached block once, whichever ranks hold it.
    const KvEventHub::Batch all = lead.kv_events()->next(0, std::chrono::milliseconds(0));
    ASSERT_EQ(all.changes.size(), 1u);
    const std::vector<int32_t> prompt = with_prefix(31).prompt;
    for (uint64_t h : kv::block_hashes(prompt, 4))
        EXPECT_EQ(std::count(all.changes[0].stored.begin(), all.changes[0].stored.end(), h), 1);
    group->stop();

    Shared rr_shared(kWorld);
    auto rr = fake_group(rr_shared, kWorld, std::chrono::minutes(1), "round-robin");
    rr->start();
    for (int i = 0; i < 6; ++i) drain(*rr->lead().submit(with_prefix(40 + i)));
    for (int r = 0; r < kWorld; ++r) EXPECT_EQ(rr->rank(r).engine().stats().requests_received, 2) << "rank " << r;
    rr->stop();
}

TEST(DpGroup, CancelledAndStoppedRequestsEndWithAbort) {
    Shared shared(2);
    auto group = fake_group(shared, 2);
    auto h = group->lead().submit(request(1, 240));
    group->start();
    RequestEvent ev;
    ASSERT_TRUE(h->next(&ev, std::chrono::seconds(20)));  // running on some rank
    h->cancel();
    std::string reason;
    drain(*h, &reason);
    EXPECT_EQ(reason, "abort");
    auto long_one = group->lead().submit(request(2, 240));
    ASSERT_TRUE(long_one->next(&ev, std::chrono::seconds(20)));
    group->stop();
    drain(*long_one, &reason);
    EXPECT_EQ(reason, "abort");
    EXPECT_THAT(error_of([&] { group->lead().submit(request(3, 4)); }), HasSubstr("shutting down"));
}

TEST(DpGroup, ARankThatThrowsStopsEveryRankWithAnErrorNamingIt) {
    constexpr int kWorld = 4;
    Shared shared(kWorld);
    shared.fail_rank = 2;
    shared.fail_at = 5;
    auto group = fake_group(shared, kWorld);
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (int i = 0; i < 8; ++i) handles.push_back(group->lead().submit(request(i, 50)));
    const auto start = std::chrono::steady_clock::now();
    group->start();
    for (auto& h : handles) {
        std::string reason;
        drain(*h, &reason);
        EXPECT_EQ(reason, "error");
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
    group->stop();  // every thread has ended: this only joins
    EXPECT_THAT(group->failure(), HasSubstr("DP rank 2 of 4 failed: "));
    EXPECT_THAT(group->failure(), HasSubstr("injected failure"));
    for (int r = 0; r < kWorld; ++r) EXPECT_THAT(group->rank(r).failure(), HasSubstr("DP rank 2 of 4 failed"));
    EXPECT_THAT(error_of([&] { group->lead().submit(request(9, 4)); }),
                HasSubstr("the deployment stopped: DP rank 2 of 4 failed"));
}

TEST(DpGroup, ARankThatNeverReportsIsATimeoutNamingIt) {
    Shared shared(3);
    shared.hang_rank = 1;
    shared.fail_at = 3;
    shared.hang_ms = 1500;
    auto group = fake_group(shared, 3, std::chrono::milliseconds(300));
    auto h = group->lead().submit(request(0, 40));
    group->start();
    std::string reason;
    drain(*h, &reason);
    EXPECT_EQ(reason, "error");
    group->stop();
    EXPECT_THAT(group->failure(), HasSubstr("rank(s) 1 sent no report for step 3 within 300 ms"));
}

TEST(DpGroup, EnginesMustStepInLockstep) {
    Shared shared(1);
    EngineConfig cfg;  // lockstep not set
    auto engine = std::make_unique<Engine>(std::make_unique<FakeRankRunner>(shared, 0), nullptr, cfg);
    comm::LocalControlHub hub(1);
    EXPECT_THAT(error_of([&] { DpRank(std::move(engine), hub.endpoint(0)); }), HasSubstr("must step in lockstep"));
}

// The tiny model's routed experts over 4 EP ranks (threads, the local fabric): a dozen requests
// handed out over the ranks generate, greedy, exactly what one engine holding every expert does —
// also with every step as two microbatches (a second fabric), with auto's choice per step (rank 0
// deciding for every rank from their last steps: some steps each way), with MTP drafts, and as two
// DP ranks of TP groups of two (tensor-parallel attention: EP4 = DP2 × TP2).
TEST(DpGroup, TinyModelAtEp4GeneratesWhatEp1Generates) {
    const std::string dir = testing::write_tiny_model("dp_group_model", 1000);
    std::vector<RequestParams> params;
    for (int i = 0; i < 12; ++i) {
        RequestParams p;
        for (int k = 0; k < 5 + i * 3; ++k) p.prompt.push_back((i * 37 + k * 11) % 997);
        p.max_tokens = 4 + i % 5;
        p.ignore_eos = true;
        params.push_back(p);
    }
    EngineConfig cfg;
    cfg.num_kv_blocks = 16;
    cfg.scheduler = {8, 64, 32};
    const auto want = testing::run_engine(
        std::make_unique<DeepseekRunner>(model::DeepseekV3::load(dir), model::ForwardOptions{}, 1), cfg, params);
    using M = EngineConfig::Microbatch;
    struct Mode {
        M microbatch;
        int64_t min_tokens;
        int mtp, tp;
    };
    for (const Mode mode : {Mode{M::kOff, 1, 0, 1}, Mode{M::kOn, 1, 0, 1}, Mode{M::kAuto, 12, 0, 1},
                            Mode{M::kOn, 1, 2, 1}, Mode{M::kOff, 1, 0, 2}, Mode{M::kOn, 1, 2, 2}}) {
        SCOPED_TRACE(fmt::format("microbatch {} (min tokens {}), mtp {}, tp {}", static_cast<int>(mode.microbatch),
                                 mode.min_tokens, mode.mtp, mode.tp));
        EngineConfig c = cfg;
        c.microbatch = mode.microbatch;
        c.microbatch_min_tokens = mode.min_tokens;
        c.mtp_draft_tokens = mode.mtp;
        std::vector<std::unique_ptr<model::DeepseekV3>> models;
        for (int r = 0; r < 4; ++r) models.push_back(model::DeepseekV3::load(dir, ParallelConfig{r, 4, mode.tp}));
        auto group =
            make_cpu_dp_threads(std::move(models), c, model::ForwardOptions{}, 1, DType::kF32, nullptr, mode.tp);
        ASSERT_EQ(group->size(), 4 / mode.tp);  // DP = EP / TP
        std::vector<std::shared_ptr<RequestHandle>> handles;
        for (const auto& p : params) handles.push_back(group->lead().submit(p));
        group->start();
        for (size_t i = 0; i < handles.size(); ++i) EXPECT_EQ(drain(*handles[i]), want[i]) << "request " << i;
        for (int r = 0; r < group->size(); ++r) {
            const EngineStats st = group->rank(r).engine().stats();
            EXPECT_EQ(st.requests_received, 12 / group->size()) << "rank " << r;
            if (mode.microbatch == M::kOff) EXPECT_EQ(st.microbatch_steps, 0) << "rank " << r;
            if (mode.microbatch == M::kOn) EXPECT_EQ(st.microbatch_steps, st.steps) << "rank " << r;
        }
        const EngineStats all = group->lead().stats();
        if (mode.microbatch == M::kAuto) {  // prefill-sized steps on, decode steps off
            EXPECT_GT(all.microbatch_steps, 0);
            EXPECT_LT(all.microbatch_steps, all.steps);
        }
        group->stop();
        EXPECT_EQ(group->failure(), "");
    }
    std::filesystem::remove_all(dir);
}

// Ranks as processes started without MPI (RANK / WORLD_SIZE, Kubernetes-style) talk over the TCP
// control plane; here as threads of one process, each with its own connection: the outputs are
// exact, every rank runs every step, and a rank that throws stops the group naming it.
int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
}

void run_over_tcp(int world, Shared& shared, const std::vector<RequestParams>& params,
                  std::vector<std::vector<int32_t>>* outputs, std::vector<std::string>* reasons,
                  std::vector<std::string>* failures) {
    const int port = free_port();
    EngineConfig cfg;
    cfg.num_kv_blocks = 64;
    cfg.scheduler = {8, 32, 8};
    cfg.lockstep = true;
    std::vector<std::unique_ptr<DpRank>> ranks(static_cast<size_t>(world));
    std::vector<std::thread> threads;
    failures->assign(static_cast<size_t>(world), "");
    for (int r = 0; r < world; ++r)
        threads.emplace_back([&, r] {
            try {
                ranks[r] = std::make_unique<DpRank>(
                    std::make_unique<Engine>(std::make_unique<FakeRankRunner>(shared, r), nullptr, cfg),
                    comm::make_tcp_control({r, world, r}, "127.0.0.1", port, std::chrono::seconds(20),
                                           std::chrono::seconds(20)));
                if (r != 0) return ranks[r]->run();
                std::vector<std::shared_ptr<RequestHandle>> handles;
                for (const auto& p : params) handles.push_back(ranks[0]->submit(p));
                std::thread loop([&] {
                    try {
                        ranks[0]->run();
                    } catch (const std::exception&) {  // kept as the rank's failure
                    }
                });
                for (auto& h : handles) {
                    std::string reason;
                    outputs->push_back(drain(*h, &reason));
                    reasons->push_back(reason);
                }
                ranks[0]->stop();
                loop.join();
                (*failures)[0] = ranks[0]->failure();
            } catch (const std::exception& e) {
                (*failures)[r] = e.what();
            }
        });
    for (auto& t : threads) t.join();
}

TEST(DpGroup, RanksOverTheTcpControlPlane) {
    constexpr int kWorld = 3;
    Shared shared(kWorld);
    std::vector<RequestParams> params;
    for (int i = 0; i < 24; ++i) params.push_back(request(i, 1 + (i * 5) % 13));
    std::vector<std::vector<int32_t>> outputs;
    std::vector<std::string> reasons, failures;
    run_over_tcp(kWorld, shared, params, &outputs, &reasons, &failures);
    ASSERT_EQ(outputs.size(), params.size());
    for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_EQ(outputs[i], expected(params[i].prompt, params[i].max_tokens)) << "request " << i;
        EXPECT_EQ(reasons[i], "length");
    }
    for (int r = 0; r < kWorld; ++r) {
        EXPECT_EQ(failures[r], "") << "rank " << r;
        EXPECT_EQ(shared.forwards[r].load(), shared.forwards[0].load()) << "rank " << r;
    }
}

TEST(DpGroup, ARankThatThrowsOverTcpStopsEveryRankNamingIt) {
    constexpr int kWorld = 3;
    Shared shared(kWorld);
    shared.fail_rank = 1;
    shared.fail_at = 4;
    std::vector<RequestParams> params;
    for (int i = 0; i < 6; ++i) params.push_back(request(i, 30));
    std::vector<std::vector<int32_t>> outputs;
    std::vector<std::string> reasons, failures;
    run_over_tcp(kWorld, shared, params, &outputs, &reasons, &failures);
    for (const auto& reason : reasons) EXPECT_EQ(reason, "error");
    for (int r = 0; r < kWorld; ++r)
        EXPECT_THAT(failures[r], HasSubstr("DP rank 1 of 3 failed: injected failure")) << "rank " << r;
}

}  // namespace
}  // namespace fanout::engine

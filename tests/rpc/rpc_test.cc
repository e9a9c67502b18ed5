// The engine's gRPC service and the router, in one process on localhost, over engines with the
// fake model of tests/engine/fake_rank_runner.h: exact tokens through the service, cancellation,
// refused requests, health / load / KV events; the router's prefix placement following the
// engines' caches, round-robin, and an engine that goes away mid-stream (its requests end
// "unavailable", it leaves the rotation, the next requests go elsewhere, it rejoins).
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "engine/engine_test_util.h"
#include "engine/fake_rank_runner.h"
#include "fanout/engine.grpc.pb.h"
#include "fanout/kv/prefix_cache.h"
#include "fanout/router/router.h"
#include "fanout/rpc/engine_service.h"
#include "test_util.h"

namespace fanout::rpc {
namespace {

using engine::testing::drain;
using engine::testing::expected;
using engine::testing::FakeRankRunner;
using engine::testing::request;
using engine::testing::Shared;
using fanout::testing::error_of;
using ::testing::HasSubstr;

// An engine with the fake model behind the gRPC service on a free port.
struct Node {
    // 1,024 blocks: the fake model's whole context (4096 tokens); fewer make a smaller context.
    // A step takes at least 1 ms, so a 4,000-token request runs at least 4 s: still running while
    // a test acts on it, however fast the machine.
    explicit Node(int port = 0, int64_t kv_blocks = 1024) : shared(1) {
        shared.step_us = 1000;
        engine::EngineConfig cfg;
        cfg.num_kv_blocks = kv_blocks;
        cfg.scheduler = {16, 64, 16};
        eng = std::make_unique<engine::Engine>(std::make_unique<FakeRankRunner>(shared, 0), nullptr, cfg);
        eng->start();
        server = std::make_unique<EngineServer>(*eng, "fake", "127.0.0.1:" + std::to_string(port));
    }
    ~Node() {
        server->shutdown(std::chrono::milliseconds(0));  // as if the process died: calls cut at once
        server.reset();
        eng->stop();
    }
    std::string address() const { return "127.0.0.1:" + std::to_string(server->port()); }
    Shared shared;
    std::unique_ptr<engine::Engine> eng;
    std::unique_ptr<EngineServer> server;
};

TEST(EngineService, StreamsExactTokensCancelsAndRefuses) {
    Node node;
    RemoteEngine remote(node.address());
    const EngineInfo info = remote.health(std::chrono::seconds(5));
    EXPECT_EQ(info.model, "fake");
    EXPECT_EQ(info.vocab_size, FakeRankRunner::kVocab);
    EXPECT_EQ(info.kv_block_size, 4);
    remote.set_info(info);
    std::vector<engine::RequestParams> params;
    std::vector<std::shared_ptr<engine::RequestHandle>> handles;
    for (int i = 0; i < 12; ++i) {
        params.push_back(request(i, 1 + i % 9));
        handles.push_back(remote.submit(params.back()));
    }
    for (size_t i = 0; i < handles.size(); ++i) {
        std::string reason;
        engine::RequestEvent last;
        EXPECT_EQ(drain(*handles[i], &reason, &last), expected(params[i].prompt, params[i].max_tokens)) << i;
        EXPECT_EQ(reason, "length");
        EXPECT_EQ(last.prompt_tokens, static_cast<int64_t>(params[i].prompt.size()));
        EXPECT_EQ(last.completion_tokens, params[i].max_tokens);
    }
    // Cancelled by the caller: the engine ends it.
    auto h = remote.submit(request(1, 4000));
    engine::RequestEvent ev;
    ASSERT_TRUE(h->next(&ev, std::chrono::seconds(10)));
    h->cancel();
    std::string reason;
    drain(*h, &reason);
    EXPECT_EQ(reason, "abort");
    // Refused before sending (the limits Health gave) and by the engine (limits it did not give).
    EXPECT_THAT(error_of([&] { remote.submit(request(2, 1 << 20)); }), HasSubstr("exceeds the context"));
    EngineInfo lying = info;
    lying.max_context = 1 << 30;
    remote.set_info(lying);
    auto refused = remote.submit(request(2, 1 << 20));
    drain(*refused, &reason);
    EXPECT_EQ(reason, "error");
    engine::EngineStats load = remote.load(std::chrono::seconds(5));
    for (int i = 0; i < 100 && load.requests_aborted == 0; ++i) {  // the engine ends it at its next step
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        load = remote.load(std::chrono::seconds(5));
    }
    EXPECT_GE(load.requests_received, 13);
    EXPECT_EQ(load.requests_aborted, 1) << "the cancelled call reached the engine";
    EXPECT_FALSE(remote.abort("no-such-request", std::chrono::seconds(5)));
}

// A gRPC service of a test's own on a free localhost port, shut down when it goes.
struct ServiceOnPort {
    explicit ServiceOnPort(grpc::Service& svc) {
        grpc::ServerBuilder builder;
        builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
        builder.RegisterService(&svc);
        server = builder.BuildAndStart();
        FANOUT_CHECK(server != nullptr && port > 0, "test service: cannot listen on localhost");
    }
    ~ServiceOnPort() { server->Shutdown(); }
    std::string address() const { return "127.0.0.1:" + std::to_string(port); }
    int port = 0;
    std::unique_ptr<grpc::Server> server;
};

// An engine whose Generate sends one finished event, then holds the call open half a second
// before its status.
class SlowToEndEngine final : public Engine::Service {
  public:
    grpc::Status Generate(grpc::ServerContext*, const GenerateRequest*, grpc::ServerWriter<GenerateEvent>* w) override {
        GenerateEvent ev;
        ev.set_finished(true);
        ev.set_finish_reason("length");
        w->Write(ev);
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        return grpc::Status::OK;
    }
};

// A request leaves RemoteEngine::in_flight (the router's load on that engine) with its last event,
// not with its call's end after it: a request sent the moment an answer is complete must not see
// that engine as loaded. (It did: the router's end-to-end test sent a repeated prompt elsewhere,
// its one cached block weighing no more than one request in flight.)
TEST(EngineService, ARequestLeavesTheLoadWithItsLastEvent) {
    SlowToEndEngine svc;
    const ServiceOnPort on(svc);
    RemoteEngine remote(on.address());
    remote.set_info(EngineInfo{"slow", 64, FakeRankRunner::kVocab, 4});
    auto h = remote.submit(request(0, 2));
    std::string reason;
    drain(*h, &reason);
    EXPECT_EQ(reason, "length");
    EXPECT_EQ(remote.in_flight(), 0) << "its call is still open, but the request is over";
    EXPECT_TRUE(remote.close(std::chrono::seconds(5))) << "close waits for the call's end";
}

// An engine whose Generate sends nothing: it holds the call until the client cancels it (or 5 s).
class SilentEngine final : public Engine::Service {
  public:
    grpc::Status Generate(grpc::ServerContext* ctx, const GenerateRequest*,
                          grpc::ServerWriter<GenerateEvent>*) override {
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (!ctx->IsCancelled() && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return grpc::Status::OK;
    }
};

// A client going away with a call its engine never answers: the destructor cancels the call and
// waits for its end, which comes on the client's side at once (a call left running past its
// client made the channel's last release on gRPC's own polling thread), and the caller's handle
// ends "abort".
TEST(EngineService, AClientGoingAwayEndsItsCallsAtOnce) {
    SilentEngine svc;
    const ServiceOnPort on(svc);
    std::shared_ptr<engine::RequestHandle> h;
    const auto t0 = std::chrono::steady_clock::now();
    {
        RemoteEngine remote(on.address());
        remote.set_info(EngineInfo{"silent", 64, FakeRankRunner::kVocab, 4});
        h = remote.submit(request(0, 2));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the call reaches the engine
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3)) << "the engine's 5 s were waited out";
    std::string reason;
    drain(*h, &reason);
    EXPECT_EQ(reason, "abort");
}

// A request id names one running request: a second call with a running request's id is refused
// (before, it took the name over, and the first call to end erased the other's entry, so Abort
// could no longer find it), and the id is free again once its request ends.
TEST(EngineService, ARunningRequestsIdIsNotTakenOver) {
    Node node;
    auto stub = Engine::NewStub(grpc::CreateChannel(node.address(), grpc::InsecureChannelCredentials()));
    const auto make = [](int64_t max_tokens) {
        GenerateRequest req;
        req.set_request_id("dup");
        for (int32_t t : request(1, 4).prompt) req.add_prompt(t);
        req.set_max_tokens(max_tokens);
        req.mutable_sampling()->set_top_p(1.0f);  // greedy (temperature 0)
        req.set_ignore_eos(true);                 // the fake model's tokens reach its EOS
        return req;
    };
    grpc::ClientContext c1;
    auto first = stub->Generate(&c1, make(4000));
    GenerateEvent ev;
    ASSERT_TRUE(first->Read(&ev));  // running
    grpc::ClientContext c2;
    auto second = stub->Generate(&c2, make(2));
    while (second->Read(&ev)) {
    }
    const grpc::Status refused = second->Finish();
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::ALREADY_EXISTS);
    EXPECT_THAT(refused.error_message(), HasSubstr("'dup' is already running"));
    RemoteEngine remote(node.address());
    EXPECT_TRUE(remote.abort("dup", std::chrono::seconds(5)));  // still finds the first
    while (first->Read(&ev)) {
    }
    EXPECT_TRUE(first->Finish().ok());
    // The id is free once the server has finished the first call (its OnDone may trail the
    // status the client read by a moment).
    grpc::Status done;
    int64_t tokens = 0;
    for (int i = 0; i < 100; ++i) {
        grpc::ClientContext c3;
        auto again = stub->Generate(&c3, make(2));
        tokens = 0;
        while (again->Read(&ev)) tokens += ev.tokens_size();
        done = again->Finish();
        if (done.error_code() != grpc::StatusCode::ALREADY_EXISTS) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(done.ok()) << done.error_message();
    EXPECT_EQ(tokens, 2);
}

TEST(EngineService, KvEventsCarryTheBlocksThePromptFilled) {
    Node node;
    RemoteEngine remote(node.address());
    remote.set_info(remote.health(std::chrono::seconds(5)));
    std::mutex m;
    std::vector<uint64_t> seen;
    bool reset = false;
    remote.watch_kv_events(
        [&](bool r, const std::vector<uint64_t>& stored, const std::vector<uint64_t>&) {
            std::lock_guard lock(m);
            reset = reset || r;
            seen.insert(seen.end(), stored.begin(), stored.end());
        },
        {});
    engine::RequestParams p = request(3, 2);
    p.prompt.assign(13, 5);  // 3 full blocks of 4
    for (int i = 0; i < 13; ++i) p.prompt[i] = i + 1;
    drain(*remote.submit(p));
    const auto want = kv::block_hashes(p.prompt, 4);
    for (int i = 0; i < 100; ++i) {
        {
            std::lock_guard lock(m);
            if (std::all_of(want.begin(), want.end(),
                            [&](uint64_t h) { return std::find(seen.begin(), seen.end(), h) != seen.end(); }))
                break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    remote.stop_kv_events();
    std::lock_guard lock(m);
    EXPECT_TRUE(reset) << "a subscription starts with a reset";
    for (uint64_t h : want) EXPECT_NE(std::find(seen.begin(), seen.end(), h), seen.end());
}

std::vector<int32_t> prompt_with_prefix(int prefix_seed, int tail, int blocks = 6) {
    std::vector<int32_t> p;
    for (int i = 0; i < blocks * 4; ++i) p.push_back((prefix_seed * 7 + i * 3) % 49);
    p.push_back(tail % 49);
    return p;
}

TEST(Router, PrefixPlacementFollowsTheEnginesCaches) {
    Node a, b;
    router::RouterConfig cfg;
    cfg.health_interval = std::chrono::milliseconds(50);
    router::Router r({a.address(), b.address()}, cfg);
    r.start();
    for (int i = 0; i < 100 && !(r.healthy(0) && r.healthy(1)); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    engine::RequestParams p = request(0, 2);
    p.prompt = prompt_with_prefix(1, 0);
    drain(*r.submit(p));
    // Wait for the KV events of the engine that ran it to reach the index (until then the
    // placement counts its blocks as pending there, for a while).
    int holder = -1;
    for (int i = 0; i < 100 && holder < 0; ++i) {
        for (int e = 0; e < r.num_engines(); ++e)
            if (r.indexed_blocks(e) >= 6) holder = e;
        if (holder < 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_GE(holder, 0) << "no engine's index holds the prompt's blocks";
    const engine::Placer::Choice again = r.place(prompt_with_prefix(1, 9));
    EXPECT_EQ(again.cached_blocks, 6) << "the prompt's 6 blocks are cached on the engine that ran it";
    EXPECT_EQ(again.target, holder);
    EXPECT_EQ(r.indexed_blocks(holder), 6);
    // Requests sharing the prefix go there and hit the cache.
    for (int i = 0; i < 4; ++i) {
        engine::RequestParams q = request(0, 2);
        q.prompt = prompt_with_prefix(1, 10 + i);
        engine::RequestEvent last;
        drain(*r.submit(q), nullptr, &last);
        EXPECT_EQ(last.cached_tokens, 24) << "request " << i;
    }
    // Another prefix is cached nowhere: no preference from the cache.
    EXPECT_EQ(r.place(prompt_with_prefix(2, 0)).cached_blocks, 0);
    r.stop();
}

TEST(Router, RoundRobinAlternatesAndAnEngineThatGoesAwayLeavesAndRejoins) {
    auto a = std::make_unique<Node>();
    Node b;
    const int port_a = a->server->port();
    router::RouterConfig cfg;
    cfg.placement.policy = "round-robin";
    cfg.health_interval = std::chrono::milliseconds(50);
    cfg.health_timeout = std::chrono::milliseconds(200);
    router::Router r({a->address(), b.address()}, cfg);
    r.start();
    for (int i = 0; i < 100 && !(r.healthy(0) && r.healthy(1)); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_TRUE(r.healthy(0) && r.healthy(1));
    for (int i = 0; i < 6; ++i) drain(*r.submit(request(i, 2)));
    EXPECT_EQ(a->eng->stats().requests_received, 3);
    EXPECT_EQ(b.eng->stats().requests_received, 3);

    // A long request on a, then a goes away: the request ends "unavailable", a leaves the
    // rotation within a second, new requests run on b.
    std::shared_ptr<engine::RequestHandle> on_a;
    for (int i = 0; i < 2 && !on_a; ++i) {  // round-robin: one of the next two lands on a
        const int64_t before = a->eng->stats().requests_received;
        auto h = r.submit(request(7, 4000));
        engine::RequestEvent ev;
        ASSERT_TRUE(h->next(&ev, std::chrono::seconds(10)));  // running somewhere
        if (a->eng->stats().requests_received > before)
            on_a = h;
        else
            h->cancel();
    }
    ASSERT_TRUE(on_a);
    const auto t0 = std::chrono::steady_clock::now();
    a.reset();  // the engine process is gone
    std::string reason;
    drain(*on_a, &reason);
    EXPECT_EQ(reason, "unavailable");
    while (r.healthy(0) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5))
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_FALSE(r.healthy(0));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
    for (int i = 0; i < 4; ++i) {
        std::string why;
        EXPECT_EQ(drain(*r.submit(request(20 + i, 3)), &why), expected(request(20 + i, 3).prompt, 3));
        EXPECT_EQ(why, "length");
    }
    // Back on the same address: in rotation again.
    a = std::make_unique<Node>(port_a);
    for (int i = 0; i < 250 && !r.healthy(0); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_TRUE(r.healthy(0));
    r.stop();
}

// Engines whose caches differ (each GPU's memory left): the router takes requests up to the
// smallest context, so a request it takes fits wherever it lands; before, it took them up to the
// first engine's and the smaller engine refused half of them.
TEST(Router, TheSmallestEngineContextBoundsRequests) {
    Node a, b(0, 256);  // contexts 4,096 and 1,024
    router::RouterConfig cfg;
    cfg.placement.policy = "round-robin";
    cfg.health_interval = std::chrono::milliseconds(50);
    router::Router r({a.address(), b.address()}, cfg);
    r.start();
    for (int i = 0; i < 100 && !(r.healthy(0) && r.healthy(1)); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_TRUE(r.healthy(0) && r.healthy(1));
    EXPECT_EQ(r.max_context(), 1024);
    EXPECT_THAT(error_of([&] { r.submit(request(1, 2000)); }), HasSubstr("exceeds the context"));
    for (int i = 0; i < 4; ++i) {
        std::string why;
        EXPECT_EQ(drain(*r.submit(request(10 + i, 500)), &why), expected(request(10 + i, 500).prompt, 500));
        EXPECT_EQ(why, "length");
    }
    EXPECT_EQ(a.eng->stats().requests_received, 2);
    EXPECT_EQ(b.eng->stats().requests_received, 2);
    r.stop();
}

// A router that goes away with a request still running (a drain that timed out) ends it "abort"
// for its caller: no call outlives the client it reports to.
TEST(Router, ARequestStillRunningWhenTheRouterGoesEndsAborted) {
    Node a;
    std::shared_ptr<engine::RequestHandle> h;
    {
        router::Router r({a.address()}, {});
        r.start();
        h = r.submit(request(3, 4000));
        engine::RequestEvent ev;
        ASSERT_TRUE(h->next(&ev, std::chrono::seconds(10)));  // running
        EXPECT_FALSE(r.drain(std::chrono::milliseconds(50)));
    }
    std::string reason;
    drain(*h, &reason);
    EXPECT_EQ(reason, "abort");
}

// A caller may cancel from inside its event notification, on the thread that pushed the event (an
// HTTP connection whose last reference the notification held does, from its destructor): the
// relay pushes outside its lock, so the cancel reaches the engine (pushed under a plain lock, the
// cancel would wait for that lock on its own thread, forever), and the caller still gets its
// request's end, "abort" (before this test, the relay went with the cancel and that end with it).
// The notification is installed after submit() returns, so an event already waiting runs it on
// this thread instead: the test sends requests until one cancel came from another thread.
TEST(Router, ACallerCancellingInItsEventNotificationEndsTheRequest) {
    Node a;
    router::Router r({a.address()}, {});
    r.start();
    const std::thread::id here = std::this_thread::get_id();
    bool elsewhere = false;
    int sent = 0;
    for (; sent < 5 && !elsewhere; ++sent) {
        std::shared_ptr<engine::RequestHandle> h = r.submit(request(3, 4000));
        // Shared with the notification, which may still be running when drain() has the end.
        auto from_another = std::make_shared<std::atomic<bool>>(false);
        h->on_event([raw = h.get(), from_another, here] {
            if (std::this_thread::get_id() != here) *from_another = true;
            raw->cancel();
        });
        std::string reason;
        drain(*h, &reason, nullptr, std::chrono::seconds(10));
        EXPECT_EQ(reason, "abort");
        h->on_event(nullptr);
        elsewhere = *from_another;
    }
    EXPECT_TRUE(elsewhere) << "no cancel of " << sent << " came from the pushing thread";
    engine::EngineStats load = a.eng->stats();
    for (int i = 0; i < 100 && load.requests_aborted < sent; ++i) {  // the engine ends each at its next step
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        load = a.eng->stats();
    }
    EXPECT_EQ(load.requests_aborted, sent) << "each cancel reached the engine";
}

TEST(Router, NoHealthyEngineIsA503AndBadConfigsAreRefused) {
    EXPECT_THAT(error_of([] { router::Router({}, {}); }), HasSubstr("no engines"));
    router::RouterConfig bad;
    bad.placement.policy = "random";
    EXPECT_THAT(error_of([&] { router::Router({"127.0.0.1:1"}, bad); }), HasSubstr("policy 'random'"));
    router::Router r({"127.0.0.1:1"}, {});
    EXPECT_THAT(error_of([&] { r.start(std::chrono::milliseconds(300)); }), HasSubstr("no engine answered"));
}

}  // namespace
}  // namespace fanout::rpc

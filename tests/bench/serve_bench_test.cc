// `fanout bench serve` against FakeOpenAIServer, whose timetable is known: each request's first
// text chunk comes 20 ms after its headers and the rest 5 ms apart. The bounds are loose (a busy
// CI machine only makes things slower) but tight enough to catch a wrong clock: a TTFT that
// counted the empty role chunk would be ~0 ms, an ITL that counted split events ~0 ms.
#include "serve_bench.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "fake_openai_server.h"
#include "fanout/core/error.h"

namespace fanout::bench {
namespace {

using nlohmann::json;
using testing::FakeOpenAIServer;
using testing::FakeServerOptions;

struct BenchRun {
    int rc = -1;
    json report;
};

BenchRun run_bench(ServeBenchOptions o) {
    o.json_out = ::testing::TempDir() + "serve_bench_" + std::to_string(::getpid()) + "_" +
                 ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".json";
    BenchRun run;
    run.rc = run_serve_bench(o);
    std::ifstream in(o.json_out);
    EXPECT_TRUE(in.good()) << o.json_out;
    run.report = json::parse(in);
    in.close();
    std::remove(o.json_out.c_str());
    return run;
}

// Checks every successful request against the fake's timetable: max_tokens text chunks, the first
// >= 20 ms after the send, 5 ms apart.
void expect_timing_consistent(const json& r) {
    EXPECT_GE(r["ttft_ms"]["p50"].get<double>(), 20.0);
    EXPECT_LT(r["ttft_ms"]["p50"].get<double>(), 250.0);
    EXPECT_GT(r["itl_ms"]["p50"].get<double>(), 3.0);
    EXPECT_LT(r["itl_ms"]["p50"].get<double>(), 30.0);
    EXPECT_GT(r["tpot_ms"]["mean"].get<double>(), 3.0);
    EXPECT_LT(r["tpot_ms"]["mean"].get<double>(), 30.0);
    for (const json& q : r["requests"]) {
        if (!q["ok"].get<bool>()) continue;
        const int n = q["max_tokens"].get<int>();
        EXPECT_EQ(q["completion_tokens"].get<int>(), n);
        EXPECT_EQ(q["text_chunks"].get<int>(), n);
        EXPECT_GE(q["ttft_ms"].get<double>(), 20.0);
        EXPECT_GE(q["e2e_ms"].get<double>(), 20.0 + 5.0 * (n - 1) - 1.0);  // sleeps may round down a little
    }
}

TEST(ServeBench, FixedConcurrencyChat) {
    FakeOpenAIServer server;
    ServeBenchOptions o;
    o.base_url = server.base_url() + "/v1/";  // OpenAI-SDK style; "" model asks /v1/models
    o.num_requests = 16;
    o.max_concurrency = 4;
    o.prompt_len = 24;
    o.output_len = 10;
    o.slo_ttft_ms = 10000;
    o.slo_tpot_ms = 10000;
    const BenchRun run = run_bench(o);
    const json& r = run.report;
    EXPECT_EQ(run.rc, 0);
    EXPECT_EQ(r["requests_ok"].get<int>(), 16);
    EXPECT_EQ(r["requests_failed"].get<int>(), 0);
    EXPECT_EQ(r["total_output_tokens"].get<int>(), 160);
    EXPECT_EQ(r["total_prompt_tokens"].get<int>(), 16 * 24);
    expect_timing_consistent(r);
    // 4 waves of 4 requests, each >= 20 + 9 * 5 ms.
    EXPECT_GE(r["duration_s"].get<double>(), 4 * 0.064);
    EXPECT_LE(server.max_in_flight(), 4);
    EXPECT_GE(server.max_in_flight(), 2);
    EXPECT_DOUBLE_EQ(r["goodput"].get<double>(), r["request_throughput"].get<double>());
    EXPECT_NEAR(r["output_throughput"].get<double>(), 160 / r["duration_s"].get<double>(), 1e-6);

    const std::vector<json> bodies = server.requests();
    ASSERT_EQ(bodies.size(), 16u);
    for (const json& b : bodies) {
        EXPECT_EQ(b["model"], FakeOpenAIServer::kModel);
        EXPECT_EQ(b["max_tokens"], 10);
        EXPECT_EQ(b["stream"], true);
        EXPECT_EQ(b["stream_options"]["include_usage"], true);
        EXPECT_EQ(b["ignore_eos"], true);
        ASSERT_EQ(b["messages"].size(), 1u);
        EXPECT_EQ(b["messages"][0]["role"], "user");
    }
}

TEST(ServeBench, UnlimitedConcurrencyBurst) {
    FakeOpenAIServer server;
    ServeBenchOptions o;
    o.base_url = server.base_url();
    o.num_requests = 64;
    o.output_len = 5;
    const BenchRun run = run_bench(o);
    const json& r = run.report;
    EXPECT_EQ(run.rc, 0);
    EXPECT_EQ(r["requests_ok"].get<int>(), 64);
    expect_timing_consistent(r);
    // All 64 at once: no request waits for another (a lost SYN would add a 1 s retransmit).
    EXPECT_GE(server.max_in_flight(), 16);
    EXPECT_LT(r["ttft_ms"]["p99"].get<double>(), 500.0);
    EXPECT_LT(r["duration_s"].get<double>(), 1.0);
}

TEST(ServeBench, PoissonCompletionsWithLengthRanges) {
    FakeOpenAIServer server;
    ServeBenchOptions o;
    o.base_url = server.base_url();
    o.model = FakeOpenAIServer::kModel;
    o.endpoint = "completions";
    o.num_requests = 20;
    o.request_rate = 50;
    o.prompt_len = 32;
    o.prompt_len_range = 8;
    o.output_len = 8;
    o.output_len_range = 3;
    o.seed = 7;
    o.slo_ttft_ms = 1;  // nobody meets it: TTFT >= 20 ms
    const BenchRun run = run_bench(o);
    const json& r = run.report;
    EXPECT_EQ(run.rc, 0);
    EXPECT_EQ(r["requests_ok"].get<int>(), 20);
    expect_timing_consistent(r);
    EXPECT_EQ(r["goodput"].get<double>(), 0.0);
    std::set<int> output_lens;
    int total_output = 0;
    for (const json& q : r["requests"]) {
        EXPECT_GE(q["max_tokens"].get<int>(), 5);
        EXPECT_LE(q["max_tokens"].get<int>(), 11);
        EXPECT_GE(q["prompt_tokens"].get<int>(), 24);
        EXPECT_LE(q["prompt_tokens"].get<int>(), 40);
        EXPECT_EQ(q["prompt_tokens"].get<int>(), q["prompt_words"].get<int>());
        output_lens.insert(q["max_tokens"].get<int>());
        total_output += q["max_tokens"].get<int>();
    }
    EXPECT_GE(output_lens.size(), 3u);
    EXPECT_EQ(r["total_output_tokens"].get<int>(), total_output);
    // 19 exponential gaps of mean 20 ms: well above 0.1 s unless arrivals were not spread at all.
    const double last_start = r["requests"][19]["start_ms"].get<double>();
    EXPECT_GT(last_start, 100.0);
    EXPECT_LT(last_start, 2000.0);
    for (const json& b : server.requests()) {
        EXPECT_TRUE(b["prompt"].is_string());
        EXPECT_FALSE(b.contains("messages"));
    }
}

TEST(ServeBench, PrefixGroupsShareTheirPrefix) {
    FakeOpenAIServer server;
    ServeBenchOptions o;
    o.base_url = server.base_url();
    o.num_requests = 12;
    o.max_concurrency = 1;  // in order, so the fake's prefix cache is deterministic
    o.prefix_groups = 2;
    o.prefix_len = 64;
    o.prompt_len = 16;
    o.output_len = 3;
    const BenchRun run = run_bench(o);
    const json& r = run.report;
    EXPECT_EQ(run.rc, 0);
    EXPECT_EQ(r["requests_ok"].get<int>(), 12);
    EXPECT_EQ(r["cached_tokens_reported"].get<int>(), 12);
    // The first request of each group finds nothing (up to a chance shared word or two), the
    // other 10 their group's 64-word prefix.
    const json& q = r["requests"];
    EXPECT_LT(q[0]["cached_tokens"].get<int>(), 4);
    EXPECT_LT(q[1]["cached_tokens"].get<int>(), 4);
    for (int i = 2; i < 12; ++i) {
        EXPECT_GE(q[i]["cached_tokens"].get<int>(), 64) << i;
        EXPECT_LT(q[i]["cached_tokens"].get<int>(), 70) << i;
        EXPECT_EQ(q[i]["prefix_group"].get<int>(), i % 2);
        EXPECT_EQ(q[i]["prompt_tokens"].get<int>(), 80);
    }
    EXPECT_GE(r["mean_cached_tokens"].get<double>(), 64.0 * 10 / 12);
    EXPECT_NEAR(r["cache_hit_rate"].get<double>(), r["mean_cached_tokens"].get<double>() / 80, 1e-9);

    // Same seed, same prompts: a second run's prompts are all fully cached.
    FakeOpenAIServer again;
    o.base_url = again.base_url();
    run_bench(o);
    const std::vector<json> first = server.requests(), second = again.requests();
    ASSERT_EQ(first.size(), second.size());
    for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(first[i]["messages"], second[i]["messages"]) << i;
}

TEST(ServeBench, CountsFailedRequests) {
    FakeServerOptions f;
    f.fail_every = 4;  // the 4th, 8th, ... request received gets HTTP 500
    FakeOpenAIServer server(f);
    ServeBenchOptions o;
    o.base_url = server.base_url();
    o.num_requests = 20;
    o.max_concurrency = 8;
    o.output_len = 4;
    const BenchRun run = run_bench(o);
    const json& r = run.report;
    EXPECT_EQ(run.rc, 1);
    EXPECT_EQ(r["requests_ok"].get<int>(), 15);
    EXPECT_EQ(r["requests_failed"].get<int>(), 5);
    EXPECT_NE(r["first_error"].get<std::string>().find("HTTP 500"), std::string::npos) << r["first_error"];
    EXPECT_NE(r["first_error"].get<std::string>().find("injected failure"), std::string::npos) << r["first_error"];
    EXPECT_EQ(r["total_output_tokens"].get<int>(), 15 * 4);
    expect_timing_consistent(r);
}

TEST(ServeBench, TimesOutSlowRequests) {
    FakeServerOptions f;
    f.ttft_ms = 400;
    FakeOpenAIServer server(f);
    ServeBenchOptions o;
    o.base_url = server.base_url();
    o.num_requests = 2;
    o.output_len = 2;
    o.timeout_s = 0.1;
    const BenchRun run = run_bench(o);
    EXPECT_EQ(run.rc, 1);
    EXPECT_EQ(run.report["requests_failed"].get<int>(), 2);
    EXPECT_NE(run.report["first_error"].get<std::string>().find("timeout"), std::string::npos)
        << run.report["first_error"];
    for (const json& q : run.report["requests"]) EXPECT_LT(q["e2e_ms"].get<double>(), 350.0);
}

TEST(ServeBench, CountsChunksWithoutUsage) {
    FakeServerOptions f;
    f.send_usage = false;
    FakeOpenAIServer server(f);
    ServeBenchOptions o;
    o.base_url = server.base_url();
    o.num_requests = 4;
    o.output_len = 6;
    const BenchRun run = run_bench(o);
    const json& r = run.report;
    EXPECT_EQ(run.rc, 0);
    EXPECT_EQ(r["total_output_tokens"].get<int>(), 24);
    EXPECT_EQ(r["requests_without_usage"].get<int>(), 4);
    EXPECT_EQ(r["cached_tokens_reported"].get<int>(), 0);
    EXPECT_EQ(r["total_prompt_tokens"].get<int>(), 0);
}

TEST(ServeBench, ServerDownOrBadOptionsThrow) {
    ServeBenchOptions o;
    o.base_url = "http://127.0.0.1:1";  // nothing listens on port 1
    o.timeout_s = 1;
    EXPECT_THROW(run_serve_bench(o), fanout::Error);
    o.base_url = "https://127.0.0.1:8000";
    EXPECT_THROW(run_serve_bench(o), fanout::Error);
    o.base_url = "http://127.0.0.1:8000";
    o.endpoint = "embeddings";
    EXPECT_THROW(run_serve_bench(o), fanout::Error);
}

TEST(ServeBench, ConnectionRefusedIsAFailedRequest) {
    ServeBenchOptions o;
    o.base_url = "http://127.0.0.1:1";
    o.model = "m";  // skips /v1/models, so every request meets the closed port
    o.num_requests = 3;
    o.timeout_s = 1;
    const BenchRun run = run_bench(o);
    EXPECT_EQ(run.rc, 1);
    EXPECT_EQ(run.report["requests_failed"].get<int>(), 3);
    EXPECT_NE(run.report["first_error"].get<std::string>().find("Connection"), std::string::npos)
        << run.report["first_error"];
}

}  // namespace
}  // namespace fanout::bench

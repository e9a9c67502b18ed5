// `fanout bench serve` against FakeOpenAIServer, whose timetable is known: each request's first
// text chunk comes 20 ms after its headers and the rest 5 ms apart. The bounds are loose (a busy
// CI machine only makes things slower) but tight enough to catch a wrong clock: a TTFT that
// counted the empty role chunk would be ~0 ms, an ITL that counted split events ~0 ms.
#include "serve_bench.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "fake_openai_server.h"
#include "fanout/core/error.h"
#include "serve_soak.h"

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
    // Sizes no load test needs are refused by name before anything is built (before: bad_alloc,
    // or a NaN SLO that counted nothing).
    const auto refused = [](auto set, const char* want) {
        ServeBenchOptions b;
        set(b);
        try {
            run_serve_bench(b);
            ADD_FAILURE() << "accepted; expected '" << want << "'";
        } catch (const fanout::Error& e) {
            EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
        }
    };
    refused([](ServeBenchOptions& b) { b.prompt_len = 2147483647; }, "prompt_len=2147483647 must be in 1..");
    refused([](ServeBenchOptions& b) { b.num_requests = b.turns = 2147483647; }, "num_requests=2147483647");
    refused(
        [](ServeBenchOptions& b) {
            b.num_requests = b.turns = 65536;
            b.prompt_len = 256;
        },
        "prompt words in all, past");
    refused([](ServeBenchOptions& b) { b.slo_ttft_ms = std::nan(""); }, "must be finite");
    EXPECT_THROW(parse_request_mix("streamed=1e308,plain=1e308"), fanout::Error);
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

TEST(ServeBench, ParsesTheMix) {
    const RequestMix m = parse_request_mix("streamed=5,plain=2,cancelled=2,malformed=1");
    EXPECT_EQ(m.streamed, 5);
    EXPECT_EQ(m.plain, 2);
    EXPECT_EQ(m.cancelled, 2);
    EXPECT_EQ(m.malformed, 1);
    EXPECT_FALSE(m.only_streamed());
    const RequestMix p = parse_request_mix("plain=0.5");
    EXPECT_EQ(p.streamed, 0);
    EXPECT_EQ(p.plain, 0.5);
    EXPECT_TRUE(parse_request_mix("streamed=3").only_streamed());
    for (const char* bad : {"", "streamed", "streamed=", "streamed=x", "streamed=-1", "streamed=1,", "bogus=1",
                            "streamed=1,streamed=2", "streamed=0,plain=0", "streamed=inf", "streamed=1 "}) {
        EXPECT_THROW(parse_request_mix(bad), fanout::Error) << bad;
    }
}

// Wait (a little) for the fake to notice the streams its clients closed.
int wait_for_cut_streams(const FakeOpenAIServer& server, int want) {
    for (int i = 0; i < 200 && server.cut_streams() < want; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return server.cut_streams();
}

TEST(ServeBench, MixedKindsAreCountedPerKind) {
    FakeOpenAIServer server;
    ServeBenchOptions o;
    o.base_url = server.base_url();
    o.num_requests = 50;
    o.max_concurrency = 8;
    o.prompt_len = 16;
    o.output_len = 6;
    o.mix = parse_request_mix("streamed=4,plain=2,cancelled=2,malformed=2");
    const BenchRun run = run_bench(o);
    const json& r = run.report;
    EXPECT_EQ(run.rc, 0) << r["first_error"];
    EXPECT_EQ(r["requests_ok"].get<int>(), 50);
    EXPECT_EQ(r["requests_failed"].get<int>(), 0);
    EXPECT_EQ(r["options"]["mix"], "streamed=4,plain=2,cancelled=2,malformed=2");
    // Exact counts: 20 / 10 / 10 / 10.
    const json& k = r["by_kind"];
    ASSERT_EQ(k.size(), 4u);
    EXPECT_EQ(k["streamed"]["count"].get<int>(), 20);
    EXPECT_EQ(k["plain"]["count"].get<int>(), 10);
    EXPECT_EQ(k["cancelled"]["count"].get<int>(), 10);
    EXPECT_EQ(k["malformed"]["count"].get<int>(), 10);
    for (const char* kind : {"streamed", "plain", "cancelled", "malformed"}) {
        EXPECT_EQ(k[kind]["failed"].get<int>(), 0) << kind << ": " << k[kind]["first_error"];
        EXPECT_EQ(k[kind]["ok"], k[kind]["count"]) << kind;
    }
    // Latencies of the normal kinds against the fake's timetable (20 ms, then 5 ms per token).
    EXPECT_EQ(k["streamed"]["ttft_ms"]["count"].get<int>(), 20);
    EXPECT_GE(k["streamed"]["ttft_ms"]["p50"].get<double>(), 20.0);
    EXPECT_GE(k["streamed"]["e2e_ms"]["p50"].get<double>(), 20.0 + 5 * 5 - 1);
    EXPECT_EQ(k["plain"]["e2e_ms"]["count"].get<int>(), 10);
    EXPECT_GE(k["plain"]["e2e_ms"]["p50"].get<double>(), 20.0 + 5 * 5 - 1);
    EXPECT_LT(k["plain"]["e2e_ms"]["p50"].get<double>(), 500.0);
    EXPECT_FALSE(k["plain"].contains("ttft_ms"));
    // Cancelled: gone after the first chunk, long before the stream would have ended.
    EXPECT_GE(k["cancelled"]["ttft_ms"]["p50"].get<double>(), 20.0);
    EXPECT_LT(k["cancelled"]["e2e_ms"]["p99"].get<double>(), k["streamed"]["e2e_ms"]["p50"].get<double>() + 100);
    // Malformed: every variant twice, each refused with a 400 and OpenAI's error shape.
    for (const char* v : {"invalid_json", "wrong_type", "unknown_field", "deep_nesting", "nul_byte"}) {
        EXPECT_EQ(k["malformed"]["variants"][v]["count"].get<int>(), 2) << v;
        EXPECT_EQ(k["malformed"]["variants"][v]["failed"].get<int>(), 0) << v;
    }
    EXPECT_EQ(k["malformed"]["statuses"], json({{"400", 10}}));
    EXPECT_EQ(server.refused(), 10);
    // The top-level figures: streamed latencies, tokens of streamed and plain requests.
    EXPECT_EQ(r["ttft_ms"]["count"].get<int>(), 20);
    EXPECT_EQ(r["e2e_ms"]["count"].get<int>(), 20);
    EXPECT_EQ(r["total_output_tokens"].get<int>(), 30 * 6);
    EXPECT_EQ(r["total_prompt_tokens"].get<int>(), 30 * 16);
    std::map<std::string, int> per_kind;
    for (const json& q : r["requests"]) {
        const std::string kind = q["kind"].get<std::string>();
        ++per_kind[kind];
        if (kind == "cancelled") {
            EXPECT_EQ(q["text_chunks"].get<int>(), 1);
            EXPECT_EQ(q["completion_tokens"].get<int>(), -1);
            EXPECT_EQ(q["status"].get<int>(), 200);
        }
        if (kind == "plain") {
            EXPECT_EQ(q["completion_tokens"].get<int>(), 6);
            EXPECT_EQ(q["status"].get<int>(), 200);
        }
        if (kind == "malformed") {
            EXPECT_EQ(q["status"].get<int>(), 400);
        }
    }
    EXPECT_EQ(per_kind,
              (std::map<std::string, int>{{"streamed", 20}, {"plain", 10}, {"cancelled", 10}, {"malformed", 10}}));
    // What the fake received: 40 valid bodies, plain ones with stream false; the 10 cancelled streams cut.
    const std::vector<json> bodies = server.requests();
    ASSERT_EQ(bodies.size(), 40u);
    int plain = 0;
    for (const json& b : bodies) {
        plain += b["stream"] == false;
        EXPECT_EQ(b.contains("stream_options"), b["stream"] == true);
    }
    EXPECT_EQ(plain, 10);
    EXPECT_EQ(wait_for_cut_streams(server, 10), 10);
}

TEST(ServeBench, MixIsDecidedByTheSeed) {
    ServeBenchOptions o;
    o.num_requests = 20;
    o.max_concurrency = 1;
    o.output_len = 2;
    o.prompt_len = 8;
    o.seed = 3;
    o.mix = parse_request_mix("streamed=1,plain=1");
    std::vector<std::string> kinds[2];
    std::vector<json> prompts[2];
    for (int pass = 0; pass < 2; ++pass) {
        FakeOpenAIServer server;
        o.base_url = server.base_url();
        const BenchRun run = run_bench(o);
        EXPECT_EQ(run.rc, 0);
        for (const json& q : run.report["requests"]) kinds[pass].push_back(q["kind"]);
        for (const json& b : server.requests()) prompts[pass].push_back(b["messages"]);
    }
    EXPECT_EQ(kinds[0], kinds[1]);
    EXPECT_EQ(std::count(kinds[0].begin(), kinds[0].end(), "plain"), 10);
    EXPECT_NE(std::vector<std::string>(kinds[0].begin(), kinds[0].begin() + 10),
              std::vector<std::string>(10, "streamed"));  // shuffled, not in blocks
    EXPECT_EQ(prompts[0], prompts[1]);
    // The prompts are those of a run without the mix.
    FakeOpenAIServer server;
    o.base_url = server.base_url();
    o.mix = RequestMix{};
    run_bench(o);
    std::vector<json> streamed_only;
    for (const json& b : server.requests()) streamed_only.push_back(b["messages"]);
    EXPECT_EQ(streamed_only, prompts[0]);
}

TEST(ServeBench, MalformedBodiesNotRefusedProperlyFail) {
    for (const bool shaped : {true, false}) {
        FakeServerOptions f;
        f.malformed_status = shaped ? 500 : 400;  // a 5xx, or a 400 in the wrong shape
        f.malformed_error_shape = shaped;
        FakeOpenAIServer server(f);
        ServeBenchOptions o;
        o.base_url = server.base_url();
        o.num_requests = 12;
        o.max_concurrency = 4;
        o.output_len = 3;
        o.mix = parse_request_mix("streamed=1,malformed=1");
        const BenchRun run = run_bench(o);
        const json& k = run.report["by_kind"];
        EXPECT_EQ(run.rc, 1);
        EXPECT_EQ(k["streamed"]["failed"].get<int>(), 0);
        EXPECT_EQ(k["malformed"]["failed"].get<int>(), 6);
        EXPECT_EQ(run.report["requests_failed"].get<int>(), 6);
        const std::string err = k["malformed"]["first_error"].get<std::string>();
        const char* want = shaped ? "expected a 4xx refusal, got HTTP 500" : "without OpenAI's error shape";
        EXPECT_NE(err.find(want), std::string::npos) << err;
    }
}

TEST(ServeBench, CancelledWithoutAChunkFails) {
    FakeServerOptions f;
    f.fail_every = 1;  // every valid request gets a 500 before any chunk
    FakeOpenAIServer server(f);
    ServeBenchOptions o;
    o.base_url = server.base_url();
    o.num_requests = 4;
    o.output_len = 3;
    o.mix = parse_request_mix("cancelled=1,plain=1");
    const BenchRun run = run_bench(o);
    EXPECT_EQ(run.rc, 1);
    EXPECT_EQ(run.report["by_kind"]["cancelled"]["failed"].get<int>(), 2);
    EXPECT_EQ(run.report["by_kind"]["plain"]["failed"].get<int>(), 2);
    EXPECT_FALSE(run.report["by_kind"].contains("streamed"));
    EXPECT_NE(run.report["first_error"].get<std::string>().find("HTTP 500"), std::string::npos);
}

// Slow clients against a server that drops a connection silent for 40 ms: each is dropped after
// its first byte and reopened at its next 0.1 s tick, while the normal requests all succeed. The
// sampler watches this very process.
TEST(ServeBench, SlowClientsReconnectAndTheSamplerReadsProc) {
    FakeServerOptions f;
    f.read_timeout_ms = 40;
    FakeOpenAIServer server(f);
    ServeBenchOptions o;
    o.base_url = server.base_url();
    o.num_requests = 20;
    o.max_concurrency = 2;
    o.output_len = 10;  // 10 waves of >= 65 ms: the run lasts > 0.6 s
    o.slow_clients = 6;
    o.slow_client_interval_s = 0.1;
    o.server_pid = ::getpid();
    o.sample_interval_s = 0.05;
    const BenchRun run = run_bench(o);
    const json& r = run.report;
    EXPECT_EQ(run.rc, 0) << r["first_error"];
    EXPECT_EQ(r["requests_ok"].get<int>(), 20);
    const json& s = r["slow_clients"];
    EXPECT_EQ(s["clients"].get<int>(), 6);
    EXPECT_GE(s["reconnects"].get<int>(), 6 * 3) << s;
    EXPECT_GE(s["drops"].get<int>(), s["reconnects"].get<int>()) << s;
    EXPECT_EQ(s["connect_failures"].get<int>(), 0) << s;
    EXPECT_GE(s["max_open"].get<int>(), 1) << s;  // staggered over the interval: not all open at once
    EXPECT_LE(s["max_open"].get<int>(), 6) << s;
    EXPECT_GT(s["mean_open"].get<double>(), 0.5) << s;  // ~40% of the time: open 40 ms of every 100
    EXPECT_LT(s["mean_open"].get<double>(), 5.5) << s;

    const json& p = r["server_process"];
    EXPECT_EQ(p["pid"].get<int>(), ::getpid());
    EXPECT_FALSE(p["exited_during_run"].get<bool>());
    EXPECT_EQ(p["warmup_requests"].get<int>(), 2);
    ASSERT_GE(p["num_samples"].get<int>(), 8) << p;
    EXPECT_EQ(p["samples"].size(), p["num_samples"].get<size_t>());
    EXPECT_EQ(p["first"]["requests_done"].get<int>(), 0);
    EXPECT_GE(p["after_warmup"]["requests_done"].get<int>(), 2);
    EXPECT_EQ(p["last"]["requests_done"].get<int>(), 20);
    EXPECT_GT(p["first"]["rss_kb"].get<int64_t>(), 1000);
    EXPECT_GE(p["first"]["threads"].get<int>(), 64);  // the fake's workers at least
    EXPECT_GT(p["first"]["fds"].get<int>(), 3);
    EXPECT_GE(p["max"]["rss_kb"], p["last"]["rss_kb"]);
    EXPECT_GE(p["max"]["threads"], p["after_warmup"]["threads"]);
    double t = -1;
    for (const json& q : p["samples"]) {
        EXPECT_GT(q["t_s"].get<double>(), t);
        t = q["t_s"].get<double>();
    }
}

TEST(ServeBench, SlowClientsStayOpenWhenNotDropped) {
    FakeOpenAIServer server;  // drops a client only after 5 s of silence
    const std::string url = server.base_url();
    SlowClients slow("127.0.0.1", std::stoi(url.substr(url.rfind(':') + 1)), 5, 0.02);
    EXPECT_EQ(slow.wait_connected(5), 5);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(slow.open_now(), 5);
    const SlowClientStats st = slow.stop();
    EXPECT_EQ(st.connects, 5);
    EXPECT_EQ(st.reconnects, 0);
    EXPECT_EQ(st.drops, 0);
    EXPECT_EQ(st.min_open, 5);
    EXPECT_GT(st.mean_open, 4.0);
    EXPECT_GE(st.bytes_sent, 5 * 8);  // ~15 ticks each; allow a slow machine
    EXPECT_EQ(slow.open_now(), 0);
}

TEST(ServeBench, ServerPidMustBeReadable) {
    FakeOpenAIServer server;
    ServeBenchOptions o;
    o.base_url = server.base_url();
    o.num_requests = 1;
    o.server_pid = 0x7ffffff0;  // above any pid_max
    EXPECT_THROW(run_serve_bench(o), fanout::Error);
    ProcSample s;
    EXPECT_FALSE(read_proc_sample(0x7ffffff0, s));
    EXPECT_TRUE(read_proc_sample(::getpid(), s));
    EXPECT_GT(s.rss_kb, 0);
    EXPECT_GE(s.threads, 1);
}

}  // namespace
}  // namespace fanout::bench

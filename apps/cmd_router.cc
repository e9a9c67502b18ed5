// router: the OpenAI-compatible HTTP API in front of many `fanout engine` instances
// (router/router.h), until SIGINT / SIGTERM. The engines are given (--engine), or — when mpirun
// starts the router beside them (`mpirun -np 1 fanout router ... : -np N fanout engine ...`) —
// each tells the router where it serves once it listens.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

#include "cli_common.h"
#include "fanout/core/deadline.h"
#include "fanout/router/router.h"
#include "fanout/serve/openai_server.h"
#ifdef FANOUT_WITH_MPI
#include "fanout/comm/mpi_ep.h"
#endif

namespace fanout::cli {
namespace {

std::atomic<bool> g_router_stop{false};
extern "C" void on_router_signal(int) { g_router_stop = true; }

struct RouterArgs {
    std::vector<std::string> engines;
    std::string model = "tiny";  // where the tokenizer comes from
    router::RouterConfig config;
    serve::ServerConfig server;
    int wait_seconds = 60;
    int drain_seconds = 20;
};

void run_router(RouterArgs& a) {
#ifdef FANOUT_WITH_MPI
    std::unique_ptr<comm::MpiSession> mpi;  // the launch's engines, until the router stops
    if (comm::launched_by_mpi()) {
        mpi = std::make_unique<comm::MpiSession>(comm::MpiSession::Role::kRouter);
        std::fprintf(stderr, "fanout router: waiting for the engines of this launch to listen\n");
        const auto found = mpi->collect_announcements(
            [](int got, int want) { std::fprintf(stderr, "fanout router: %d of %d engine ranks ready\n", got, want); });
        for (const auto& e : found) std::fprintf(stderr, "fanout router: engine %s (from the launcher)\n", e.c_str());
        a.engines.insert(a.engines.end(), found.begin(), found.end());
    }
#endif
    FANOUT_CHECK(!a.engines.empty(),
                 "router: give the engines with --engine HOST:PORT (repeat it), or start the router beside them under "
                 "mpirun (-np 1 fanout router ... : -np N fanout engine ...)");
    const io::Tokenizer tokenizer = load_tokenizer(resolve_model_dir(a.model));
    router::Router r(a.engines, a.config);
    r.start(std::chrono::seconds(a.wait_seconds));
    if (a.server.model_name.empty()) a.server.model_name = r.model();
    serve::validate_model_name(a.server.model_name);
    serve::OpenAIServer server(r, tokenizer, a.server);
    const int port = server.bind();
    std::signal(SIGPIPE, SIG_IGN);
    std::signal(SIGINT, on_router_signal);
    std::signal(SIGTERM, on_router_signal);
    std::thread watcher([&] {  // SIGINT / SIGTERM: drain (no new requests; those in flight finish), then stop
        while (!g_router_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        std::fprintf(stderr, "fanout router: draining (up to %d s)\n", a.drain_seconds);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(a.drain_seconds);
        if (!r.drain(std::chrono::seconds(a.drain_seconds)))
            std::fprintf(stderr, "fanout router: requests still running after %d s; stopping anyway\n",
                         a.drain_seconds);
        // What the engines sent may still be on its way to slow readers: the rest of the time.
        server.stop(time_left(deadline));
    });
    int healthy = 0;
    for (int e = 0; e < r.num_engines(); ++e) healthy += r.healthy(e) ? 1 : 0;
    std::fprintf(stderr, "fanout router: listening on http://%s:%d (model '%s', %d of %d engines healthy, policy %s)\n",
                 a.server.host.c_str(), port, a.server.model_name.c_str(), healthy, r.num_engines(),
                 a.config.placement.policy.c_str());
    server.serve();
    g_router_stop = true;
    watcher.join();
    r.stop();
    std::fprintf(stderr, "fanout router: stopped\n");
}

}  // namespace

void add_router_command(CLI::App& app) {
    auto a = std::make_shared<RouterArgs>();
    auto* cmd = app.add_subcommand("router", "the OpenAI-compatible API in front of many engines (fanout engine)");
    cmd->add_option("--engine", a->engines,
                    "an engine's HOST:PORT (repeat for each); under mpirun the launch's `fanout engine` processes "
                    "are found without it");
    cmd->add_option("--policy", a->config.placement.policy,
                    "prefix: the engine holding most of the prompt's KV blocks, weighed against its load; "
                    "least-load; round-robin")
        ->check(CLI::IsMember({"prefix", "least-load", "round-robin"}))
        ->capture_default_str();
    cmd->add_option("--load-weight", a->config.placement.load_weight,
                    "prefix policy: blocks of prefill a request in flight is worth")
        ->capture_default_str();
    cmd->add_option("--balance-slack", a->config.placement.balance_slack,
                    "prefix policy: in-flight spread between engines past which the least loaded wins")
        ->capture_default_str();
    cmd->add_option("--pending-ttl", a->config.placement.pending_ttl,
                    "prefix policy: seconds a request's prompt blocks count as cached on the engine it was sent to, "
                    "until that engine's KV events confirm them (0: not at all)")
        ->capture_default_str();
    cmd->add_option("--max-in-flight-per-engine", a->config.max_in_flight,
                    "requests in flight on one engine before it takes no more (all full: 429)")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    add_model_flag(cmd, a->model);
    cmd->add_option("--host", a->server.host, "address to listen on")->capture_default_str();
    cmd->add_option("--port", a->server.port, "port (0 = any free one, printed at start)")
        ->check(CLI::Range(0, 65535))
        ->capture_default_str();
    cmd->add_option("--served-model-name", a->server.model_name, "the 'model' clients send (default: the engines')");
    cmd->add_option("--max-in-flight", a->server.max_in_flight, "concurrent requests before 429")
        ->check(CLI::Range(1, 1 << 20))
        ->capture_default_str();
    cmd->add_option("--wait", a->wait_seconds, "seconds to wait at start for a healthy engine")->capture_default_str();
    cmd->add_option("--drain", a->drain_seconds,
                    "on SIGINT/SIGTERM: seconds for the requests in flight to finish (new ones get 503)")
        ->capture_default_str();
    cmd->callback([a] { run_router(*a); });
}

}  // namespace fanout::cli

// serve: the OpenAI-compatible HTTP API until SIGINT / SIGTERM, over one engine or a data-parallel
// group of expert-parallel ranks (--ep N): threads of this process, or processes under an MPI
// launcher (`mpirun -np N fanout serve ...`, or `--ranks processes`, which starts mpirun itself).
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include "cli_common.h"
#include "deployment.h"
#include "fanout/engine/engine.h"
#include "fanout/engine/memory_plan.h"
#include "fanout/model/step_cost.h"
#ifdef FANOUT_WITH_CUDA
#include "fanout/engine/cuda_runner.h"
#endif
#include "fanout/rpc/engine_service.h"
#include "fanout/serve/openai_server.h"

namespace fanout::cli {
namespace {

std::atomic<bool> g_stop{false};
extern "C" void on_signal(int) { g_stop = true; }

// The name a router elsewhere reaches this host by when listening on `host`: this host's name for
// the wildcard addresses, else `host` itself.
std::string reachable_host(const std::string& host) {
    if (host != "0.0.0.0" && host != "::" && host != "[::]" && !host.empty()) return host;
    char name[256] = {};
    return gethostname(name, sizeof(name) - 1) == 0 ? std::string(name) : std::string("127.0.0.1");
}

struct ServeArgs {
    ModelArgs model;
    serve::ServerConfig server;
    engine::SchedulerConfig scheduler;
    double kv_memory_gb = -1;  // <= 0: CPU 1 GB; GPU what the plan leaves
    double gpu_memory_utilization = 0.9;
    double attention_cost = -1;       // < 0: from the model config (model/step_cost.h)
    int64_t mha_max_context = 16384;  // CudaModelOptions::max_mha_context
    int ep = 0;                       // 0: 1, or the launcher's world
    std::string ranks = "threads";
    bool grpc = false;       // `fanout engine`: the engine's gRPC service instead of the HTTP API
    std::string ep_backend;  // empty: local at EP1 or on the CPU, nvlink for GPU ranks on one host, else nccl
    engine::PlacementConfig dp_placement;
    int mtp = 0;  // MTP draft tokens per step (0 = off)
    int tp = 1;   // tensor-parallel attention ranks per DP group
    MicrobatchArgs microbatch;
};

void run_serve(ServeArgs& a) {
    std::optional<io::Tokenizer> tokenizer_store;  // outlives the deployment's engines, which use it
    Deployment d;
    d.join_world(a.ep, a.ranks, a.model.device, a.grpc);
    if (a.ep_backend.empty())
        a.ep_backend = a.ep == 1 || a.model.device == "cpu" ? "local" : d.all_local() ? "nvlink" : "nccl";
    FANOUT_CHECK(a.ep == 1 || a.model.device == "cpu" || a.ranks == "processes",
                 "--ep {} --device cuda: GPU ranks are processes, one per GPU (mpirun -np {} fanout serve ..., or "
                 "--ranks processes)",
                 a.ep, a.ep);
    FANOUT_CHECK(a.ep_backend == "local" || a.model.device == "cuda",
                 "--ep-backend {}: the GPU backends need --device cuda (the CPU path's ranks use local or mpi)",
                 a.ep_backend);
    FANOUT_CHECK(a.ep == 1 || a.ep_backend != "local" || a.model.device == "cpu",
                 "--ep-backend local is one GPU holding every expert; --ep {} needs nvlink or nccl", a.ep);
    if (a.model.device == "cuda") {
#ifdef FANOUT_WITH_CUDA
        d.select_gpu();  // before anything touches the device
#endif
    }
    const std::string dir = resolve_model_dir(a.model.model);
    const io::Tokenizer& tokenizer = tokenizer_store.emplace(load_tokenizer(dir));
    if (a.server.model_name.empty()) {
        // The folder's name, also for "dir/" and "dir/." (whose filename() is empty or ".").
        std::filesystem::path p = std::filesystem::path(dir).lexically_normal();
        if (!p.has_filename() && p.has_parent_path()) p = p.parent_path();
        a.server.model_name = a.model.model == "tiny" ? "tiny" : p.filename().string();
    }
    serve::validate_model_name(a.server.model_name);  // before loading: a bad name costs nothing
    engine::EngineConfig ec;
    ec.scheduler = a.scheduler;
    ec.dp_placement = a.dp_placement;
    ec.mtp_draft_tokens = a.mtp;
    a.microbatch.apply(ec);
    // The memory plan before a byte is loaded: what does not fit is refused now (exit 2), naming the
    // flag. CPU: the KV cache is --kv-memory-gb (default 1) of host memory; GPU: --kv-memory-gb, or
    // what is left of --gpu-memory-utilization of the device after weights and step buffers.
    using steady = std::chrono::steady_clock;
    auto phase_start = steady::now();
    const auto phase = [&](const char* name) {  // the seconds since the last phase ended, for the breakdown
        const auto now = steady::now();
        a.server.startup_seconds.emplace_back(name, std::chrono::duration<double>(now - phase_start).count());
        phase_start = now;
    };
    const io::ModelConfig pre = io::load_model_config(dir);
    check_tp(a.tp, a.ep, a.model.device);
    validate(ParallelConfig{d.rank, a.ep, a.tp}, pre.n_routed_experts);  // before loading anything
    const int local_ranks = a.ranks == "threads" ? a.ep : 1;             // ranks in this process
    engine::MemoryRequest mr;
    if (a.kv_memory_gb > 0) mr.kv_bytes = a.kv_memory_gb * 1e9;
#ifdef FANOUT_WITH_CUDA
    model::CudaModelOptions o;
    o.max_requests = a.scheduler.max_num_seqs;
    o.max_step_tokens = a.scheduler.max_batched_tokens;
    o.max_context = pre.max_position_embeddings;  // the most the KV cache can leave it at
    o.mtp_draft_tokens = a.mtp;
    o.max_mha_context = a.mha_max_context;
    o.kv_dtype = kv_dtype(a.model);
    // The two-microbatch schedule on the GPU: on; auto with --microbatch-min-tokens; or auto under
    // expert parallelism, calibrated by the graph captures, which time both schedules at every
    // decode bucket (at EP1 without a threshold there is no exchange to hide: auto is off).
    const bool auto_microbatch = ec.microbatch == engine::EngineConfig::Microbatch::kAuto;
    const bool given_threshold = ec.microbatch_min_tokens != std::numeric_limits<int64_t>::max();
    o.microbatch = ec.microbatch == engine::EngineConfig::Microbatch::kOn ||
                   (auto_microbatch && (given_threshold || a.ep_backend != "local"));
    const bool calibrate_microbatch = auto_microbatch && o.microbatch && !given_threshold;
#endif
    if (a.model.device == "cuda") {
#ifdef FANOUT_WITH_CUDA
        if (a.ep_backend != "local") {
            // This rank's experts reach the others' tokens through the GPU EP backend, on the
            // stream every step runs on; made before the plan, which then sees its buffers in use.
            const comm::EpConfig ep =
                comm::EpConfig::for_rank(ParallelConfig{d.rank, a.ep, 1}, static_cast<int>(pre.n_routed_experts),
                                         static_cast<int>(pre.num_experts_per_tok), static_cast<int>(pre.hidden_size),
                                         static_cast<int>(o.max_step_tokens),
                                         model::experts_run_fp8(pre) ? comm::Payload::kFp8 : comm::Payload::kBf16);
            o.ep = d.make_gpu_ep(a.ep_backend, ep, o.microbatch);
            o.microbatch_ep = d.microbatch_ep.get();
            o.stream = d.gpu->stream;
        }
        const engine::CudaRunner::DeviceMemory dm = engine::CudaRunner::device_memory();
        mr.where = fmt::format("GPU {} ({})", dm.device, dm.name);
        mr.total_bytes = dm.total_bytes;
        mr.in_use_bytes = dm.total_bytes - dm.free_bytes;
        mr.utilization = a.gpu_memory_utilization;
        mr.weight_bytes = engine::checkpoint_weight_bytes(dir, pre, ParallelConfig{d.rank, a.ep, 1}, a.mtp > 0);
        mr.workspace_bytes = static_cast<double>(model::CudaModel::workspace_bytes(pre, o));
        mr.graph_bytes = static_cast<double>(model::CudaModel::graph_bytes(pre, o));
        mr.kv_block_bytes = engine::kv_block_bytes(pre, a.mtp > 0, kv::kDefaultBlockSize, o.kv_dtype);
#else
        FANOUT_FAIL("--device cuda: this fanout was built without CUDA (no nvcc at configure time)");
#endif
    } else {
        mr.where = "this host (MemTotal)";
        mr.total_bytes = engine::host_memory_bytes();
        // Mapped whole; tensor-parallel ranks add their heads' f32 copies (one whole copy per DP
        // group: a process of a TP group its share).
        mr.weight_bytes = engine::checkpoint_file_bytes(dir) +
                          (local_ranks >= a.tp ? engine::tp_attention_copy_bytes(pre, a.tp, local_ranks / a.tp)
                                               : engine::tp_attention_copy_bytes(pre, a.tp, 1) / a.tp);
        // Each rank of this process its step buffers and KV cache (--kv-memory-gb each); the
        // checkpoint is mapped once.
        mr.workspace_bytes = local_ranks * engine::cpu_step_workspace_bytes(pre, a.scheduler.max_num_seqs,
                                                                            a.scheduler.max_batched_tokens);
        mr.kv_block_bytes = engine::kv_block_bytes(pre, true, kv::kDefaultBlockSize, kv_dtype(a.model));
        if (!mr.kv_bytes)
            mr.kv_bytes = 1e9;  // by default 1 GB for all the ranks of this process
        else
            *mr.kv_bytes *= local_ranks;  // --kv-memory-gb is each rank's
    }
    const engine::MemoryPlan plan = mr.total_bytes > 0 ? engine::plan_memory(mr) : engine::MemoryPlan{};
    if (!plan.summary.empty() && d.rank == 0) std::fprintf(stderr, "%s\n", plan.summary.c_str());
    phase("plan");
    std::unique_ptr<engine::ModelRunner> runner;
    std::vector<std::unique_ptr<model::DeepseekV3>> rank_models;  // --ep N --ranks threads: ranks 1..N-1
    for (int r = 1; r < local_ranks; ++r) rank_models.push_back(load_model(a.model, {}, ParallelConfig{r, a.ep, a.tp}));
    auto model = load_model(a.model, {}, ParallelConfig{d.rank, a.ep, a.tp});
    phase(a.model.device == "cuda" ? "bind" : "load and check");
    const io::ModelConfig& c = model->config();
    // Steps are budgeted by work, not tokens (a chunk deep in a long prompt costs more than one at
    // its start), priced at the absorbed form that decodes and small chunks run — on the GPU long
    // chunks apart, at the MHA form's price (below) — and on the CPU path at what a pair costs
    // there; --attention-cost overrides (one price for every chunk).
    const model::StepFlops flops = model::step_flops(c);
    const double pair_flops = std::max(flops.attention_per_pair, flops.absorbed_attention_per_pair);
    ec.scheduler.attention_cost_per_pair =
        a.attention_cost >= 0
            ? a.attention_cost
            : pair_flops / flops.layers_per_token * (a.model.device == "cuda" ? 1.0 : model::kCpuAttentionSlowdown);
    if (a.model.device == "cuda") {
#ifdef FANOUT_WITH_CUDA
        if (a.attention_cost < 0 && a.mha_max_context > 0) {
            // Chunks the runner runs in the MHA form: their pairs at its price, plus one expansion
            // of their contexts' latents through kv_b (step_cost.h).
            ec.scheduler.long_chunk_cost_per_pair = flops.attention_per_pair / flops.layers_per_token;
            ec.scheduler.long_chunk_cost_per_key = flops.latent_expansion_per_context_token / flops.layers_per_token;
            ec.scheduler.long_chunk_tokens = model::kMaxGraphQueryLen;
            ec.scheduler.long_chunk_max_context = a.mha_max_context;
        }
        // The cache on the device, bf16, as planned; the runner's step buffers from the scheduler's
        // limits (the plan counted them at the full context: a smaller cache only shrinks them).
        ec.num_kv_blocks = d.min_over_ranks(plan.kv_blocks);  // every rank the same limits (rank 0 checks requests)
        o.num_kv_blocks = ec.num_kv_blocks;
        o.max_context = std::min<int64_t>(c.max_position_embeddings, ec.num_kv_blocks * kv::kDefaultBlockSize);
        const double free_before = engine::CudaRunner::device_memory().free_bytes;
        auto gpu = std::make_unique<engine::CudaRunner>(*model, o, load_progress_printer());
        const model::StreamStats& up = gpu->model().upload_stats();
        print_upload_summary(up);
        const double device_seconds = std::chrono::duration<double>(steady::now() - phase_start).count();
        a.server.startup_seconds.emplace_back("weights (read, check, upload)", up.seconds);
        a.server.startup_seconds.emplace_back("KV cache and step buffers", device_seconds - up.seconds);
        phase_start = steady::now();
        const double free_loaded = engine::CudaRunner::device_memory().free_bytes;
        // Every decode bucket's graph now, inside the plan, so no request waits on a capture.
        double graph_bytes = 0;
        std::string buckets, schedules;
        std::vector<engine::MicrobatchTiming> timings;
        d.barrier();  // under EP every capture is a step of the group: all ranks loaded first
        for (const auto& g : gpu->model().capture_decode_graphs()) {
            graph_bytes += g.bytes;
            buckets += fmt::format("{}{}: {:.0f} MB {:.2f} s", buckets.empty() ? "" : ", ", g.requests, g.bytes / 1e6,
                                   g.seconds);
            if (g.microbatch_step_us > 0) {
                timings.push_back({g.tokens, g.step_us, g.microbatch_step_us});
                schedules += fmt::format("{}{}: {:.0f} / {:.0f}", schedules.empty() ? "" : ", ", g.tokens, g.step_us,
                                         g.microbatch_step_us);
            }
        }
        if (!buckets.empty())
            std::fprintf(stderr, "CUDA graphs captured (requests: memory, time): %s; %.2f GB in all\n", buckets.c_str(),
                         graph_bytes / 1e9);
        if (!schedules.empty() && d.rank == 0)
            std::fprintf(stderr, "decode step µs as one batch / two microbatches (tokens: times): %s\n",
                         schedules.c_str());
        if (calibrate_microbatch) {
            // Rank 0 decides every step of a DP group; the others' thresholds are never read.
            ec.microbatch_min_tokens = engine::microbatch_min_tokens_from(timings);
            if (d.rank == 0) {
                if (ec.microbatch_min_tokens == std::numeric_limits<int64_t>::max())
                    std::fprintf(stderr,
                                 "--microbatch auto: off (one batch was faster at the largest step measured)\n");
                else
                    std::fprintf(stderr, "--microbatch auto: on for steps of %lld tokens and more (measured)\n",
                                 static_cast<long long>(ec.microbatch_min_tokens));
            }
        }
        phase("graph capture");
        const double free_after = engine::CudaRunner::device_memory().free_bytes;
        std::fprintf(stderr,
                     "GPU memory at start-up: %.2f GB (planned %.2f GB): weights and step buffers + KV %.2f GB, graphs "
                     "%.2f GB\n",
                     (free_before - free_after) / 1e9,
                     (mr.weight_bytes + static_cast<double>(model::CudaModel::workspace_bytes(c, o)) + mr.graph_bytes +
                      static_cast<double>(ec.num_kv_blocks) * mr.kv_block_bytes) /
                         1e9,
                     (free_before - free_loaded) / 1e9, (free_loaded - free_after) / 1e9);
        runner = std::move(gpu);
#else
        FANOUT_FAIL("--device cuda: this fanout was built without CUDA (no nvcc at configure time)");
#endif
    } else {
        model::ForwardOptions opts = forward_options(a.model);
        opts.absorbed_max_query = model::absorbed_form_max_query(c);
        const DType kv_dtype = cli::kv_dtype(a.model);
        const kv::KvCacheConfig one = model->kv_cache_config(1, kv_dtype);
        const double block_bytes = static_cast<double>(one.num_layers * one.block_size * one.entry_bytes());
        ec.num_kv_blocks =
            d.min_over_ranks(std::max<int64_t>(4, static_cast<int64_t>(*mr.kv_bytes / local_ranks / block_bytes)));
        // Each rank its share of the cores (threads of one process, or processes of one host).
        const int cores = static_cast<int>(std::thread::hardware_concurrency());
        const int sharing = a.ranks == "threads" ? a.ep : d.local_processes;  // ranks on this host's cores
        const int threads = a.model.threads > 0 ? a.model.threads : std::max(1, cores / sharing);
        if (a.ep > 1) {
            rank_models.insert(rank_models.begin(), std::move(model));
            d.make_cpu_ranks(std::move(rank_models), ec, opts, threads, kv_dtype, &tokenizer, a.tp);
        } else {
            runner = std::make_unique<engine::DeepseekRunner>(std::move(model), opts, a.model.threads, kv_dtype);
        }
    }
    if (a.model.device != "cuda") phase("runner");
    if (runner) d.make_rank(std::move(runner), ec, &tokenizer);
    phase(a.model.device == "cuda" ? "engine" : "KV cache and engine");
    if (d.follows()) {
        d.announce("");  // not a front end (a router in the launch counts every rank's word)
        // Ranks past 0 serve their experts and run the requests rank 0 hands them, until it stops
        // the group; a failure anywhere ends the job through the launcher, naming the rank.
        std::signal(SIGINT, SIG_IGN);  // the launcher's signal reaches every rank: rank 0 stops the group
        std::signal(SIGTERM, SIG_IGN);
        d.follow();
        std::fprintf(stderr, "fanout %s: rank %d stopped\n", a.grpc ? "engine" : "serve", d.rank);
        return;
    }
    std::string breakdown;
    double total = 0;
    for (const auto& [name, secs] : a.server.startup_seconds) {
        breakdown += fmt::format("{}{} {:.2f} s", breakdown.empty() ? "" : ", ", name, secs);
        total += secs;
    }
    std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not process death
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    const std::string ranks = a.ep == 1 ? std::string() : fmt::format(", {} DP/EP ranks as {}", a.ep, a.ranks);
    const std::string what =
        fmt::format("model '{}', {} KV blocks = {} tokens{}{}", a.server.model_name, ec.num_kv_blocks,
                    ec.num_kv_blocks * kv::kDefaultBlockSize, a.ep > 1 ? " per rank" : "", ranks);
    if (a.grpc) {
        // `fanout engine`: the gRPC service (rpc/engine_service.h) for a router, until a signal.
        // Several engines of one launch: each on the next port (unless any free one).
        const int port = a.server.port == 0 ? 0 : a.server.port + d.engine_index;
        rpc::EngineServer server(d.service(), a.server.model_name, fmt::format("{}:{}", a.server.host, port));
        std::fprintf(stderr, "start-up: %s; %.2f s in all\n", breakdown.c_str(), total);
        // To the launch's router first: MPI is this thread's until the step loop starts.
        d.announce(fmt::format("{}:{}", reachable_host(a.server.host), server.port()));
        d.start();
        std::fprintf(
            stderr, "fanout engine: serving grpc://%s:%d (%s%s)\n", a.server.host.c_str(), server.port(), what.c_str(),
            d.engines > 1 ? fmt::format("; engine {} of {} in this launch", d.engine_index, d.engines).c_str() : "");
        while (!g_stop && d.failure().empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        server.shutdown(std::chrono::seconds(20));  // drain: no new calls, those in flight finish (or are cut at 20 s)
        d.stop();
        const std::string failure = d.failure();
        FANOUT_CHECK(failure.empty(), "the deployment stopped: {}", failure);
        std::fprintf(stderr, "fanout engine: stopped\n");
        return;
    }
    serve::OpenAIServer server(d.service(), tokenizer, a.server);
    const int port = server.bind();
    std::fprintf(stderr, "start-up: %s; %.2f s in all\n", breakdown.c_str(), total);
    d.start();
    std::thread watcher([&] {  // a signal, or a failed rank, stops the server
        while (!g_stop && d.failure().empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        // A signal drains: the responses under way (streams to slow readers included) get up to
        // 20 s, new requests get 503. A failed rank stops at once.
        const bool drain = d.failure().empty();
        if (drain) std::fprintf(stderr, "fanout serve: draining (up to 20 s)\n");
        server.stop(drain ? std::chrono::milliseconds(20'000) : std::chrono::milliseconds(0));
    });
    std::fprintf(stderr, "fanout serve: listening on http://%s:%d (%s)\n", a.server.host.c_str(), port, what.c_str());
    server.serve();
    g_stop = true;
    watcher.join();
    d.stop();
    const std::string failure = d.failure();
    FANOUT_CHECK(failure.empty(), "the deployment stopped: {}", failure);
    std::fprintf(stderr, "fanout serve: stopped\n");
}

// The options `serve` and `engine` share: the model, its ranks and the scheduler's and memory's limits.
void add_engine_options(CLI::App* cmd, ServeArgs& a);

}  // namespace

void add_serve_command(CLI::App& app) {
    auto a = std::make_shared<ServeArgs>();
    a->server.model_name.clear();
    auto* cmd = app.add_subcommand("serve", "serve the OpenAI-compatible API (chat and completions, streaming)");
    add_engine_options(cmd, *a);
    cmd->add_option("--max-in-flight", a->server.max_in_flight, "concurrent requests before 429")
        ->check(CLI::Range(1, 1 << 20))
        ->capture_default_str();
    cmd->add_option("--default-max-tokens", a->server.default_max_tokens,
                    "max_tokens of a request that names none (capped by the context)")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    cmd->add_option("--allowed-hosts", a->server.allowed_hosts,
                    "Host names clients may use beyond IP addresses, localhost and --host ('*': any); "
                    "guards a local server against DNS rebinding")
        ->delimiter(',');
    cmd->add_option("--max-connections", a->server.limits.max_connections, "open connections before 503")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    cmd->callback([a] { run_serve(*a); });
}

void add_engine_command(CLI::App& app) {
    auto a = std::make_shared<ServeArgs>();
    a->server.model_name.clear();
    a->grpc = true;
    a->server.port = 50051;
    auto* cmd = app.add_subcommand(
        "engine", "one engine instance behind the gRPC service a router talks to (proto/fanout/engine.proto)");
    add_engine_options(cmd, *a);
    cmd->callback([a] { run_serve(*a); });
}

namespace {

void add_engine_options(CLI::App* cmd, ServeArgs& aa) {
    ServeArgs* a = &aa;
    add_model_args(cmd, a->model);
    add_rank_options(cmd, a->ep, a->ranks, a->tp);
    add_microbatch_options(cmd, a->microbatch);
    cmd->add_option("--ep-backend", a->ep_backend,
                    "how GPU ranks exchange tokens: nvlink (NCCL's device API, one NVLink domain) or nccl (anywhere); "
                    "local: one GPU holding every expert (default: local at --ep 1, nvlink when every rank is on this "
                    "host, else nccl). At --ep 1 nvlink/nccl run the expert-parallel path on one GPU")
        ->check(CLI::IsMember({"local", "nvlink", "nccl"}));
    cmd->add_option("--mtp", a->mtp,
                    "MTP speculative decoding: tokens the model's multi-token-prediction layer drafts per step, "
                    "checked in the next (0 = off; greedy output is unchanged, sampling keeps its distribution; "
                    "at most 3 on the GPU)")
        ->check(CLI::Range(0, engine::Engine::kMaxDraftTokens))
        ->capture_default_str();
    cmd->add_option("--dp-policy", a->dp_placement.policy,
                    "--ep N: how rank 0 places requests on the DP ranks — prefix: the rank holding most of the "
                    "prompt's KV blocks, weighed against its load (as fanout router places them on engines); "
                    "least-load; round-robin")
        ->check(CLI::IsMember({"prefix", "least-load", "round-robin"}))
        ->capture_default_str();
    cmd->add_option("--host", a->server.host, "address to listen on")->capture_default_str();
    cmd->add_option("--port", a->server.port, "port (0 = any free one, printed at start)")
        ->check(CLI::Range(0, 65535))
        ->capture_default_str();
    cmd->add_option("--served-model-name", a->server.model_name,
                    "the 'model' clients send (default: tiny or the folder name)");
    cmd->add_option("--max-num-seqs", a->scheduler.max_num_seqs, "sequences in the running batch")
        ->capture_default_str();
    cmd->add_option("--max-batched-tokens", a->scheduler.max_batched_tokens, "tokens per step")->capture_default_str();
    cmd->add_option("--prefill-chunk", a->scheduler.prefill_chunk, "prompt tokens of one sequence per step")
        ->capture_default_str();
    cmd->add_option("--attention-cost", a->attention_cost,
                    "price of one attention pair in tokens' work, for the step budget (default: from the model's "
                    "FLOPs; 0: budget by tokens alone)")
        ->check(finite_in(0, 1e12));
    cmd->add_option("--mha-max-context", a->mha_max_context,
                    "--device cuda: a step's prefill chunks run attention in the MHA form (their contexts' latents "
                    "expanded per head: fewer FLOPs for long prompts) while their contexts total at most this many "
                    "keys; its buffers take ~66 KB per key at DeepSeek-V3's widths; 0: always the absorbed form")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    cmd->add_flag("!--no-prefix-cache", a->scheduler.enable_prefix_cache, "do not share KV blocks between requests");
    cmd->add_option("--kv-memory-gb", a->kv_memory_gb,
                    "memory for each rank's paged KV cache (default: on the CPU 1 in all, split over this process's "
                    "ranks; on a GPU what the memory plan leaves)")
        ->check(finite_in(0, 1e6));
    cmd->add_option("--gpu-memory-utilization", a->gpu_memory_utilization,
                    "fraction of the GPU's memory fanout may use (weights, step buffers, KV cache)")
        ->check(finite_in(0.01, 1.0))
        ->capture_default_str();
}

}  // namespace
}  // namespace fanout::cli

#include "deployment.h"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "fanout/comm/bootstrap.h"
#include "fanout/core/error.h"
#ifdef FANOUT_WITH_CUDA
#include "fanout/comm/ep_gpu.h"
#include "fanout/comm/nccl_check.h"
#include "fanout/core/cuda_check.h"
#endif

namespace fanout::cli {
namespace {

#ifdef FANOUT_WITH_MPI
std::atomic<int> g_signal{0};
extern "C" void remember_signal(int sig) { g_signal = sig; }

// The pid of rank 0 among mpirun's children (its environment says OMPI_COMM_WORLD_RANK=0), or -1.
pid_t find_rank0(pid_t mpirun) {
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
        const std::string name = entry.path().filename().string();
        if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
        std::ifstream status(entry.path() / "status");
        pid_t ppid = -1;
        for (std::string line; std::getline(status, line);)
            if (line.rfind("PPid:", 0) == 0) ppid = static_cast<pid_t>(std::atoi(line.c_str() + 5));
        if (ppid != mpirun) continue;
        std::ifstream env(entry.path() / "environ", std::ios::binary);
        for (std::string var; std::getline(env, var, '\0');)
            if (var == "OMPI_COMM_WORLD_RANK=0") return static_cast<pid_t>(std::atoi(name.c_str()));
    }
    return -1;
}

// `--ranks processes` without a launcher: this command again, under mpirun on this host (the
// launcher gives each process its rank; ranks past 0 serve their experts, rank 0 the front end).
// This process stays mpirun's parent, mpirun in a process group of its own: SIGINT / SIGTERM go to
// rank 0, which stops the group so every rank exits cleanly (mpirun itself, signalled, would end
// the job as a failure); the exit status is mpirun's.
[[noreturn]] void relaunch_under_mpirun(int ep) {
    std::ifstream f("/proc/self/cmdline", std::ios::binary);
    std::vector<std::string> args;
    for (std::string arg; std::getline(f, arg, '\0');) args.push_back(arg);
    FANOUT_CHECK(!args.empty(), "--ranks processes: cannot read this process's command line");
    std::vector<std::string> cmd = {"mpirun",
                                    "-np",
                                    std::to_string(ep),
                                    "--oversubscribe",
                                    "--bind-to",
                                    "none",
                                    "--mca",
                                    "btl",
                                    "self,vader",
                                    "--mca",
                                    "btl_vader_single_copy_mechanism",
                                    "none"};
    if (geteuid() == 0) {  // containers: OpenMPI refuses root unless told twice, in mpirun and in each rank
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    }
    cmd.push_back(std::filesystem::read_symlink("/proc/self/exe").string());
    cmd.insert(cmd.end(), args.begin() + 1, args.end());
    std::vector<char*> argv;
    for (auto& c : cmd) argv.push_back(c.data());
    argv.push_back(nullptr);
    std::fprintf(stderr, "fanout: starting %d rank processes: mpirun -np %d ...\n", ep, ep);
    std::fflush(stderr);
    std::signal(SIGINT, remember_signal);
    std::signal(SIGTERM, remember_signal);
    const pid_t child = fork();
    FANOUT_CHECK(child >= 0, "--ranks processes: fork failed ({})", std::strerror(errno));
    if (child == 0) {
        // Its own process group, so a terminal's Ctrl-C reaches only this parent (which hands it to
        // rank 0), and ended with the parent should that die.
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        std::signal(SIGINT, SIG_DFL);
        std::signal(SIGTERM, SIG_DFL);
        execvp("mpirun", argv.data());
        std::fprintf(stderr,
                     "error: --ranks processes: could not start mpirun (%s); install OpenMPI or use --ranks "
                     "threads\n",
                     std::strerror(errno));
        _exit(2);
    }
    // The first signal goes to rank 0 (a clean stop); another one to mpirun (the job ends as
    // failed); a third kills mpirun.
    int forwarded = 0;
    for (;;) {
        int status = 0;
        const pid_t done = waitpid(child, &status, WNOHANG);
        if (done == child) std::exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
        if (const int sig = g_signal.exchange(0); sig != 0) {
            const pid_t rank0 = forwarded == 0 ? find_rank0(child) : -1;
            kill(rank0 > 0 ? rank0 : child, forwarded >= 2 ? SIGKILL : sig);  // no rank 0 yet: mpirun ends the job
            ++forwarded;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
}
#endif

}  // namespace

void Deployment::join_world(int& ep, std::string& ranks, const std::string& device, bool several_engines) {
    FANOUT_CHECK(ranks == "threads" || ranks == "processes", "--ranks must be threads or processes, got '{}'", ranks);
    const auto launched = [&](const char* by) {
        FANOUT_CHECK(ep == 0 || ep == world, "--ep {}: {} started {} processes (one rank each)", ep, by, world);
        ep = world;
        ranks = "processes";
    };
#ifdef FANOUT_WITH_MPI
    if (comm::launched_by_mpi()) {
        mpi = std::make_unique<comm::MpiSession>();
        const int procs = mpi->world();
        FANOUT_CHECK(several_engines || mpi->router() < 0,
                     "this launch has a fanout router: start the engines behind it with `fanout engine`");
        const int group = ep == 0 ? procs : ep;
        FANOUT_CHECK(several_engines || group == procs, "--ep {}: the launcher started {} processes (one rank each)",
                     ep, procs);
        FANOUT_CHECK(procs % group == 0, "--ep {}: the launcher started {} engine processes, not a multiple of {}", ep,
                     procs, ep);
        engines = procs / group;
        engine_index = mpi->rank() / group;
        comm = engines == 1 ? mpi->comm() : mpi->split(engine_index, mpi->rank());
        MPI_Comm_rank(comm, &rank);
        world = dp_world = group;
        local_rank = mpi->local_rank();
        local_processes = mpi->local_size();
        MPI_Comm host = MPI_COMM_NULL;
        MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host);
        int on_host = 0;
        MPI_Comm_size(host, &on_host);
        MPI_Comm_free(&host);
        one_host = on_host == world;
        launched("the launcher");
        if (world > 1) control = comm::make_mpi_control(comm);
        return;
    }
#endif
    const comm::RankInfo env = comm::rank_info_from_env();
    if (env.world > 1) {  // Kubernetes / torchrun style: the world from RANK / WORLD_SIZE
        rank = env.rank;
        world = dp_world = env.world;
        local_rank = env.local_rank;
        env_launched = true;
        launched("RANK / WORLD_SIZE");
        const char* local = std::getenv("LOCAL_WORLD_SIZE");
        one_host = local != nullptr && std::atoi(local) == world;
        local_processes = local != nullptr ? std::max(1, std::atoi(local)) : 1;
        FANOUT_CHECK(device == "cuda",
                     "RANK={} WORLD_SIZE={} without MPI: CPU ranks as processes exchange their tokens over MPI — start "
                     "them with mpirun (or --ranks processes); GPU ranks (--device cuda) need only this environment",
                     rank, world);
        const auto [host, port] = comm::master_address_from_env();
        FANOUT_CHECK(port < 65535, "environment: MASTER_PORT={}: the control plane needs the port after it", port);
        control = comm::make_tcp_control(env, host, port + 1, std::chrono::minutes(10));
        return;
    }
    if (ep == 0) ep = 1;
    if (ranks == "processes" && ep > 1) {
#ifdef FANOUT_WITH_MPI
        relaunch_under_mpirun(ep);
#else
        FANOUT_FAIL("--ranks processes: this fanout was built without MPI (libopenmpi-dev); use --ranks threads");
#endif
    }
}

void Deployment::make_cpu_ranks(std::vector<std::unique_ptr<model::DeepseekV3>> models, engine::EngineConfig ec,
                                const model::ForwardOptions& opts, int threads, DType kv_dtype,
                                const io::Tokenizer* tokenizer, int tp) {
    if (world == 1) {  // every rank here (world counts processes)
        this->threads = engine::make_cpu_dp_threads(std::move(models), ec, opts, threads, kv_dtype, tokenizer, tp);
        return;
    }
#ifdef FANOUT_WITH_MPI
    FANOUT_CHECK(mpi != nullptr,
                 "CPU ranks as processes exchange their tokens over MPI: start them with mpirun (or --ranks "
                 "processes), not with RANK / WORLD_SIZE alone");
    FANOUT_CHECK(models.size() == 1, "a rank process holds one model, got {}", models.size());
    FANOUT_CHECK(tp >= 1 && world % tp == 0, "--tp {} must divide the launcher's {} processes", tp, world);
    model::DeepseekV3& m = *models[0];
    // Every process is an EP rank (EP = DP × TP): the experts split over all of them.
    const comm::EpConfig epc =
        m.ep_config(ParallelConfig{rank, world, tp}, std::max<int64_t>(1, ec.scheduler.max_batched_tokens));
    ep = comm::make_mpi_ep(epc, comm);
    model::ForwardOptions o = opts;
    o.ep = ep.get();
    if (ec.microbatch != engine::EngineConfig::Microbatch::kOff) {
        microbatch_ep = comm::make_mpi_ep(epc, microbatch_comm());
        o.microbatch_ep = microbatch_ep.get();
    }
    if (tp == 1) {
        make_rank(std::make_unique<engine::DeepseekRunner>(std::move(models[0]), o, threads, kv_dtype), ec, tokenizer);
        return;
    }
    // TP groups of tp consecutive processes: the group's rank 0 is its DP rank (an engine, whose
    // runner sends every step to the others over the group's channel); the DP group's control
    // plane is theirs alone.
    TpGroup g = join_tp_group(tp, true);
    control.reset();  // (every process: the plane over all of them was a collective's)
    MPI_Comm leaders = MPI_COMM_NULL;
    MPI_Comm_split(comm, g.tp->rank() == 0 ? 0 : MPI_UNDEFINED, rank, &leaders);
    dp_world = world / tp;
    if (g.tp->rank() > 0) {
        tp_follower = [this, g = std::make_shared<TpGroup>(std::move(g)),
                       model = std::make_shared<decltype(models)>(std::move(models)), o, threads, kv_dtype]() mutable {
            engine::run_tp_follower(std::move((*model)[0]), o, threads, kv_dtype, std::move(g->tp), *g->channel);
        };
        return;
    }
    if (dp_world > 1) control = comm::make_mpi_control(leaders);
    MPI_Comm_free(&leaders);
    make_rank(std::make_unique<engine::DeepseekRunner>(std::move(models[0]), o, threads, kv_dtype, std::move(g.tp),
                                                       std::move(g.channel)),
              ec, tokenizer);
#else
    FANOUT_FAIL("CPU ranks as processes exchange their tokens over MPI: this fanout was built without it");
#endif
}

#ifdef FANOUT_WITH_MPI
Deployment::TpGroup Deployment::join_tp_group(int tp, bool channel) {
    FANOUT_CHECK(mpi != nullptr && tp >= 1 && world % tp == 0,
                 "--tp {}: TP groups as processes need mpirun and a "
                 "multiple of {} processes (the launcher started {})",
                 tp, tp, world);
    MPI_Comm group = MPI_COMM_NULL;
    MPI_Comm_split(comm, rank / tp, rank, &group);  // a collective of every process
    TpGroup g;
    g.tp = comm::make_mpi_tp(group);
    if (channel) g.channel = comm::make_mpi_control(group);
    MPI_Comm_free(&group);  // both hold duplicates
    return g;
}

MPI_Comm Deployment::microbatch_comm() {
    if (microbatch_comm_ == MPI_COMM_NULL) MPI_Comm_dup(comm, &microbatch_comm_);
    return microbatch_comm_;
}
#endif

void Deployment::make_rank(std::unique_ptr<engine::ModelRunner> runner, engine::EngineConfig ec,
                           const io::Tokenizer* tokenizer) {
    if (dp_world == 1) {
        engine = std::make_unique<engine::Engine>(std::move(runner), tokenizer, ec);
        return;
    }
    FANOUT_CHECK(control != nullptr, "rank {} of {}: no control plane (join_world first)", rank, world);
    ec.lockstep = true;
    process_rank = std::make_unique<engine::DpRank>(std::make_unique<engine::Engine>(std::move(runner), tokenizer, ec),
                                                    std::move(control));
}

void Deployment::barrier() { min_over_ranks(0); }

int64_t Deployment::min_over_ranks(int64_t v) {
    if (world == 1) return v;
    FANOUT_CHECK(control != nullptr, "rank {} of {}: no control plane here (after make_rank)", rank, world);
    std::vector<uint8_t> mine(sizeof(v));
    std::memcpy(mine.data(), &v, sizeof(v));
    const auto all = control->gather(mine);
    std::vector<uint8_t> out(sizeof(v));
    if (rank == 0) {
        int64_t lo = v;
        for (const auto& b : all) {
            FANOUT_CHECK(b.size() == sizeof(v), "control plane: a rank sent {} bytes for one number", b.size());
            int64_t x = 0;
            std::memcpy(&x, b.data(), sizeof(x));
            lo = std::min(lo, x);
        }
        std::memcpy(out.data(), &lo, sizeof(lo));
    }
    out = control->broadcast(out);
    FANOUT_CHECK(out.size() == sizeof(v), "control plane: rank 0 sent {} bytes for one number", out.size());
    std::memcpy(&v, out.data(), sizeof(v));
    return v;
}

#ifdef FANOUT_WITH_CUDA
GpuGroup::~GpuGroup() {
    if (comm) ncclCommDestroy(comm);
    if (stream) cudaStreamDestroy(stream);
}

void Deployment::select_gpu() {
    int count = 0;
    FANOUT_CHECK(cudaGetDeviceCount(&count) == cudaSuccess && count > 0, "--device cuda: no CUDA device is visible");
    FANOUT_CUDA_CHECK(cudaSetDevice(local_rank % count));
}

comm::ExpertParallel* Deployment::make_gpu_ep(const std::string& backend, const comm::EpConfig& config,
                                              bool microbatch) {
    const comm::GpuBackend b = comm::gpu_backend_from_name(backend);
    gpu = std::make_unique<GpuGroup>();
    ncclUniqueId id{};
    if (rank == 0) FANOUT_NCCL_CHECK(ncclGetUniqueId(&id));
    if (world > 1) {  // rank 0's id over the control plane: MPI's, or TCP's under RANK / WORLD_SIZE
        FANOUT_CHECK(control != nullptr, "rank {} of {}: no control plane to share NCCL's id over", rank, world);
        std::vector<uint8_t> blob(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof(id));
        blob = control->broadcast(std::move(blob));
        FANOUT_CHECK(blob.size() == sizeof(id), "NCCL id of {} bytes from rank 0, expected {}", blob.size(),
                     sizeof(id));
        std::memcpy(&id, blob.data(), sizeof(id));
    }
    FANOUT_NCCL_CHECK(ncclCommInitRank(&gpu->comm, world, id, rank));
    FANOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&gpu->stream, cudaStreamNonBlocking));
    ep = comm::make_gpu_ep(b, config, gpu->comm, gpu->stream);
    if (microbatch) microbatch_ep = comm::make_gpu_ep(b, config, gpu->comm, gpu->stream);
    return ep.get();
}
#endif

bool Deployment::all_local() const { return world == 1 || one_host; }

void Deployment::announce(const std::string& address) {
#ifdef FANOUT_WITH_MPI
    if (mpi) mpi->announce(address);
#else
    (void)address;
#endif
}

bool Deployment::follows() const { return (process_rank && rank != 0) || tp_follower != nullptr; }

void Deployment::follow() {
    FANOUT_CHECK(follows(), "rank {} leads the deployment; only ranks past 0 follow", rank);
    if (tp_follower) return tp_follower();
    process_rank->run();
}

engine::RequestService& Deployment::service() {
    if (threads) return threads->lead();
    if (process_rank) return *process_rank;
    FANOUT_CHECK(engine != nullptr, "no engine in this deployment");
    return *engine;
}

void Deployment::start() {
    if (engine) engine->start();
    if (threads) threads->start();
    if (process_rank && rank == 0 && !loop.joinable())
        loop = std::thread([this] {
            try {
                process_rank->run();
            } catch (const std::exception&) {  // kept by the rank (failure()); MPI has ended the job already
            }
        });
}

void Deployment::stop() {
    if (engine) engine->stop();
    if (threads) threads->stop();
    if (process_rank && rank == 0) process_rank->stop();
    if (loop.joinable()) loop.join();
}

std::string Deployment::failure() const {
    if (threads) return threads->failure();
    if (process_rank) return process_rank->failure();
    return "";
}

}  // namespace fanout::cli

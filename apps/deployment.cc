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

void Deployment::join_world(int& ep, std::string& ranks) {
    FANOUT_CHECK(ranks == "threads" || ranks == "processes", "--ranks must be threads or processes, got '{}'", ranks);
#ifdef FANOUT_WITH_MPI
    if (comm::launched_by_mpi()) {
        mpi = std::make_unique<comm::MpiSession>();
        rank = mpi->rank();
        world = mpi->world();
        local_rank = comm::rank_info_from_env().local_rank;
        FANOUT_CHECK(ep == 0 || ep == world, "--ep {}: the launcher started {} processes (one rank each)", ep, world);
        ep = world;
        ranks = "processes";
        return;
    }
#endif
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
                                const io::Tokenizer* tokenizer) {
    if (world == 1) {  // every rank here (world counts processes)
        this->threads = engine::make_cpu_dp_threads(std::move(models), ec, opts, threads, kv_dtype, tokenizer);
        return;
    }
#ifdef FANOUT_WITH_MPI
    FANOUT_CHECK(models.size() == 1, "a rank process holds one model, got {}", models.size());
    model::DeepseekV3& m = *models[0];
    ep = comm::make_mpi_ep(
        m.ep_config(ParallelConfig{rank, world, 1}, std::max<int64_t>(1, ec.scheduler.max_batched_tokens)),
        MPI_COMM_WORLD);
    model::ForwardOptions o = opts;
    o.ep = ep.get();
    make_rank(std::make_unique<engine::DeepseekRunner>(std::move(models[0]), o, threads, kv_dtype), ec, tokenizer);
#endif
}

void Deployment::make_rank(std::unique_ptr<engine::ModelRunner> runner, engine::EngineConfig ec,
                           const io::Tokenizer* tokenizer) {
    if (world == 1) {
        engine = std::make_unique<engine::Engine>(std::move(runner), tokenizer, ec);
        return;
    }
#ifdef FANOUT_WITH_MPI
    ec.lockstep = true;
    mpi_rank = std::make_unique<engine::DpRank>(std::make_unique<engine::Engine>(std::move(runner), tokenizer, ec),
                                                comm::make_mpi_control(MPI_COMM_WORLD));
#endif
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

comm::ExpertParallel* Deployment::make_gpu_ep(const std::string& backend, const comm::EpConfig& config) {
    const comm::GpuBackend b = comm::gpu_backend_from_name(backend);
    gpu = std::make_unique<GpuGroup>();
    ncclUniqueId id{};
    if (rank == 0) FANOUT_NCCL_CHECK(ncclGetUniqueId(&id));
#ifdef FANOUT_WITH_MPI
    if (world > 1) {
        std::vector<uint8_t> blob(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof(id));
        blob = comm::mpi_broadcast(std::move(blob), MPI_COMM_WORLD);
        FANOUT_CHECK(blob.size() == sizeof(id), "NCCL id of {} bytes from rank 0, expected {}", blob.size(),
                     sizeof(id));
        std::memcpy(&id, blob.data(), sizeof(id));
    }
#endif
    FANOUT_NCCL_CHECK(ncclCommInitRank(&gpu->comm, world, id, rank));
    FANOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&gpu->stream, cudaStreamNonBlocking));
    ep = comm::make_gpu_ep(b, config, gpu->comm, gpu->stream);
    return ep.get();
}
#endif

void Deployment::barrier() const {
#ifdef FANOUT_WITH_MPI
    if (world > 1) MPI_Barrier(MPI_COMM_WORLD);
#endif
}

int64_t Deployment::min_over_ranks(int64_t v) const {
#ifdef FANOUT_WITH_MPI
    if (world > 1) {
        int64_t out = v;
        MPI_Allreduce(&v, &out, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
        return out;
    }
#endif
    return v;
}

bool Deployment::all_local() const {
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    return world == 1 || (local != nullptr && std::atoi(local) == world);
}

bool Deployment::follows() const {
#ifdef FANOUT_WITH_MPI
    return mpi_rank && rank != 0;
#else
    return false;
#endif
}

void Deployment::follow() {
#ifdef FANOUT_WITH_MPI
    FANOUT_CHECK(follows(), "rank {} leads the deployment; only ranks past 0 follow", rank);
    mpi_rank->run();
#endif
}

engine::RequestService& Deployment::service() {
    if (threads) return threads->lead();
#ifdef FANOUT_WITH_MPI
    if (mpi_rank) return *mpi_rank;
#endif
    FANOUT_CHECK(engine != nullptr, "no engine in this deployment");
    return *engine;
}

void Deployment::start() {
    if (engine) engine->start();
    if (threads) threads->start();
#ifdef FANOUT_WITH_MPI
    if (mpi_rank && !mpi_loop.joinable())
        mpi_loop = std::thread([this] {
            try {
                mpi_rank->run();
            } catch (const std::exception&) {  // the control plane ended the job, naming the rank
            }
        });
#endif
}

void Deployment::stop() {
    if (engine) engine->stop();
    if (threads) threads->stop();
#ifdef FANOUT_WITH_MPI
    if (mpi_rank && rank == 0) mpi_rank->stop();
    if (mpi_loop.joinable()) mpi_loop.join();
#endif
}

std::string Deployment::failure() const {
    if (threads) return threads->failure();
#ifdef FANOUT_WITH_MPI
    if (mpi_rank) return mpi_rank->failure();
#endif
    return "";
}

}  // namespace fanout::cli

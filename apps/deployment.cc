#include "deployment.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "fanout/core/error.h"

namespace fanout::cli {
namespace {

#ifdef FANOUT_WITH_MPI
// `--ranks processes` without a launcher: this command again, under mpirun on this host (the
// launcher gives each process its rank; ranks past 0 serve their experts, rank 0 the front end).
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
    execvp("mpirun", argv.data());
    FANOUT_FAIL("--ranks processes: could not start mpirun ({}); install OpenMPI or use --ranks threads",
                std::strerror(errno));
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
    mpi_ep = comm::make_mpi_ep(
        m.ep_config(ParallelConfig{rank, world, 1}, std::max<int64_t>(1, ec.scheduler.max_batched_tokens)),
        MPI_COMM_WORLD);
    model::ForwardOptions o = opts;
    o.ep = mpi_ep.get();
    ec.lockstep = true;
    auto e = std::make_unique<engine::Engine>(
        std::make_unique<engine::DeepseekRunner>(std::move(models[0]), o, threads, kv_dtype), tokenizer, ec);
    mpi_rank = std::make_unique<engine::DpRank>(std::move(e), comm::make_mpi_control(MPI_COMM_WORLD));
#endif
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

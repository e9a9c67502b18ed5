// What runs requests on the CPU path: one engine, or this process's part of a data-parallel group
// of expert-parallel ranks (engine/dp_group.h) — every rank as a thread here (`--ranks threads`),
// or this process's rank under an MPI launcher, whose other ranks are other processes. `serve`
// and `generate --ep N` share it.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fanout/engine/dp_group.h"
#include "fanout/engine/engine.h"
#ifdef FANOUT_WITH_MPI
#include "fanout/comm/mpi_ep.h"
#endif

namespace fanout::cli {

struct Deployment {
    std::unique_ptr<engine::Engine> engine;          // one rank
    std::unique_ptr<engine::DpThreadGroup> threads;  // ranks as threads
#ifdef FANOUT_WITH_MPI
    std::unique_ptr<comm::MpiSession> mpi;
    std::unique_ptr<comm::ExpertParallel> mpi_ep;  // the runner's EP endpoint: outlives the rank
    std::unique_ptr<engine::DpRank> mpi_rank;
    std::thread mpi_loop;
#endif
    int rank = 0, world = 1;  // this process's rank among the processes of the deployment

    ~Deployment() { stop(); }

    // The world before anything is loaded. Under an MPI launcher: MPI starts, each process is one
    // rank and `ep` becomes the launcher's world (a different --ep is an error); `ranks` becomes
    // "processes". `--ranks processes` without a launcher: this command is started again under
    // mpirun on this host (does not return). `ep` 0 means 1.
    void join_world(int& ep, std::string& ranks);
    // The group's engines from models[r] = rank (this->rank + r)'s model: all ranks as threads when
    // models.size() is the world, else this process's one rank joined to the others over MPI.
    void make_cpu_ranks(std::vector<std::unique_ptr<model::DeepseekV3>> models, engine::EngineConfig ec,
                        const model::ForwardOptions& opts, int threads, DType kv_dtype, const io::Tokenizer* tokenizer);

    // Whether this process is a rank past 0 of a multi-process group: it runs follow(), not a front end.
    bool follows() const;
    // Ranks past 0: serve the group until rank 0 stops it (a failure ends the job, naming the rank).
    void follow();

    // Rank 0: where requests go.
    engine::RequestService& service();
    void start();
    void stop();
    // The group's failure (a rank that failed stops every rank), or empty.
    std::string failure() const;
};

}  // namespace fanout::cli

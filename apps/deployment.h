// What runs requests: one engine, or this process's part of a data-parallel group of
// expert-parallel ranks (engine/dp_group.h) — every rank as a thread here (`--ranks threads`), or
// this process's one rank, the others being other processes: started by an MPI launcher (the
// control plane over MPI), or by one that only sets RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT
// like Kubernetes or torchrun (the control plane over TCP at MASTER_PORT + 1; GPU ranks only, the
// CPU path's tokens travel over MPI). `serve` and `generate` share it.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fanout/engine/dp_group.h"
#include "fanout/engine/engine.h"
#ifdef FANOUT_WITH_MPI
#include "fanout/comm/mpi_ep.h"
#endif
#ifdef FANOUT_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace fanout::cli {

#ifdef FANOUT_WITH_CUDA
// This process's GPU in an EP group: an NCCL communicator over the group and the stream every
// step runs on (the EP backend's and the runner's).
struct GpuGroup {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    GpuGroup() = default;
    GpuGroup(const GpuGroup&) = delete;
    GpuGroup& operator=(const GpuGroup&) = delete;
    ~GpuGroup();
};
#endif

struct Deployment {
    // Declared in the order of their lifetimes: MPI outlives the GPU group, which outlives the EP
    // endpoint, which outlives the engines whose runners hold it.
#ifdef FANOUT_WITH_MPI
    std::unique_ptr<comm::MpiSession> mpi;
#endif
#ifdef FANOUT_WITH_CUDA
    std::unique_ptr<GpuGroup> gpu;
#endif
    std::unique_ptr<comm::ExpertParallel> ep;             // this process's EP endpoint (one rank per process)
    std::unique_ptr<comm::ExpertParallel> microbatch_ep;  // ... for the second microbatch
    std::unique_ptr<comm::ControlPlane> control;          // world > 1, until make_rank hands it to the rank
    std::unique_ptr<engine::Engine> engine;               // one rank
    std::unique_ptr<engine::DpThreadGroup> threads;       // ranks as threads
    std::unique_ptr<engine::DpRank> process_rank;         // this process's rank of a multi-process group
    std::thread loop;                                     // rank 0's step loop (process_rank)
    int rank = 0, world = 1;                              // this process's rank among the processes of the deployment
    int local_rank = 0;                                   // ... among the job's ranks on this host (its GPU)
    int engine_index = 0, engines = 1;                    // `fanout engine` under a launcher: which of how many
    int local_processes = 1;                              // the launch's rank processes on this host (their cores)
    int dp_world = 1;                                     // DP ranks (engines): world, or world / tp (TP processes)
    // A TP rank past 0 as a process (make_cpu_ranks with tp > 1): what follow() runs.
    std::function<void()> tp_follower;
#ifdef FANOUT_WITH_MPI
    MPI_Comm comm = MPI_COMM_NULL;  // the deployment's processes (mpi), owned by the session
    // A duplicate of `comm` for the second microbatch's exchanges (made on first use: a collective
    // of the deployment's processes; freed with MPI).
    MPI_Comm microbatch_comm();
    MPI_Comm microbatch_comm_ = MPI_COMM_NULL;
    // This process's TP group under MPI: its tp consecutive ranks (a collective of every process).
    // `tp`: this rank's endpoint of the group's collectives; `channel` (when asked for): the group's
    // control plane, over which its rank 0's runner sends every step.
    struct TpGroup {
        std::unique_ptr<comm::TensorParallel> tp;
        std::unique_ptr<comm::ControlPlane> channel;
    };
    TpGroup join_tp_group(int tp, bool channel);
#endif
    bool one_host = true;       // every rank of the deployment is on this host
    bool env_launched = false;  // RANK / WORLD_SIZE without MPI: the control plane (and NCCL's id) over TCP

    ~Deployment() { stop(); }

    // The world before anything is loaded. Under a launcher (MPI's environment, or RANK /
    // WORLD_SIZE > 1): each process is one rank, `ep` becomes the launcher's world (a different
    // --ep is an error), `ranks` becomes "processes", and the control plane connects. `--ranks
    // processes` without a launcher: this command is started again under mpirun on this host (does
    // not return). `ep` 0 means 1.
    // `several_engines` (`fanout engine`): under mpirun the processes (a router's left out) form
    // world / ep engines of `ep` ranks each (`ep` 0: one of them all); this process's is
    // engine_index. Otherwise a router in the launch is an error (this command is a front end).
    // `device`: "cpu" ranks need MPI for their tokens (refused under RANK / WORLD_SIZE alone).
    void join_world(int& ep, std::string& ranks, const std::string& device, bool several_engines = false);
    // Where this process serves its engine (empty: a rank past 0), to the launch's router, if any.
    void announce(const std::string& address);
    // The group's engines from models[r] = rank (this->rank + r)'s model: all ranks as threads when
    // models.size() is the world, else this process's one rank joined to the others over MPI.
    // `tp`: the models are TP groups of tp consecutive ranks (threads only).
    void make_cpu_ranks(std::vector<std::unique_ptr<model::DeepseekV3>> models, engine::EngineConfig ec,
                        const model::ForwardOptions& opts, int threads, DType kv_dtype, const io::Tokenizer* tokenizer,
                        int tp = 1);

    // This process's rank from its runner (which holds `ep` when world > 1): one engine (world 1),
    // or a lockstep engine joined to the other processes' through the control plane.
    void make_rank(std::unique_ptr<engine::ModelRunner> runner, engine::EngineConfig ec,
                   const io::Tokenizer* tokenizer);
#ifdef FANOUT_WITH_CUDA
    // Makes this process's GPU current: the launcher's local rank, modulo the visible GPUs. Call
    // before anything touches the device.
    void select_gpu();
    // This rank's GPU EP backend ("nvlink" or "nccl") over the processes of the deployment (this
    // process alone at world 1): the NCCL communicator (its id from rank 0 over MPI, or over TCP
    // at MASTER_ADDR:MASTER_PORT), the stream (gpu->stream) and the backend, kept in `ep`; with
    // `microbatch` a second backend on the same communicator and stream for the second
    // microbatch's exchanges, kept in `microbatch_ep`.
    comm::ExpertParallel* make_gpu_ep(const std::string& backend, const comm::EpConfig& config,
                                      bool microbatch = false);
#endif

    // Before make_rank, through the control plane (nothing at world 1): waits for every process
    // of the deployment; the smallest `v` of any process (limits every rank must share).
    void barrier();
    int64_t min_over_ranks(int64_t v);

    // Whether every rank of the deployment runs on this host.
    bool all_local() const;

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

// The `mpi` EP backend: ranks are processes under `mpirun` (or any MPI launcher), buffers in host
// memory, the exchanges MPI all-to-all-v over the group's communicator. dispatch_send and
// combine_send swap the per-peer counts (blocking MPI_Alltoall) and post the payload exchange
// (MPI_Ialltoallv); the matching recv waits for it and unpacks, so work between the halves
// overlaps the transfer. The receive layout and rounding match the `local` backend exactly.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fanout/comm/control_plane.h"
#include "fanout/comm/ep.h"
#include "fanout/core/api_error.h"

// An MPI call that must succeed: fanout::Error naming the statement, the code and MPI's own text
// (the EP backend, the control plane and the TP group share it).
#define FANOUT_MPI_CHECK(stmt)                                                              \
    do {                                                                                    \
        const int mpi_rc_ = (stmt);                                                         \
        if (mpi_rc_ != MPI_SUCCESS) {                                                       \
            char mpi_msg_[MPI_MAX_ERROR_STRING];                                            \
            int mpi_len_ = 0;                                                               \
            MPI_Error_string(mpi_rc_, mpi_msg_, &mpi_len_);                                 \
            ::fanout::throw_api_error(__FILE__, __LINE__, "MPI", #stmt, mpi_rc_, mpi_msg_); \
        }                                                                                   \
    } while (0)

namespace fanout::comm {

// Whether an MPI launcher (mpirun, srun with PMIx) started this process: its environment says so.
bool launched_by_mpi();

// MPI for the lifetime of this object in a process an MPI launcher started: initialised with
// MPI_THREAD_SERIALIZED (one thread at a time makes MPI calls: a rank's step loop), finalised on
// destruction — unless an exception is unwinding it (then see abort_mpi_job). One per process.
//
// One launch may hold a router beside the engines' ranks (MPMD: `mpirun -np 1 fanout router ... :
// -np 4 fanout engine ...`): every process says its role at start-up (a collective over
// MPI_COMM_WORLD), and rank(), world() and comm() are then those of the processes of this one's
// role — the router's are left out of the engines' world. Engines announce() where they serve
// once they listen; the router collects every rank's announcement.
class MpiSession {
  public:
    enum class Role { kRank, kRouter };
    explicit MpiSession(Role role = Role::kRank);
    ~MpiSession();
    MpiSession(const MpiSession&) = delete;
    MpiSession& operator=(const MpiSession&) = delete;
    int rank() const { return rank_; }
    int world() const { return world_; }
    MPI_Comm comm() const { return comm_; }         // the processes of this role
    int local_rank() const { return local_rank_; }  // ... among those on this host
    int local_size() const { return local_size_; }
    // The MPI_COMM_WORLD rank of the job's router, or -1 when it has none.
    int router() const { return router_; }
    // A communicator of the processes of this role that pass the same `color` (collective over
    // comm(); kept until the session ends).
    MPI_Comm split(int color, int key);
    // Engines' ranks, each once: where this process serves its engine's gRPC ("host:port"; empty
    // for a rank that is not a front end), to the job's router (nothing when it has none).
    void announce(const std::string& address) const;
    // The router: every rank's announcement (waiting as long as it takes, `progress` called every
    // 30 s with how many came), the non-empty ones in rank order.
    std::vector<std::string> collect_announcements(const std::function<void(int got, int want)>& progress) const;

  private:
    int rank_ = 0, world_ = 1, local_rank_ = 0, local_size_ = 1, router_ = -1;
    MPI_Comm comm_ = MPI_COMM_NULL;
    std::vector<MPI_Comm> owned_;  // freed before MPI_Finalize
};

// After an error that left MPI running on this rank (its session unwound without finalising): ends
// the whole job with `code` — the other ranks may be waiting for this one in a collective.
void abort_mpi_job(int code);

// `config.rank` and `config.world` must be the rank and size of `comm` (checked); MPI must be
// initialised. The communicator is borrowed, not freed.
std::unique_ptr<ExpertParallel> make_mpi_ep(const EpConfig& config, MPI_Comm comm);

// The DP group's control plane over MPI (control_plane.h) on a duplicate of `comm`; waits for the
// ranks' reports longer than `timeout` throw. abort() prints the reason and ends the job
// (MPI_Abort on MPI_COMM_WORLD).
std::unique_ptr<ControlPlane> make_mpi_control(MPI_Comm comm,
                                               std::chrono::milliseconds timeout = std::chrono::minutes(10));

// A TP group's endpoint (tensor_parallel.h) over `comm` — the TP ranks of one DP group as
// processes — on a duplicate of it. The all-reduce adds the ranks' values in rank order on every
// rank, as the local group does.
class TensorParallel;
std::unique_ptr<TensorParallel> make_mpi_tp(MPI_Comm comm);

// Rank 0's `blob` on every rank of `comm` (size first, then bytes): how NCCL's unique id travels
// when the launcher is mpirun.
std::vector<uint8_t> mpi_broadcast(std::vector<uint8_t> blob, MPI_Comm comm);

}  // namespace fanout::comm

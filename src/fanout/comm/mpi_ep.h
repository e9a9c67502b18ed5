// The `mpi` EP backend: ranks are processes under `mpirun` (or any MPI launcher), buffers in host
// memory, the exchanges MPI all-to-all-v over the group's communicator. dispatch_send and
// combine_send swap the per-peer counts (blocking MPI_Alltoall) and post the payload exchange
// (MPI_Ialltoallv); the matching recv waits for it and unpacks, so work between the halves
// overlaps the transfer. The receive layout and rounding match the `local` backend exactly.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "fanout/comm/control_plane.h"
#include "fanout/comm/ep.h"

namespace fanout::comm {

// Whether an MPI launcher (mpirun, srun with PMIx) started this process: its environment says so.
bool launched_by_mpi();

// MPI for the lifetime of this object in a process an MPI launcher started: initialised with
// MPI_THREAD_SERIALIZED (one thread at a time makes MPI calls: a rank's step loop), finalised on
// destruction — unless an exception is unwinding it (then see abort_mpi_job). One per process.
class MpiSession {
  public:
    MpiSession();
    ~MpiSession();
    MpiSession(const MpiSession&) = delete;
    MpiSession& operator=(const MpiSession&) = delete;
    int rank() const { return rank_; }
    int world() const { return world_; }

  private:
    int rank_ = 0, world_ = 1;
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

// Rank 0's `blob` on every rank of `comm` (size first, then bytes): how NCCL's unique id travels
// when the launcher is mpirun.
std::vector<uint8_t> mpi_broadcast(std::vector<uint8_t> blob, MPI_Comm comm);

}  // namespace fanout::comm

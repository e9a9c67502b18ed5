// The `mpi` EP backend: ranks are processes under `mpirun` (or any MPI launcher), buffers in host
// memory, the exchanges MPI all-to-all-v over the group's communicator. dispatch_send and
// combine_send swap the per-peer counts (blocking MPI_Alltoall) and post the payload exchange
// (MPI_Ialltoallv); the matching recv waits for it and unpacks, so work between the halves
// overlaps the transfer. The receive layout and rounding match the `local` backend exactly.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "fanout/comm/ep.h"

namespace fanout::comm {

// `config.rank` and `config.world` must be the rank and size of `comm` (checked); MPI must be
// initialised. The communicator is borrowed, not freed.
std::unique_ptr<ExpertParallel> make_mpi_ep(const EpConfig& config, MPI_Comm comm);

// Rank 0's `blob` on every rank of `comm` (size first, then bytes): how NCCL's unique id travels
// when the launcher is mpirun.
std::vector<uint8_t> mpi_broadcast(std::vector<uint8_t> blob, MPI_Comm comm);

}  // namespace fanout::comm

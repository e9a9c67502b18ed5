// Bootstrap of a multi-process group: who am I (rank, world, local rank) from the launcher's
// environment, and a small rendezvous that hands every rank the same bytes (NCCL's unique id) from
// rank 0 — over TCP for launchers without MPI (Kubernetes pods, torchrun-style), or over MPI.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fanout/comm/control_plane.h"

namespace fanout::comm {

struct RankInfo {
    int rank = 0;
    int world = 1;
    int local_rank = 0;
};

// OpenMPI's OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK when set, else RANK / WORLD_SIZE /
// LOCAL_RANK (torchrun, Kubernetes), else one rank. A malformed or inconsistent value (not a
// number, rank outside [0, world)) throws fanout::Error naming the variable.
RankInfo rank_info_from_env();

// Rank 0 listens on host:port and sends `blob` to each of the other world − 1 ranks, which connect
// (retrying until `timeout`) and receive it; every rank returns the blob. Throws fanout::Error
// naming the address, the peer and what failed (nobody listening, a peer that never came, a short
// read) — never hangs past `timeout`.
std::vector<uint8_t> tcp_broadcast(const RankInfo& me, const std::string& host, int port, std::vector<uint8_t> blob,
                                   std::chrono::milliseconds timeout);

// The DP group's control plane (control_plane.h) over TCP, for launchers without MPI (Kubernetes
// pods, torchrun-style RANK / WORLD_SIZE / MASTER_ADDR): rank 0 listens on host:port and keeps a
// connection to every other rank, which connects (retrying until `connect_timeout`). Frames are a
// kind (data or abort), a size and the bytes. A rank's abort() reaches rank 0, which passes it to
// every rank; a connection that closes is an abort naming the rank (it failed or exited). Rank 0
// reads the step reports side by side as their bytes come, so a report cut off half-way delays no
// other rank's abort. Report waits and sends past `report_timeout` throw naming the rank (a frame
// cut off by one is the connection's last: the peer sees the stream end inside it); an idle rank
// waits for rank 0 without one.
std::unique_ptr<ControlPlane> make_tcp_control(const RankInfo& me, const std::string& host, int port,
                                               std::chrono::milliseconds connect_timeout,
                                               std::chrono::milliseconds report_timeout = std::chrono::minutes(10));

// MASTER_ADDR and MASTER_PORT (the torchrun convention), checked; defaults 127.0.0.1:29500.
std::pair<std::string, int> master_address_from_env();

}  // namespace fanout::comm

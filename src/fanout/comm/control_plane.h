// The control plane of a data-parallel group: once per step, rank 0's message to every rank
// (what to run: new requests, cancellations, stop) and every rank's message back to rank 0 (the
// tokens it produced, its load). The data plane — the MoE layers' dispatch and combine — is the
// EP backend (ep.h); the two are separate so that requests and results never travel through the
// experts' buffers. Messages are opaque bytes here; engine/dp_group.h gives them their meaning.
//
// Backends: `local` (ranks as threads of one process, below) and `mpi` (ranks as processes under
// an MPI launcher, mpi_ep.h). Every rank calls broadcast() then gather() each step, in that order.
// A rank idle between steps waits in broadcast() without spinning; the waits for a step's reports
// are bounded by a timeout, and abort() stops the group: every wait, now or later, throws
// fanout::Error with the reason — never a hang.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace fanout::comm {

class ControlPlane {
  public:
    virtual ~ControlPlane() = default;
    virtual int rank() const = 0;
    virtual int world() const = 0;
    // Rank 0: sends `message` to every rank and returns it. Others (`message` ignored): waits for
    // rank 0's next message, however long the group stays idle, and returns it.
    virtual std::vector<uint8_t> broadcast(std::vector<uint8_t> message) = 0;
    // Rank 0: every rank's message, by rank. Others: sends `message`, returns nothing.
    virtual std::vector<std::vector<uint8_t>> gather(std::vector<uint8_t> message) = 0;
    // Stops the group with `reason` (which should name the failed rank). Local: every rank's wait
    // throws. MPI: the launcher's job ends (MPI_Abort) after the reason is printed.
    virtual void abort(const std::string& reason) = 0;
    // The reason the group was stopped (by any rank), or empty while it runs.
    virtual std::string abort_reason() const = 0;
};

// The `local` control plane: one hub per group, one endpoint per rank (thread).
class LocalControlHub {
  public:
    // `timeout` bounds the wait for the other ranks' reports of a step; `on_abort` runs once, on
    // the first abort (the thread group stops its EP fabric with it).
    explicit LocalControlHub(int world, std::chrono::milliseconds timeout = std::chrono::minutes(10),
                             std::function<void(const std::string&)> on_abort = {});
    ~LocalControlHub();
    LocalControlHub(const LocalControlHub&) = delete;
    LocalControlHub& operator=(const LocalControlHub&) = delete;

    // Rank r's endpoint; the hub must outlive it.
    std::unique_ptr<ControlPlane> endpoint(int rank);
    void abort(const std::string& reason);
    // The first abort's reason, or empty.
    std::string abort_reason() const;

  private:
    friend class LocalControl;
    std::vector<uint8_t> broadcast(int rank, std::vector<uint8_t> message);
    std::vector<std::vector<uint8_t>> gather(int rank, std::vector<uint8_t> message);

    const int world_;
    const std::chrono::milliseconds timeout_;
    std::function<void(const std::string&)> on_abort_;
    mutable std::mutex mutex_;
    std::condition_variable cv_;
    std::string abort_reason_;
    int64_t broadcasts_ = 0;         // messages rank 0 has sent
    std::vector<uint8_t> message_;   // the latest of them
    std::vector<int64_t> received_;  // per rank: messages taken
    std::vector<std::vector<uint8_t>> reports_;
    std::vector<int64_t> reported_;  // per rank: reports given
    int64_t collected_ = 0;          // report rounds rank 0 has taken
};

}  // namespace fanout::comm

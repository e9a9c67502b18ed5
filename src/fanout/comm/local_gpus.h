// The GPUs of this process as ranks of one NCCL communicator: a host thread, a stream and a
// communicator per GPU (one unique id, ncclCommInitRank on each rank's thread), peer access enabled
// where the hardware allows. For the tests and benchmarks that drive every rank from one process
// (`ep_gpu_test`, `fanout bench comm`); deployments run one process per GPU (comm/bootstrap.h).
// NVLink multicast stays off (NCCL_NVLS_ENABLE=0 unless the environment says otherwise).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <barrier>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fanout::comm {

class LocalGpus {
  public:
    // Ranks 0 … world − 1 on devices 0 … world − 1; throws fanout::Error naming a rank that failed.
    explicit LocalGpus(int world);
    ~LocalGpus();
    LocalGpus(const LocalGpus&) = delete;
    LocalGpus& operator=(const LocalGpus&) = delete;

    int world() const { return static_cast<int>(comms_.size()); }
    ncclComm_t comm(int rank) const { return comms_[rank]; }
    cudaStream_t stream(int rank) const { return streams_[rank]; }

    // fn(rank) on a thread per rank with that rank's GPU current; one entry per rank: "" where fn
    // returned, else "rank R: what it threw".
    std::vector<std::string> run(const std::function<void(int rank)>& fn);
    // A barrier of the rank threads, for use inside run(). Throws fanout::Error once a rank's fn
    // has thrown (that rank leaves the barrier), so the others do not wait for it forever — unless
    // they wait inside NCCL, which governs its own hangs.
    void sync();

  private:
    std::atomic<bool> failed_{false};
    std::vector<ncclComm_t> comms_;
    std::vector<cudaStream_t> streams_;
    // Made afresh by each run(): a rank that throws drops out of it for good (arrive_and_drop),
    // which must not carry over to the next run's sync().
    std::unique_ptr<std::barrier<>> barrier_;
};

}  // namespace fanout::comm

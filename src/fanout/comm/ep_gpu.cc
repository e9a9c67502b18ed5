#include "fanout/comm/ep_gpu.h"

#include "fanout/core/error.h"

namespace fanout::comm {

std::unique_ptr<ExpertParallel> make_gpu_ep(GpuBackend backend, const EpConfig& config, ncclComm_t comm,
                                            cudaStream_t stream, const GpuEpOptions& options) {
    validate(config);
    FANOUT_CHECK(config.payload != Payload::kF32,
                 "EP: the GPU backends carry FP8 or bf16 tokens; the f32 payload is for the host backends");
    int n = 0, rank = -1;
    FANOUT_CHECK(ncclCommCount(comm, &n) == ncclSuccess && ncclCommUserRank(comm, &rank) == ncclSuccess,
                 "EP: cannot query the NCCL communicator");
    FANOUT_CHECK(n == config.world && rank == config.rank,
                 "EP: the NCCL communicator has {} ranks with this one {}, the EP config says world {} rank {}", n,
                 rank, config.world, config.rank);
    FANOUT_CHECK(options.timeout_ms > 0, "EP: timeout_ms must be positive, got {}", options.timeout_ms);
    return backend == GpuBackend::kNvlink ? make_nvlink_ep(config, comm, stream, options)
                                          : make_nccl_ep(config, comm, stream, options);
}

GpuBackend gpu_backend_from_name(const std::string& name) {
    if (name == "nvlink") return GpuBackend::kNvlink;
    if (name == "nccl") return GpuBackend::kNccl;
    FANOUT_FAIL("unknown GPU EP backend '{}': the backends are 'nvlink' and 'nccl'", name);
}

const char* gpu_backend_name(GpuBackend b) { return b == GpuBackend::kNvlink ? "nvlink" : "nccl"; }

}  // namespace fanout::comm

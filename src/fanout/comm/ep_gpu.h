// The GPU EP backends (CUDA builds). One rank = one GPU; every pointer of DispatchInput,
// ExpertBatch and the combine calls is device memory, the token count included; every call only
// enqueues work on the backend's stream and returns (no host synchronization), so a whole step
// can be captured in a CUDA graph and replayed with other counts.
//
//  * kNvlink: kernels that write straight into the peers' receive buffers through NCCL 2.28's
//    device API — a symmetric window (ncclMemAlloc + ncclCommWindowRegister) and LSA pointers
//    (ncclGetLsaPointer) — for the GPUs one NVLink domain connects. When no row can be dropped
//    (the default max_m) each row claims its place on the destination with an atomic and goes at
//    once, one kernel per half; with a smaller max_m counts go first, then rows, in order.
//    Receivers wait on flags, with a timeout.
//  * kNccl: host-side grouped ncclSend/ncclRecv of fixed-size (padded) per-peer buffers: works
//    across nodes (IB, sockets), the portable path and the baseline.
//
// Device-side waits time out after GpuEpOptions::timeout_ms; the kernel records the peer it
// waited for in host-mapped memory and raise_if_failed() (call it after synchronizing the stream)
// throws an Error naming that peer and the step's phase.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <string>

#include "fanout/comm/ep.h"

namespace fanout::comm {

enum class GpuBackend { kNvlink, kNccl };

struct GpuEpOptions {
    int timeout_ms = 10000;  // a device-side wait longer than this is an error naming the peer
};

// `comm` spans exactly config.world ranks with config.rank this one (NCCL's rank), on the current
// device; `stream` carries every call. The backend keeps both (the caller destroys them after it).
std::unique_ptr<ExpertParallel> make_gpu_ep(GpuBackend backend, const EpConfig& config, ncclComm_t comm,
                                            cudaStream_t stream, const GpuEpOptions& options = {});

// "nvlink" / "nccl" -> backend; throws fanout::Error naming the text otherwise.
GpuBackend gpu_backend_from_name(const std::string& name);
const char* gpu_backend_name(GpuBackend b);

// The backends' constructors (nvlink_ep.cu, nccl_ep.cu); use make_gpu_ep.
std::unique_ptr<ExpertParallel> make_nvlink_ep(const EpConfig& config, ncclComm_t comm, cudaStream_t stream,
                                               const GpuEpOptions& options);
std::unique_ptr<ExpertParallel> make_nccl_ep(const EpConfig& config, ncclComm_t comm, cudaStream_t stream,
                                             const GpuEpOptions& options);

}  // namespace fanout::comm

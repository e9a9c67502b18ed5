#include "fanout/comm/local_gpus.h"

#include <cstdlib>
#include <thread>

#include "fanout/comm/nccl_check.h"
#include "fanout/core/cuda_check.h"
#include "fanout/core/error.h"

namespace fanout::comm {

LocalGpus::LocalGpus(int world) : comms_(world, nullptr), streams_(world, nullptr) {
    FANOUT_CHECK(world >= 1, "LocalGpus: world must be >= 1, got {}", world);
    setenv("NCCL_NVLS_ENABLE", "0", 0);  // never NVLink multicast (the shared machines forbid it)
    ncclUniqueId id;
    FANOUT_NCCL_CHECK(ncclGetUniqueId(&id));
    const auto failures = run([&](int r) {
        FANOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&streams_[r], cudaStreamNonBlocking));
        FANOUT_NCCL_CHECK(ncclCommInitRank(&comms_[r], world, id, r));
        for (int p = 0; p < world; ++p) {
            int can = 0;
            if (p == r || cudaDeviceCanAccessPeer(&can, r, p) != cudaSuccess || !can) continue;
            if (cudaDeviceEnablePeerAccess(p, 0) != cudaSuccess) cudaGetLastError();  // already enabled: fine
        }
    });
    for (const auto& f : failures) FANOUT_CHECK(f.empty(), "LocalGpus setup: {}", f);
}

LocalGpus::~LocalGpus() {
    run([&](int r) {
        if (comms_[r] != nullptr) ncclCommDestroy(comms_[r]);
        if (streams_[r] != nullptr) cudaStreamDestroy(streams_[r]);
    });
}

std::vector<std::string> LocalGpus::run(const std::function<void(int)>& fn) {
    std::vector<std::string> failures(comms_.size());
    barrier_ = std::make_unique<std::barrier<>>(world());
    failed_ = false;
    std::vector<std::thread> threads;
    for (int r = 0; r < world(); ++r)
        threads.emplace_back([&, r] {
            try {
                FANOUT_CUDA_CHECK(cudaSetDevice(r));
                fn(r);
            } catch (const std::exception& e) {
                failures[r] = "rank " + std::to_string(r) + ": " + e.what();
                failed_ = true;
                barrier_->arrive_and_drop();  // the others' sync() must not wait for this rank
            }
        });
    for (auto& t : threads) t.join();
    return failures;
}

void LocalGpus::sync() {
    barrier_->arrive_and_wait();
    FANOUT_CHECK(!failed_, "another rank of this process failed (see its error)");
}

}  // namespace fanout::comm

// PerDevice<T>: a value computed once for each GPU, for what CUDA keeps per device — a kernel's
// dynamic shared-memory limit (cudaFuncSetAttribute applies to the current device only), its
// occupancy, the SM count. A function-local `static` would be computed for whichever device was
// current first and be wrong on the others, as when the ranks of one process drive a GPU each
// (comm/local_gpus.h). Thread-safe; after the first call for a device, a read is one
// std::call_once fast path (no lock), so launches may ask on every call. Include only from
// CUDA-aware sources.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <mutex>
#include <string>

#include "fanout/core/cuda_check.h"

namespace fanout {

template <typename T>
class PerDevice {
  public:
    static constexpr int kMaxDevices = 64;

    // The value for the current device: make() on the first call for it (once, whichever thread
    // gets there first; a make() that throws leaves it to the next call), then the same value.
    template <typename Make>
    T get(Make&& make) {
        int device = 0;
        FANOUT_CUDA_CHECK(cudaGetDevice(&device));
        FANOUT_DEVICE_REQUIRE(device >= 0 && device < kMaxDevices, "PerDevice: device " + std::to_string(device) +
                                                                       " past the " + std::to_string(kMaxDevices) +
                                                                       " it keeps values for");
        const size_t d = static_cast<size_t>(device);
        std::call_once(once_[d], [&] { values_[d] = make(); });
        return values_[d];
    }

  private:
    std::array<std::once_flag, kMaxDevices> once_;
    std::array<T, kMaxDevices> values_{};
};

}  // namespace fanout

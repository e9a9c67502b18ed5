// PerDevice<T>: a value computed once for each GPU, for what CUDA keeps per device — a kernel's
// dynamic shared-memory limit (cudaFuncSetAttribute applies to the current device only), its
// occupancy, the SM count. A function-local `static` would be computed for whichever device was
// current first and be wrong on the others, as when the ranks of one process drive a GPU each
// (comm/local_gpus.h). Thread-safe; include only from CUDA-aware sources.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <mutex>

#include "fanout/core/cuda_check.h"

namespace fanout {

template <typename T>
class PerDevice {
  public:
    // The value for the current device: make() on the first call for it (under the lock, so two
    // threads on one device do not both run it), then the same value.
    template <typename Make>
    T get(Make&& make) {
        int device = 0;
        FANOUT_CUDA_CHECK(cudaGetDevice(&device));
        std::lock_guard lock(mutex_);
        const auto it = values_.find(device);
        if (it != values_.end()) return it->second;
        const T value = make();
        values_.emplace(device, value);
        return value;
    }

  private:
    std::mutex mutex_;
    std::map<int, T> values_;
};

}  // namespace fanout
